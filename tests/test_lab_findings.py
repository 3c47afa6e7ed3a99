"""The kept set's curves and findings (proto/lab/report/findings.py) recomputed from a real format-2 run:
each figure is the stored paired gain, or the same bootstrap over the same rollout pairs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from proto.lab.analysis.stats import paired_gain
from proto.lab.records import Results, results_of
from proto.lab.report.findings import SEED_GAIN, curve_tables, curves, findings, gain, short

FORMAT2 = Path(__file__).resolve().parent / "lab_format2" / "quick" / "results.json"


def _kept(**names: dict[str, Any]) -> dict[str, Results]:
    return {name: results_of(copy.deepcopy(results)) for name, results in names.items()}


def _run() -> dict[str, Any]:
    results: dict[str, Any] = json.loads(FORMAT2.read_text(encoding="utf-8"))
    results["design"]["quick"] = False  # as a default cell: the findings leave --quick runs out
    return results


def test_a_curve_point_shows_the_stored_paired_gains() -> None:
    runs = _kept(speed=_run())
    (curve,) = curves(runs)
    (point,) = curve.points
    assert point.run == "speed" and point.label == "4000tps"
    stored = point.cell["longlived"].gains["http"]["e2e"]  # type: ignore[index]
    assert gain(point.cell, "longlived", "http", "e2e") == stored
    table = "\n".join(curve_tables(curve))
    assert short(stored) in table and short(point.cell["ws"].gains["http-cached"]["ttft"]) in table  # type: ignore[index]


def test_a_gain_against_a_non_baseline_is_the_same_bootstrap_over_the_same_pairs() -> None:
    cell = next(iter(curves(_kept(speed=_run()))[0].points)).cell
    ws = {(r.index, r.session): r for r in cell["ws"].rollout_records}  # type: ignore[union-attr]
    pairs = [
        (float(r.e2e_s or 0), float(ws[(r.index, r.session)].e2e_s or 0))
        for r in cell["longlived"].rollout_records  # type: ignore[union-attr]
    ]
    expected = paired_gain([a for a, _ in pairs], [b for _, b in pairs], baseline="ws", metric="e2e")
    got = gain(cell, "longlived", "ws", "e2e")
    assert got is not None
    assert (got.gain, got.low, got.high, got.verdict) == (
        expected.gain,
        expected.low,
        expected.high,
        expected.verdict,
    )


def test_the_findings_count_the_seed_gain_and_name_the_best_cell() -> None:
    runs = _kept(speed=_run())
    cell = curves(runs)[0].points[0].cell
    http = {m: cell[m].gains["http"]["e2e"] for m in ("ws", "longlived")}  # type: ignore[index]
    best = min(
        (g.gain or 0.0, m) for m, g in http.items()
    )  # the only cell: its better stateful mode is the best
    text = "\n".join(findings(runs))
    reached = sum((g.gain or 0.0) <= SEED_GAIN for g in http.values())
    assert f"is reached in {reached} of the 2 measured" in text
    assert f"the largest gain is {best[1]}'s {short(http[best[1]])}" in text
    assert "1 measured groups from 1 commit(s) (`5bd8f5f06cbc`)" in text


def test_quick_runs_and_runs_before_format_2_give_no_finding() -> None:
    quick = json.loads(FORMAT2.read_text(encoding="utf-8"))
    old = _run()
    old.pop("format")
    assert findings(_kept(quick=quick)) == []
    assert curves(_kept(speed=old)) == []
