"""The short chaos run (issue 13, item 4): every scenario of ``proto/load/chaos.py`` once, seeded, bounded,
against a real ``responses-lab serve`` on loopback, each checked against the invariants — no leak (tasks,
GPU slots, KV pins), one ledger row per response with the delivered usage, one terminal event per response.
The long run is ``scripts/chaos.py --minutes N``; figures in NOTES.md, "Issue 13".
"""

from __future__ import annotations

import os

import pytest

from proto.load.chaos import Sizes, round_of_chaos, table

pytestmark = pytest.mark.process  # every test starts a server or a process

SEED = int(os.environ.get("CHAOS_SEED", "13"))  # a failure names its seed: rerun with CHAOS_SEED=… to replay it


async def test_a_seeded_round_of_chaos_breaks_no_invariant() -> None:
    outcomes = await round_of_chaos(SEED, Sizes())
    report = table(outcomes)
    assert [o.scenario for o in outcomes] == ["disconnects", "fuzz", "load", "db_lock", "crash"], report
    assert all(o.cases > 0 and o.responses > 0 for o in outcomes), report  # every fault was really injected
    fuzz = next(o for o in outcomes if o.scenario == "fuzz")
    assert len(fuzz.answers) >= 5, fuzz.answers  # answered typed (else a violation), in several ways
    assert not [v for o in outcomes for v in o.violations], report
