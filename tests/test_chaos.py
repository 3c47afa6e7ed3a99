"""The short chaos run: every scenario of ``proto/load/chaos.py`` once, seeded, bounded,
against a real ``responses-lab serve`` on loopback, each checked against the invariants — no leak (tasks,
GPU slots, KV pins), one ledger row per response with the delivered usage, one terminal event per response.
The long run is ``responses-lab chaos --minutes N``.
"""

from __future__ import annotations

import os

import pytest

from proto.cli import main as cli_main
from proto.load.chaos import Outcome, Sizes, round_of_chaos, table, totals

pytestmark = pytest.mark.process  # every test starts a server or a process

# a failure names its seed: rerun with CHAOS_SEED=… to replay it
SEED = int(os.environ.get("CHAOS_SEED", "13"))


# A hang guard, not a pace: the round starts about six server processes (~10 s each on a loaded 2-core
# machine), more than the suite's default 120 s allows.
@pytest.mark.timeout(360)
async def test_a_seeded_round_of_chaos_breaks_no_invariant() -> None:
    outcomes = await round_of_chaos(SEED, Sizes())
    report = table(outcomes)
    assert [o.scenario for o in outcomes] == [
        *("disconnects", "fuzz", "load", "db_lock", "crash"),
        *("blank_keys", "second_server", "read_only", "db_locked"),  # proto/load/chaos_store.py
        *("loop_stall", "slow_heads"),  # proto/load/chaos_stall.py
    ], report
    # every fault was really injected (a read-only file needs a non-root user or chattr +i)
    assert all(o.cases > 0 or "no read-only file here" in str(o.answers) for o in outcomes), report
    # refused starts, 401s, and the bounds' inputs refused or closed before any response: nothing runs
    no_response = ("blank_keys", "read_only", "loop_stall", "slow_heads")
    assert all(o.responses > 0 for o in outcomes if o.scenario not in no_response), report
    fuzz = next(o for o in outcomes if o.scenario == "fuzz")
    assert len(fuzz.answers) >= 5, fuzz.answers  # answered typed (else a violation), in several ways
    assert not [v for o in outcomes for v in o.violations], report


def test_the_long_run_is_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["chaos", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "responses-lab chaos" in text and "--minutes" in text and "--short" in text


def test_the_long_run_totals_every_round_by_scenario() -> None:
    outcomes = [Outcome("fuzz", seed, 60, 7, 0, 1.0, ["bad"] if seed == 2 else [], {}) for seed in (1, 2)]
    assert totals(outcomes).splitlines()[-1] == "| fuzz | 2 | 120 | 14 | 1 |"
