"""The fast model's validation (proto/lab/analysis/validate.py; docs/lab.md, "The validation sample"): gain
errors and sign agreement from known inputs, the calibration never measuring a validated cell, and every
predicted figure labelled. Pure: no server, no run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_lab_records import made_up_run

from proto.lab.analysis.predict import LONG_OUTPUTS, OUTPUTS, calibration_replay
from proto.lab.analysis.stats import Gain
from proto.lab.analysis.validate import (
    PREDICTED,
    SAMPLE,
    SAMPLE_MODES,
    InSample,
    check_cells,
    check_out_of_sample,
    gain_check,
    markdown,
    stratum_argv,
    summarize,
    validate,
)
from proto.lab.records import RunRecord, Usage, results_of, run_of
from proto.lab.workload.traces import load_replay, replay_names


def test_a_gain_inside_its_interval_of_the_same_sign() -> None:
    g = gain_check("ws", "http", "e2e", Gain("http", "e2e", 10, -0.10, -0.15, -0.05, "faster"), -0.12)
    assert g.error_pp == pytest.approx(-2.0)
    assert g.error_rel == pytest.approx(-0.2)
    assert g.same_sign is True and g.inside is True and g.disagrees is False


def test_a_prediction_on_the_other_side_of_a_decided_gain_disagrees() -> None:
    g = gain_check("ws", "http", "ttft", Gain("http", "ttft", 10, -0.10, -0.15, -0.05, "faster"), 0.02)
    assert g.error_pp == pytest.approx(12.0)
    assert g.error_rel == pytest.approx(1.2)
    assert g.same_sign is False and g.inside is False and g.disagrees is True


def test_an_undecided_gain_is_no_sign_disagreement() -> None:
    """The measured interval holds 0: a prediction of the other point sign is a mismatch, not a
    disagreement; outside the interval it is still outside."""
    measured = Gain("http", "e2e", 10, -0.01, -0.03, 0.01, "no difference")
    g = gain_check("ws", "http", "e2e", measured, 0.02)
    assert g.same_sign is False and g.disagrees is False and g.inside is False
    assert gain_check("ws", "http", "e2e", measured, 0.005).inside is True


def test_without_an_interval_the_signs_are_still_compared() -> None:
    g = gain_check("ws", "http", "e2e", 0.05, -0.05)
    assert g.same_sign is False and g.inside is None and g.disagrees is False
    assert g.error_pp == pytest.approx(-10.0)
    assert gain_check("ws", "http", "e2e", None, -0.05).error_pp is None


def _cell(mode: str, e2e: float, pe2e: float, ttft: float, pttft: float, **gains: Any) -> dict[str, Any]:
    return {
        "profile": "local",
        "workload": "coding-agent",
        "model": "mock-4000tps",
        "mode": mode,
        "e2e_s_p50": e2e,
        "predicted_e2e_s_p50": pe2e,
        "ttft_ms_p50": ttft,
        "predicted_ttft_ms_p50": pttft,
        "usage": {"output_tokens": 600},
        "turns": 3,
        "gains": gains,
    }


def _interval(gain: float, low: float, high: float) -> dict[str, Any]:
    return {"gain": gain, "low": low, "high": high, "verdict": "faster" if high < 0 else "slower"}


def _records(runs: list[dict[str, Any]]) -> list[RunRecord]:
    """``runs`` (results.json's entries cut to what validation reads) as records."""
    return [
        made_up_run(
            r["profile"], r["workload"], r["model"], r["mode"],
            **{k: r[k] for k in ("e2e_s_p50", "predicted_e2e_s_p50", "ttft_ms_p50", "predicted_ttft_ms_p50")},
            usage=Usage(0, 0, r["usage"]["output_tokens"]),
            turns=r["turns"],
            gains={
                base: {m: Gain(base, m, 10, **g) for m, g in by.items()} for base, by in r["gains"].items()
            },
        )
        for r in runs
    ]  # fmt: skip


_ENTRIES = [
    _cell("http", 10.0, 10.0, 100.0, 100.0),
    _cell(
        "http-cached",
        9.0,
        9.5,  # predicted gain vs http: -5 %
        80.0,
        90.0,  # -10 %
        http={"e2e": _interval(-0.10, -0.12, -0.08), "ttft": _interval(-0.20, -0.25, -0.15)},
    ),
    _cell(
        "ws",
        8.0,
        10.5,  # predicted: +5 % vs http, +10.5 % vs http-cached
        50.0,
        50.0,  # -50 % vs http, -44.4 % vs http-cached
        http={"e2e": _interval(-0.20, -0.25, -0.15), "ttft": _interval(-0.50, -0.55, -0.45)},
        **{"http-cached": {"e2e": _interval(-0.11, -0.15, -0.07), "ttft": _interval(-0.375, -0.4, -0.35)}},
    ),
]
# the entries as results.json holds them (every field a record has)
RUNS: list[dict[str, Any]] = [msgspec.to_builtins(r) for r in _records(_ENTRIES)]


def test_cells_and_summary_from_known_inputs() -> None:
    checks = check_cells("r", [run_of(r) for r in RUNS])
    assert [c.mode for c in checks] == ["http", "http-cached", "ws"]
    # http against http-cached (no interval in these inputs: its p50s' ratio), never against itself
    assert [(g.baseline, g.metric, g.low) for g in checks[0].gains] == [
        ("http-cached", "e2e", None),
        ("http-cached", "ttft", None),
    ]
    assert [g.error_pp for g in checks[0].gains] == pytest.approx(
        [(10 / 9.5 - 10 / 9) * 100, (100 / 90 - 100 / 80) * 100]
    )
    cached, ws = checks[1], checks[2]
    assert [(g.baseline, g.metric) for g in ws.gains] == [
        ("http", "e2e"),
        ("http", "ttft"),
        ("http-cached", "e2e"),
        ("http-cached", "ttft"),
    ]
    assert cached.e2e_error == pytest.approx(9.5 / 9.0 - 1)
    assert cached.ttft_error == pytest.approx(90 / 80 - 1)
    assert cached.output_tokens_per_round == pytest.approx(200.0)
    # the predicted gain is the grid's own figure: predicted p50 ÷ the baseline's predicted p50 − 1
    assert [g.predicted for g in ws.gains] == pytest.approx([0.05, -0.5, 10.5 / 9.5 - 1, 50 / 90 - 1])
    assert [g.error_pp for g in cached.gains] == pytest.approx([5.0, 10.0])
    assert [g.error_pp for g in ws.gains] == pytest.approx(
        [25.0, 0.0, (10.5 / 9.5 - 1 + 0.11) * 100, (50 / 90 - 1 + 0.375) * 100]
    )
    s = summarize(checks, (4, 2048))
    assert s.cells == 3 and s.gains == 8
    e2e = sorted([5.0, 25.0, (10.5 / 9.5 - 1 + 0.11) * 100, abs(10 / 9.5 - 10 / 9) * 100])
    assert s.max_error_pp["e2e"] == pytest.approx(25.0)
    assert s.median_error_pp["e2e"] == pytest.approx((e2e[1] + e2e[2]) / 2)
    assert s.max_error_pp["ttft"] == pytest.approx((100 / 80 - 100 / 90) * 100)
    # ws's E2E is measured faster than both baselines (intervals below 0) and predicted slower
    assert s.sign_disagreements == 2 and s.sign_mismatches == 2
    assert s.inside == 1 and s.with_interval == 6  # only ws's TTFT vs http (-50 % in [-55, -45])
    assert s.max_cell_error["e2e"] == pytest.approx(10.5 / 8 - 1)
    assert s.max_output_tokens_per_round == pytest.approx(200.0)


def test_a_run_without_paired_gains_is_read_from_its_p50s() -> None:
    runs = [{**r, "gains": {}} for r in RUNS]
    ws = check_cells("r", [run_of(r) for r in runs])[2]
    assert ws.gains[0].measured == pytest.approx(-0.2) and ws.gains[0].low is None
    assert ws.gains[0].inside is None


# ---- out of sample -----------------------------------------------------------------------------


def test_the_calibration_workload_is_none_of_the_cells() -> None:
    """The calibration replays its own seeded sessions: no shipped workload's sessions, and not its name."""
    cal = calibration_replay(240, 128_000)
    assert cal.name == "calibration" and "calibration" not in replay_names()
    mine = {s.rounds for s in cal.sessions}
    for name in replay_names():
        assert not mine & {s.rounds for s in load_replay(name).sessions}, name


def test_a_calibration_that_measured_a_validated_cell_is_refused() -> None:
    cal = {"workload": "calibration", "fits": {"http": {}}}
    run = {"runs": [{**RUNS[0], "workload": "calibration"}], "calibration": None}
    with pytest.raises(InSample, match="calibration's own workload"):
        check_out_of_sample(cal, [("r", run)])
    # the run's own calibration is in the same run: refused unless it is said (--own)
    own = {"runs": RUNS, "calibration": cal}
    with pytest.raises(InSample, match="the run's own"):
        check_out_of_sample(cal, [("r", own)])
    check_out_of_sample(cal, [("r", own)], own=True)
    check_out_of_sample(cal, [("r", {"runs": RUNS, "calibration": {"fits": {"ws": {}}}})])
    with pytest.raises(InSample, match="--own"):
        validate([("r", own)], None, "x")


def test_the_sample_covers_every_stratum_with_both_baselines() -> None:
    assert {"http", "http-cached"} <= set(SAMPLE_MODES)
    assert {s.profile for s in SAMPLE} == {"local", "production-like"}
    assert len({s.model for s in SAMPLE}) >= 4 and len({s.workload for s in SAMPLE}) >= 4
    assert len({s.name for s in SAMPLE}) == len(SAMPLE)
    argv = stratum_argv(SAMPLE[0], Path("OUT"))
    assert "--no-predict" in argv and argv[argv.index("--sessions") + 1] == "4"  # the grid's sessions


def test_the_calibration_spans_the_outputs_the_workloads_use() -> None:
    outs = [r.output_tokens for s in calibration_replay(240, 128_000).sessions for r in s.rounds]
    assert min(outs) >= OUTPUTS[0] and max(outs) <= LONG_OUTPUTS[1]
    assert sum(o >= LONG_OUTPUTS[0] for o in outs) >= 8  # the long rounds: a tenth of a mode's 240


# ---- labels ------------------------------------------------------------------------------------


def test_every_predicted_figure_is_labelled() -> None:
    """In the validation table each predicted value sits in a column named predicted and carries the word;
    the summary names its predicted figures too."""
    v = validate([("r", {"runs": RUNS})], None, "x", own=True)
    lines = markdown(v)
    tables = [i for i, line in enumerate(lines) if line.startswith("| run |")]
    assert len(tables) == 2
    labelled = 0
    for start in tables:
        head = lines[start].split("|")
        end = lines.index("", start)
        rows = [line.split("|") for line in lines[start + 2 : end]]
        assert rows
        for i, name in enumerate(head):
            if PREDICTED in name and "inside" not in name:
                for row in rows:
                    assert row[i].strip() == "–" or row[i].strip().endswith(f"({PREDICTED})"), row[i]
                    labelled += row[i].strip() != "–"
    assert labelled == 3 * 2 + 8
    summary = next(line for line in lines if line.startswith("**Summary**"))
    assert f"|{PREDICTED} − measured| gain" in summary


def test_the_printed_table_and_the_documents_label_predictions() -> None:
    import msgspec
    from rich.console import Console
    from test_lab_records import made_up_run

    from proto.lab.report.tables import print_table
    from proto.lab.report.writeup import predicted_section

    head = predicted_section({})[0][0]
    assert head.count("predicted") == 2 and "fast model's" not in head
    console = Console(record=True, width=80)
    results = {
        "runs": [
            {
                **msgspec.to_builtins(made_up_run(r["profile"], r["workload"], r["model"], r["mode"])),
                **{k: v for k, v in r.items() if k not in ("usage", "gains")},  # the table reads neither
                "server_cpu_ms_per_turn": 1.0,
                "client_bytes_sent_per_turn": 1024,
                "turn_overhead_ms_p50": 1.0,
                "prediction_error": 0.0,
            }
            for r in RUNS
        ],
        "floor": {"ws_ping_rtt_ms_p50": None},
    }
    print_table(results, console)
    text = console.export_text()
    assert "predicted" in text.splitlines()[2] and "pred s" not in text


def test_the_command_refuses_a_runs_own_calibration_and_writes_the_table(tmp_path: Path) -> None:
    from proto.lab.analysis.validate import main

    cal = {"workload": "calibration", "fits": {"http": {}}}
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"runs": RUNS, "calibration": cal}), encoding="utf-8")
    (tmp_path / "cal.json").write_text(json.dumps({"calibration": cal}), encoding="utf-8")
    assert main([str(run), "--calibration", str(tmp_path / "cal.json")]) == 2
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2  # no calibration, no --own
    assert main([str(run), "--own", "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "validation.json").read_text(encoding="utf-8"))
    assert written["summary"]["sign_disagreements"] == 2 and written["calibration_from"] == "each run's own"
    assert "(predicted)" in (tmp_path / "out" / "validation.md").read_text(encoding="utf-8")


def test_a_kept_sample_is_in_the_findings_and_the_document(tmp_path: Path) -> None:
    """``bench report --lab`` reads DIR/validate-sample/validation.json (``bench validate --run``'s) into
    the findings and its own section, every predicted figure there labelled."""
    from proto.lab.analysis.validate import write
    from proto.lab.report.writeup import findings, lab

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps({"runs": [], "format": 2}), encoding="utf-8")
    write(validate([("r", {"runs": RUNS})], None, "x", own=True), tmp_path / "validate-sample")
    line = findings({"r": results_of({"runs": []})}, tmp_path)[-1]
    assert line.startswith(
        "- *The validation sample, measured vs predicted* (`validate-sample`, 3 mode cells"
    )
    assert "up to 25.0 / " in line and "**2** sign disagreements" in line and "in 1 of 6" in line
    text = lab(tmp_path)
    section = text.split("## The validation sample (`bench validate --run`)", 1)[1]
    assert (
        "| r | local · coding-agent · mock-4000tps | ws | http | e2e | -20.0 % [-25.0, -15.0] "
        "| +5.0 % (predicted)" in section
    )
