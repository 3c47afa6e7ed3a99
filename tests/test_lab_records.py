"""The lab's typed records (proto/lab/records.py) against the files they describe: every kept results.json's
``runs[]`` entry, of format 1 and 2, reads into a :class:`RunRecord` and writes back to the same JSON, key
for key and value for value; an entry that is not one is refused with the field that is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from proto.lab.analysis.stats import Gain
from proto.lab.records import Results, RunRecord, Usage, results_of, run_of
from proto.lab.report.agent_findings import is_codex
from proto.lab.report.results import dumps, load_results

ROOT = Path(__file__).resolve().parent.parent
FORMAT_2 = ROOT / "tests" / "lab_format2" / "quick" / "results.json"
# the first five runs[] entries of a `bench --quick` run kept before format 2 (no paired gains)
FORMAT_1 = ROOT / "tests" / "lab_format1" / "quick" / "results.json"
# bench's results.json files (the real agent's, format codex-client/1, is read by agent_findings.py)
KEPT = sorted(
    [
        *(p for p in (ROOT / "docs" / "results").glob("*/results.json") if not is_codex(p)),
        FORMAT_2,
        FORMAT_1,
    ]
)


def made_up_run(profile: str, workload: str, model: str, mode: str, **fields: Any) -> RunRecord:
    """A ``runs[]`` entry of the cell (``profile``, ``workload``, ``model``, ``mode``) with nothing measured
    but ``fields`` (made-up figures for tests of what reads records)."""
    empty: dict[str, Any] = {
        **dict.fromkeys(("e2e_s_p50", "ttft_ms_p50", "tpot_ms_p50", "itl_ms_p99", "turn_overhead_ms_p50")),
        **dict.fromkeys(("server_cpu_ms_per_turn", "ttft_ms_p90", "turn_overhead_ms_mean")),
        "turn_overhead_ms_p90": None,
        **dict.fromkeys(("client_bytes_sent_per_turn", "prefill_ms_per_turn", "decode_ms_per_turn"), 0.0),
        **dict.fromkeys(("tool_wait_s_per_rollout", "wall_s"), 0.0),
    }
    base: dict[str, Any] = {
        "sessions": 1,
        "turn_overhead_ms_by_turn": [],
        "usage": Usage(0, 0, 0),
        "phases_ms": {},
        "rollouts": 0,
        "turns": 0,
        "statuses": [],
        "e2e_s": [],
        "ttft_ms_all": [],
        "usage_by_round": {},
        "round_kinds": {},
        "store_vs_cached": {},
    }
    return RunRecord(
        mode=mode, workload=workload, model=model, profile=profile, **{**base, **empty, **fields}
    )


def _runs(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text(encoding="utf-8"))["runs"])


@pytest.mark.parametrize("path", [p for p in KEPT if _runs(p)], ids=lambda p: p.parent.name)
def test_every_kept_run_reads_and_writes_back_the_same(path: Path) -> None:
    for entry in _runs(path):
        run = run_of(entry)
        assert dumps(msgspec.to_builtins(run)) == dumps(entry)


def test_the_format_2_fixture_reads_into_typed_gains_and_format_1_has_none() -> None:
    two = [run_of(e) for e in _runs(FORMAT_2)]
    assert all(isinstance(g, Gain) for r in two for by in r.gains.values() for g in by.values())  # type: ignore[union-attr]
    one = [run_of(e) for e in _runs(FORMAT_1)]
    assert one and all(r.gains is msgspec.UNSET and r.rollout_records is msgspec.UNSET for r in one)
    assert all(isinstance(r, RunRecord) and r.predicted_e2e_s_p50 is not msgspec.UNSET for r in one)


def test_an_entry_that_is_not_a_run_is_refused_with_its_field() -> None:
    entry = _runs(FORMAT_2)[0]
    with pytest.raises(msgspec.ValidationError, match=r"`cached_tokens` - at `\$\.usage`"):
        run_of(dict(entry, usage={"input_tokens": 1, "output_tokens": 2}))
    with pytest.raises(msgspec.ValidationError, match="sessions"):
        run_of(dict(entry, sessions="two"))


@pytest.mark.parametrize("path", KEPT, ids=lambda p: p.parent.name)
def test_every_kept_results_json_reads_into_results_and_writes_back_the_same(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    results = load_results(path)
    assert isinstance(results, Results) and all(isinstance(r, RunRecord) for r in results.runs)
    again = dumps(msgspec.to_builtins(results))
    if path == FORMAT_1:  # a fixture cut down by hand, its keys in another order than the writers'
        assert json.loads(again) == json.loads(text)
    else:
        assert again == dumps(json.loads(text))


def test_a_results_json_that_is_not_one_is_refused_with_its_field() -> None:
    data = json.loads(FORMAT_2.read_text(encoding="utf-8"))
    with pytest.raises(msgspec.ValidationError, match=r"`done` - at `\$\.cells`"):
        results_of(dict(data, cells={"of": 5, "missing": []}))
    with pytest.raises(msgspec.ValidationError, match=r"`runs`"):
        results_of({k: v for k, v in data.items() if k != "runs"})
