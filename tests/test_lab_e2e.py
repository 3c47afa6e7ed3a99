"""A small end-to-end run of ``responses-lab bench``: a real server process, all five modes, every output,
the fast model's calibration (few rounds) with each run's prediction, the sweep, trace.json.

A tiny workload (a 300-token first message, three tool turns, one with parallel calls) on mock-4000tps
keeps the run to seconds. The assertions are about shape and consistency, never about speed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from proto.cli import main as cli_main
from proto.core.response import MODES
from proto.lab.analysis.repredict import repredict
from proto.lab.bench import main as bench_main

# every test starts a server or a process; the module's bench run (its first test's setup) is a whole lab run
# with its calibration: a hang guard above the default 120 s
pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

TINY = {
    "format": 1,
    "name": "tiny",
    "first_user_text": "Rename a helper and run the tests.",
    "first_user_tokens": 300,
    "turns": [
        {
            "calls": [{"name": "grep", "arguments": {"pattern": "helper"}}],
            "output_tokens": 12,
            "tool_output_tokens": 80,
            "client_tool_time_s": 0.01,
        },
        {
            "calls": [
                {"name": "read_file", "arguments": {"path": "a.py"}},
                {"name": "read_file", "arguments": {"path": "b.py"}},
            ],
            "output_tokens": 20,
            "tool_output_tokens": 120,
            "client_tool_time_s": 0.02,
        },
        {
            "calls": [{"name": "run_tests", "arguments": {}}],
            "output_tokens": 8,
            "tool_output_tokens": 40,
            "client_tool_time_s": 0.01,
        },
        {"say": "Renamed; tests pass.", "output_tokens": 15},
    ],
}

SPEC_FIELDS = {
    "mode": str,
    "workload": str,
    "model": str,
    "sessions": int,
    "e2e_s_p50": float,
    "ttft_ms_p50": float,
    "tpot_ms_p50": float,
    "itl_ms_p99": float,
    "turn_overhead_ms_p50": float,
    "turn_overhead_ms_by_turn": list,
    "server_cpu_ms_per_turn": float,
    "client_bytes_sent_per_turn": float,
    "usage": dict,
    "phases_ms": dict,
}


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench")
    workload = root / "tiny.json"
    workload.write_text(json.dumps(TINY), encoding="utf-8")
    out = root / "out"
    code = bench_main(
        [
            "--modes",
            ",".join(MODES),
            "--workload",
            str(workload),
            "--model",
            "mock-4000tps",
            "--profile",
            "local",
            "--sessions",
            "2",
            "--rollouts",
            "1",
            "--warmup",
            "1",
            "--pings",
            "20",
            "--out",
            str(out),
            "--model-override",
            "mock-4000tps:prefill-overhead=20,prefill-time-per-token=0",
            "--predict-rounds",
            "30",
            "--no-jitter",  # the prefill checks below are exact (the jitter's own test: test_lab_stats.py)
        ]
    )
    assert code == 0
    return out


def test_results_json_has_the_spec_schema_for_every_mode(bench_out: Path) -> None:
    results = json.loads((bench_out / "results.json").read_text())
    assert (
        isinstance(results["floor"]["ws_ping_rtt_ms_p50"], float)
        and results["floor"]["ws_ping_rtt_ms_p50"] > 0
    )
    runs = {run["mode"]: run for run in results["runs"]}
    assert set(runs) == set(MODES)
    for mode, run in runs.items():
        for name, kind in SPEC_FIELDS.items():
            assert isinstance(run[name], kind), (mode, name, run[name])
        assert run["workload"] == "tiny" and run["model"] == "mock-4000tps" and run["sessions"] == 2
        assert run["statuses"] == ["completed"]
        assert len(run["turn_overhead_ms_by_turn"]) == 4  # one per sampling segment
        assert run["turns"] == 8  # 2 sessions x 1 rollout x 4 turns
        assert set(run["usage"]) == {"input_tokens", "cached_tokens", "output_tokens"}
        # The OS counts CPU in 10 ms ticks and a tiny cell may use less than one: each reading is a
        # number, and the four cells together did cost the server CPU.
        assert run["server_cpu_ms_per_turn"] >= 0 and run["client_bytes_sent_per_turn"] > 0
        assert "render_tokenize" in run["phases_ms"]
    assert sum(run["server_cpu_ms_per_turn"] for run in runs.values()) > 0


def test_every_transport_replays_the_same_rollout(bench_out: Path) -> None:
    runs = json.loads((bench_out / "results.json").read_text())["runs"]
    # The same model output in every mode; input tokens too (HTTP re-sends, the others append: same ids).
    assert len({run["usage"]["output_tokens"] for run in runs}) == 1
    assert len({run["usage"]["input_tokens"] for run in runs}) == 1
    by_mode = {run["mode"]: run for run in runs}
    # Full history re-sends everything (http-cached too): the most bytes per turn. (Each rollout's tool
    # outputs
    # are its own text, of the same token counts: their byte sizes differ a little between the two.)
    full = min(by_mode[m]["client_bytes_sent_per_turn"] for m in ("http", "http-cached"))
    assert full > max(by_mode[m]["client_bytes_sent_per_turn"] for m in ("http-prev", "ws", "longlived"))


def test_csv_and_plots_are_written(bench_out: Path) -> None:
    with (bench_out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {row["mode"] for row in rows} == set(MODES)
    assert all(float(row["e2e_s_p50"]) > 0 for row in rows)
    for name in (
        "e2e_by_mode.png",
        "overhead_by_turn.png",
        "phases_by_mode.png",
        "ttft_cdf.png",
        "gain_vs_speed.png",
        "gain_vs_turns.png",
        "gain_vs_hops.png",
        "timeline.png",
    ):
        assert (bench_out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_model_overrides_reach_the_servers_the_lab_starts(bench_out: Path) -> None:
    results = json.loads((bench_out / "results.json").read_text(encoding="utf-8"))
    assert results["config"]["model_overrides"] == [
        "mock-4000tps:prefill-overhead=20,prefill-time-per-token=0"
    ]
    for run in results["runs"]:
        # A 20 ms dispatch and a chunk that costs no step time: not the default 1 ms + 39 us per token. The
        # chunk goes into the first step after the dispatch, which, when the other session decodes beside
        # it, is a 1 ms decode step it may wait up to 1 ms for (docs/mock-gpu.md, "Timing model"); the
        # report is a difference of two absolute clock readings (float rounding below 1 ns).
        assert 20.0 - 1e-6 <= run["prefill_ms_per_turn"] < 22.0, run["mode"]


def test_every_run_reports_its_prediction_and_the_sweep_its_curves(bench_out: Path) -> None:
    results = json.loads((bench_out / "results.json").read_text(encoding="utf-8"))
    for run in results["runs"]:
        assert run["predicted_e2e_s_p50"] > 0 and run["predicted_ttft_ms_p50"] > 0
        assert run["prediction_error"] == pytest.approx(run["predicted_e2e_s_p50"] / run["e2e_s_p50"] - 1)
        # The modelled GPU time is the engine's own: the prediction carries the same prefill per turn, but for
        # where the turn's chunk falls among the other session's steps (up to a 1 ms wait for the boundary
        # and a 1 ms decode step it rides in: docs/mock-gpu.md, "Timing model"), which depends on how the
        # two sessions interleave, measured or predicted.
        parts = run["predicted_parts_s"]
        assert parts["prefill"] * 1e3 / 4 == pytest.approx(run["prefill_ms_per_turn"], abs=2.0)
    calibration = results["calibration"]
    assert set(calibration["fits"]) == set(MODES) and calibration["overhead_vs_http"]["http"] == 1.0
    sweep = results["sweep"]
    fields = {
        "mode",
        "model",
        "decode_tps",
        "prefill_us_per_token",
        "turns",
        "profile",
        "predicted_e2e_s",
        "predicted_e2e_vs_http",
    }
    assert sweep and all(fields <= set(row) for row in sweep)
    speeds = sorted({row["decode_tps"] for row in sweep if row["curve"] == "speed"})
    assert speeds[0] == 65 and speeds[-1] == 4000
    # Each speed has its class's prefill: GPU-served below 500 tokens/s, wafer-scale from there.
    prefill = {row["decode_tps"]: row["prefill_us_per_token"] for row in sweep if row["curve"] == "speed"}
    assert prefill[65] == pytest.approx(8.5) and prefill[1000] == pytest.approx(39.0)
    assert sorted({row["turns"] for row in sweep if row["curve"] == "turns"}) == [
        8,
        12,
        16,
        20,
        25,
        30,
        35,
        40,
    ]
    for row in sweep:
        assert (row["mode"] == "http") == (row["predicted_e2e_vs_http"] == 0.0)


def test_repredict_composes_a_kept_run_again_from_its_own_calibration_alone(bench_out: Path) -> None:
    """``bench repredict`` rebuilds the fast model from results.json (fits, config) and, with the code
    that wrote the file, gets every prediction the run itself reported."""
    results = json.loads((bench_out / "results.json").read_text(encoding="utf-8"))
    kept = [x for run in results["runs"] for x in (run["predicted_e2e_s_p50"], run["predicted_ttft_ms_p50"])]
    rows = repredict(results)
    assert len(rows) == len(MODES)
    assert [
        x for run in results["runs"] for x in (run["predicted_e2e_s_p50"], run["predicted_ttft_ms_p50"])
    ] == pytest.approx(kept, rel=1e-9)
    assert all(before == pytest.approx(after, rel=1e-9) for _, before, after in rows)


def test_bench_repredict_check_prints_every_cell_and_writes_nothing(
    bench_out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bench_out / "results.json"
    kept = path.read_bytes()
    assert cli_main(["bench", "repredict", str(path), "--check"]) == 0
    assert path.read_bytes() == kept
    out = capsys.readouterr().out
    assert f"{path}: {len(MODES)} cells" in out
    assert all(f" {mode} " in out for mode in MODES)


# What a generated document must not say: how the product was built, rather than what it is.
HISTORY_WORDS = ("issue", "pass ", "session of", "notes.md", "scripts/")


def test_bench_report_renders_a_run_as_markdown(bench_out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "report", str(bench_out / "results.json"), "--title", "Tiny"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("### Tiny\n") and "Generated by `responses-lab bench report`" in text
    assert "#### local · tiny · mock-4000tps" in text
    assert all(f"| {mode} |" in text for mode in MODES)
    assert not [word for word in HISTORY_WORDS if word in text.lower()]


def test_bench_report_lab_writes_the_document_from_kept_runs(bench_out: Path, tmp_path: Path) -> None:
    kept = tmp_path / "results" / "quick"
    kept.mkdir(parents=True)
    (kept / "results.json").write_bytes((bench_out / "results.json").read_bytes())
    out = tmp_path / "lab-results.md"
    assert cli_main(["bench", "report", "--lab", str(tmp_path / "results"), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Lab results (generated)")
    assert "## Predicted vs measured, every real-clock cell" in text
    assert "## Run `quick`: paired gains" in text
    assert not [word for word in HISTORY_WORDS if word in text.lower()]


def test_bench_report_lab_refuses_a_directory_without_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no kept run"):
        cli_main(["bench", "report", "--lab", str(tmp_path), "--out", str(tmp_path / "x.md")])


def test_trace_json_has_a_track_per_rollout_with_client_server_and_gpu_spans(bench_out: Path) -> None:
    trace = json.loads((bench_out / "trace.json").read_text(encoding="utf-8"))
    events = trace["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(processes) == len(MODES)
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} == {"client", "server", "gpu"}
    assert {"tools", "prefill", "decode", "render_tokenize"} <= {e["name"] for e in spans}
    assert all(e["dur"] >= 0 for e in spans)
    # Per track, the GPU's decode of a round starts at the round's first token, inside the round's span.
    for e in spans:
        if e["name"] == "decode":
            rounds = [
                r
                for r in spans
                if r["pid"] == e["pid"] and r["tid"] == e["tid"] and r["name"].startswith("round")
            ]
            assert any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in rounds)
