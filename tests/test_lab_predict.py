"""The fast model on numbers computed by hand (``proto/lab/analysis/predict.py``), the calibrated models, the
scenarios."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

from proto.lab.analysis.metrics import SEND, Mark, Trace
from proto.lab.analysis.predict import (
    KINDS,
    Calibration,
    Fit,
    Hops,
    Sample,
    calibration_replay,
    chains,
    fit,
    predict_cell,
    samples_of,
)
from proto.lab.bench import add_arguments, config_from_args
from proto.lab.workload.plan import build_plan
from proto.lab.workload.traces import Replay, Round, Session, load_replay
from sampler.models import MODELS
from sampler.policy import PlannedCall

TOOL = (PlannedCall("tool", "{}"),)


def flat(c_ms: float, o_ms: float, busy_ms: float = 0.0, safety: float = 1.0, resolve: float = 1.0) -> Fit:
    return Fit([c_ms, 0, 0, 0, 0], [o_ms, 0, 0, 0, 0], [busy_ms, 0, 0, 0, 0], safety, resolve, 10)


def calibration(**fits: Fit) -> Calibration:
    return Calibration({mode: dict.fromkeys(KINDS, f) for mode, f in fits.items()}, [], 0.0, 0)


def session(rounds: int = 3, wait_s: float = 0.5) -> Session:
    steps = [Round(20, TOOL, wait_s, result_tokens=(300,)) for _ in range(rounds - 1)]
    return Session("s", 0.0, (*steps, Round(30, (), 0.0, text="done")), first_tokens=1000)


def test_a_fit_recovers_the_linear_overhead_and_drops_a_stall() -> None:
    rng = random.Random(1)
    samples = []
    for i in range(80):
        h, a, o = rng.randrange(1000, 90_000), rng.randrange(50, 8000), rng.randrange(4, 64)
        c = 1.5 + 0.0004 * h + 0.0002 * a + 0.01 * o + (500.0 if i == 7 else 0.0)  # one 500 ms stall
        samples.append(Sample("http", "outputs", h, a, i % 5, o, c, c / 2, c / 3, 1, 1))
    f = fit(samples)
    assert f.dropped == 1
    assert f.c == pytest.approx([1.5, 0.0004, 0.0002, 0.0, 0.01], abs=1e-6)
    assert f.at(f.c, 10_000, 1000, 0, 10) == pytest.approx(1.5 + 4 + 0.2 + 0.1)


def test_one_session_is_the_sum_of_its_parts() -> None:
    spec = MODELS["mock-1000tps"]  # 1 ms + 39 us per uncached token, 1 ms per token
    replay = Replay("r", "", (session(),), trace=False)
    cal = calibration(http=flat(10.0, 4.0))
    p = predict_cell(cal, "http", replay, spec, Hops(20.0, 2.0), tool_time_scale=1.0)
    plan = build_plan(replay.sessions[0], spec.name, "000000000000")
    # Every round pays c (10 ms), both hops (22 ms), its prefill and its decode; between rounds, the tools.
    cached = [0, *[(s.prompt_tokens - s.appended_tokens) // 16 * 16 for s in plan.sends[1:]]]
    prefill = sum(
        spec.prefill_overhead_ms + (s.prompt_tokens - c) * spec.prefill_time_per_token_ms
        for s, c in zip(plan.sends, cached, strict=True)
    )
    decode = sum((s.output_tokens - 1) * spec.inter_token_latency_ms for s in plan.sends)
    want = 3 * (10.0 + 22.0) / 1e3 + prefill / 1e3 + decode / 1e3 + 2 * 0.5
    # the KV cache's block rounding: within a block's prefill
    assert p.e2e_s == pytest.approx([want], abs=2e-3)
    assert p.parts_s["tools"] == pytest.approx(1.0) and p.parts_s["hops"] == pytest.approx(0.066)
    # TTFT: o + hops + prefill (no queue), per round.
    assert p.ttft_ms[0] == pytest.approx(
        4.0 + 22.0 + spec.prefill_overhead_ms + plan.sends[0].prompt_tokens * spec.prefill_time_per_token_ms,
        abs=0.01,
    )


def test_beside_the_prefill_the_classifier_costs_only_what_outlasts_it() -> None:
    spec = MODELS["mock-1000tps"]
    replay = Replay("r", "", (session(),), trace=False)
    cal = calibration(http=flat(10.0, 4.0))
    plan = build_plan(replay.sessions[0], spec.name, "000000000000")
    prefill = spec.prefill_overhead_ms + plan.sends[0].prompt_tokens * spec.prefill_time_per_token_ms
    for safety in (prefill / 2, prefill * 3):  # shorter than the first prefill, then longer
        serial = predict_cell(cal, "http", replay, spec, Hops(safety, 2.0), tool_time_scale=1.0)
        beside = predict_cell(cal, "http", replay, spec, Hops(safety, 2.0, beside=True), tool_time_scale=1.0)
        assert serial.ttft_ms[0] == pytest.approx(4.0 + 2.0 + safety + prefill, abs=0.01)
        assert beside.ttft_ms[0] == pytest.approx(4.0 + 2.0 + max(safety, prefill), abs=0.01)


def test_a_chain_load_pays_the_store_hop_per_link() -> None:
    spec = MODELS["mock-1000tps"]
    replay = Replay("r", "", (session(),), trace=False)
    cal = calibration(**{"http-prev": flat(10.0, 4.0)})
    free = predict_cell(cal, "http-prev", replay, spec, Hops(), tool_time_scale=1.0)
    priced = predict_cell(cal, "http-prev", replay, spec, Hops(store_ms=5.0), tool_time_scale=1.0)
    plan = build_plan(replay.sessions[0], spec.name, "000000000000")
    links = sum(chains("http-prev", plan))
    assert links == 0 + 1 + 2
    assert priced.e2e_s[0] - free.e2e_s[0] == pytest.approx(links * 5.0 / 1e3, abs=1e-6)


def test_lock_step_sessions_share_the_server_core_every_round() -> None:
    # The two sessions meet only on the server core: a model whose prefill takes no step time and that
    # decodes one token a step (mock-4000tps draws speculative bursts from the engine's one RNG, and two
    # sessions' prefills share the GPU's steps: tests/test_gpu_batch.py).
    spec = MODELS["mock-1000tps"].override(prefill_time_per_token_ms=0.0)
    replay = Replay("r", "", (session(4, 0.1),), trace=False)
    alone = predict_cell(
        calibration(http=flat(8.0, 6.0, busy_ms=5.0)), "http", replay, spec, Hops(), sessions=1
    )
    pair = predict_cell(
        calibration(http=flat(8.0, 6.0, busy_ms=5.0)), "http", replay, spec, Hops(), sessions=2
    )
    assert len(pair.e2e_s) == 2
    # Processor sharing: each round of each session is slowed by the other's 5 ms of server work, so both
    # stay in lock-step and both pay it every round (a FIFO would make the first never wait, the second
    # fall behind once and never meet the first again).
    # less the load factor's shifts
    assert pair.parts_s["contention"] == pytest.approx(2 * 4 * 0.005, abs=2e-3)
    assert pair.e2e_s == pytest.approx([alone.e2e_s[0] + 4 * 0.005] * 2, abs=2e-3)


def test_a_trace_replays_its_sessions_at_their_arrivals() -> None:
    replay = load_replay("tracelab-multi_session_example")
    p = predict_cell(
        calibration(ws=flat(2.0, 1.0)), "ws", replay, MODELS["mock-4000tps"], Hops(), tool_time_scale=1.0
    )
    assert len(p.e2e_s) == 3 and len(p.ttft_ms) == replay.rounds


def test_samples_split_a_timeline_into_rounds() -> None:
    replay = Replay("r", "", (session(2, 0.25),), trace=False)
    plan = build_plan(replay.sessions[0], "m", "000000000000", 1.0)
    trace = Trace(
        "http",
        [
            Mark(0.000, SEND),
            Mark(0.020, "response.output_text.delta"),
            Mark(0.030, "response.output_text.delta"),
            Mark(0.032, "response.completed"),
            Mark(0.290, SEND),
            Mark(0.300, "response.output_text.delta"),
            Mark(0.331, "response.output_text.delta"),
            Mark(0.335, "response.completed"),
        ],
    )
    trace.reports = [
        {
            "prompt_tokens": 1,
            "cached_tokens": 0,
            "prefill_ms": 12.0,
            "queue_wait_ms": 1.0,
            "decode_ms": 9.0,
            "output_tokens": 20,
        },
        {
            "prompt_tokens": 1,
            "cached_tokens": 0,
            "prefill_ms": 5.0,
            "queue_wait_ms": 0.0,
            "decode_ms": 30.0,
            "output_tokens": 30,
        },
    ]
    trace.hops = [(1, 1, 1), (1, 1, 0)]
    first, second = samples_of("http", plan, trace)
    assert first.c_ms == pytest.approx(32.0 - 22.0) and first.o_ms == pytest.approx(20.0 - 13.0)
    # Round 1: from round 0's end (32 ms) to its own (335 ms), less the 250 ms tool wait and 35 ms modelled.
    assert second.c_ms == pytest.approx(303.0 - 250.0 - 35.0) and second.o_ms == pytest.approx(10.0 - 5.0)
    assert (first.safety_hops, first.resolutions, second.resolutions) == (1, 1, 0)


def test_chain_lengths_follow_what_each_mode_loads() -> None:
    plan = build_plan(load_replay("tracelab-session_workload_example").sessions[0], "m", "000000000000")
    assert chains("http", plan) == [0] * 11
    assert chains("http-prev", plan) == [0] * 11  # every round a rewrite: sent whole, nothing loaded
    claude = build_plan(load_replay("tracelab-claude-session").sessions[0], "m", "000000000000")
    assert chains("http-prev", claude) == list(range(10))
    # the create after round 4's message loads one response
    assert chains("longlived", claude) == [0] * 5 + [1] * 5
    assert chains("ws", claude) == [0] * 10


@pytest.mark.slow
def test_the_calibration_workload_is_seeded_and_has_every_kind() -> None:
    a, b = calibration_replay(120, 40_000), calibration_replay(120, 40_000)
    assert a == b and a.rounds == 120
    kinds = {s.kind for session in a.sessions for s in build_plan(session, "m", "000000000000").sends}
    assert kinds == set(KINDS)


def test_models_are_calibrated_classes_with_a_source_per_knob() -> None:
    assert {"mock-65tps", "mock-1000tps", "mock-4000tps", "mock-h100-8b"} <= set(MODELS)
    for spec in MODELS.values():
        assert spec.calibration is not None and spec.calibration.hardware
        for knob in ("prefill-overhead", "prefill-time-per-token", "inter-token-latency", "max-num-seqs"):
            assert spec.calibration.sources[knob], (spec.name, knob)
    h100 = MODELS["mock-h100-8b"]
    assert (h100.prefill_overhead_ms, h100.prefill_time_per_token_ms, h100.inter_token_latency_ms) == (
        30.0,
        0.25,
        12.0,
    )
    for name in ("mock-1000tps", "mock-4000tps"):  # wafer-scale prefill, not the H100-8B profile
        assert MODELS[name].prefill_time_per_token_ms == pytest.approx(0.039)
    assert MODELS["mock-65tps"].tokens_per_s == pytest.approx(65.0)


def _config(*argv: str) -> object:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_a_scenario_sets_up_its_comparison() -> None:
    config = _config("--scenario", "sglang-gateway")
    # type: ignore[attr-defined]
    assert config.modes == ("http", "http-prev", "ws", "longlived") and config.sessions == 1
    # type: ignore[attr-defined]
    assert [len(load_replay(w).sessions[0].rounds) for w in config.workloads] == [8, 40]
    vllm = _config("--scenario", "vllm-responses")
    assert "--api-cost-ms-per-1k" in vllm.server_flags  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match="unknown scenario"):
        _config("--scenario", "nope")


def test_the_shared_core_is_processor_sharing_and_keeps_lock_step_sessions_together() -> None:
    from proto.lab.analysis.predict import SharedCore

    core = SharedCore()
    a, b = core.arrive(0.0, 0.010), core.arrive(0.0, 0.010)  # two equal rounds at once: both end at 2 W
    assert (a.end, b.end) == pytest.approx((0.020, 0.020)) and (a.extra, b.extra) == pytest.approx(
        (0.010, 0.010)
    )
    c = core.arrive(0.0, 0.010)  # a third: all three at 3 W
    assert (a.end, b.end, c.end) == pytest.approx((0.030, 0.030, 0.030))
    late = core.arrive(0.025, 0.004)  # overlaps what is left of each (5 ms), up to its own work
    assert late.extra == pytest.approx(3 * 0.004) and a.end == pytest.approx(0.034)
    alone = core.arrive(1.0, 0.010)  # after every other has ended: no one to share with
    assert alone.extra == 0.0 and alone.end == pytest.approx(1.010) and core.jobs == [alone]


@pytest.mark.slow
def test_predict_predicts_every_cell_of_the_grid_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench --predict`` with a kept calibration: every (profile, workload, model, mode) cell of the grid in
    results.json's ``grid`` and in grid.csv, each the fast model's own prediction for that cell
    (``cell_prediction``), with its ratio to http's and its real-clock wall; no cell is run."""
    import csv
    import json

    from proto.lab.bench import main
    from proto.lab.report import results as results_module
    from proto.lab.report.results import cell_prediction, predicted_wall

    monkeypatch.setattr(results_module, "machine", dict)  # platform.processor() would start `uname -p`

    cal = calibration(http=flat(8.0, 6.0, busy_ms=2.0, safety=1.0), longlived=flat(1.0, 0.5, 0.3, 0.0, 0.0))
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"calibration": cal.to_json()}), encoding="utf-8")
    out = tmp_path / "grid"
    argv = ["--predict", "--calibration", str(kept), "--model", "mock-4000tps,mock-65tps"]
    argv += ["--workload", "tracelab-multi_session_example", "--modes", "http,longlived", "--rollouts", "1"]
    assert main([*argv, "--no-plots", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = results["grid"]
    assert results["runs"] == [] and results["calibration_from"] == str(kept)
    assert [(r["profile"], r["model"], r["mode"]) for r in rows] == [
        (p, m, mode)
        for p in ("local", "production-like", "production-like-beside")
        for m in ("mock-4000tps", "mock-65tps")
        for mode in ("http", "longlived")
    ]
    config = _config(*argv)
    replay = load_replay("tracelab-multi_session_example")
    for row in rows:
        p = cell_prediction(cal, replay, dict(row), config)
        assert row["predicted_e2e_s_p50"] == pytest.approx(p.e2e_s_p50)
        assert row["predicted_ttft_ms_p50"] == pytest.approx(p.ttft_ms_p50)
        assert row["predicted_wall_s"] == pytest.approx(predicted_wall(p, replay, config))  # type: ignore[arg-type]
        assert row["sessions"] == 3 and row["rounds"] == replay.rounds and "prediction_error" not in row
        base = next(
            r
            for r in rows
            if r["mode"] == "http" and r["model"] == row["model"] and r["profile"] == row["profile"]
        )
        assert row["predicted_e2e_vs_http"] == pytest.approx(
            row["predicted_e2e_s_p50"] / base["predicted_e2e_s_p50"] - 1
        )
    # longlived pays fewer hops and less overhead: faster than http in every cell, more so with hops
    gains = {(r["profile"], r["model"]): r["predicted_e2e_vs_http"] for r in rows if r["mode"] == "longlived"}
    assert all(g < 0 for g in gains.values())
    assert gains["production-like", "mock-4000tps"] < gains["local", "mock-4000tps"]
    with (out / "grid.csv").open(encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and float(table[1]["predicted_e2e_vs_http"]) == pytest.approx(
        rows[1]["predicted_e2e_vs_http"], rel=1e-5
    )
    assert float(table[1]["part_tools_s"]) == pytest.approx(rows[1]["predicted_parts_s"]["tools"], rel=1e-5)
    # bench report --lab's section: the WebSocket designs' gains, the best of them, none at the seed's -40 %
    from proto.lab.records import results_of
    from proto.lab.report.writeup import grid_section

    best = min((r for r in rows if r["mode"] == "longlived"), key=lambda r: r["predicted_e2e_vs_http"])
    text = "\n".join(grid_section(results_of(results)))
    assert f"**{best['predicted_e2e_vs_http'] * 100:+.1f} %** (longlived, production-like" in text
    assert "Cells at or beyond the seed's -40 %: **0** of 6." in text and text.count("| mock-") == 2
    # --shard: the cells that shard would run, so each shard's real-clock wall is known before it runs
    shard = ["--modes", "http", "--shard", "2/2", "--no-plots", "--out", str(tmp_path / "s")]
    assert main([*argv[:7], *argv[9:], *shard]) == 0
    second = json.loads((tmp_path / "s" / "results.json").read_text(encoding="utf-8"))
    assert second["shard"] == "2/2"
    assert [(r["profile"], r["model"]) for r in second["grid"]] == [
        ("local", "mock-65tps"),
        ("production-like", "mock-65tps"),
        ("production-like-beside", "mock-65tps"),
    ]  # the groups sorted by name, every second from the second
    with pytest.raises(SystemExit, match="--predict only"):
        main(["--calibration", str(kept), "--out", str(tmp_path / "x")])
