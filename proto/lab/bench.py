"""``responses-lab bench``: the command line of the lab. ``bench report …`` and ``bench repredict …`` are
its subcommands over kept runs (:mod:`proto.lab.writeup`, :mod:`proto.lab.repredict`); any other first
argument is a flag of the run itself (``responses-lab bench --quick``)."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from proto.core.response import MODES
from proto.lab.config import PROFILES, BenchConfig
from proto.lab.report import print_table, write_plots
from proto.lab.results import results_json, write_csv, write_json
from proto.lab.runner import run_bench
from proto.lab.scenarios import SCENARIOS
from proto.lab.sweep import sweep
from proto.lab.timeline import results_traces, write_trace


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=None, help="a running server's WebSocket URL (default: start one per profile)"
    )
    parser.add_argument(
        "--modes", type=_csv, default=None, help=f"comma list of {','.join(MODES)} (default: all)"
    )
    parser.add_argument(
        "--workload", type=_csv, default=None, help="NAME or FILE, comma list (default: coding-agent)"
    )
    parser.add_argument(
        "--model", type=_csv, default=None, help="comma list (default: mock-1000tps; --quick: mock-4000tps)"
    )
    parser.add_argument("--profile", type=_csv, default=None, help="local,production-like (default: both)")
    parser.add_argument(
        "--sessions", type=int, default=None, help="concurrent rollouts per mode (default 4; --quick 2)"
    )
    parser.add_argument(
        "--rollouts", type=int, default=None, help="measured rollouts per session (default 2; --quick 1)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="uncounted warm-up rollouts per session (default 1)"
    )
    parser.add_argument(
        "--turns", type=int, default=None, help="shorten the workload to N turns (--quick: 15)"
    )
    parser.add_argument(
        "--tool-time-scale", type=float, default=None, help="multiply recorded tool times (--quick: 0.1)"
    )
    parser.add_argument(
        "--pings", type=int, default=None, help="WebSocket pings for the floor (default 500; --quick 200)"
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--model-override",
        action="append",
        default=None,
        metavar="MODEL:KNOB=V,…",
        help="passed to the servers the lab starts, e.g. mock-1000tps:prefill-time-per-token=0.025 "
        "(repeatable)",
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help="the fast model only: calibrate every mode, then the curves and the sweep (no real-clock cells)",
    )
    parser.add_argument(
        "--no-predict",
        action="store_true",
        help="skip the fast model's calibration (no predictions, no sweep)",
    )
    parser.add_argument(
        "--predict-rounds",
        type=int,
        default=None,
        help="calibration rounds per mode (default 240; --quick 120)",
    )
    parser.add_argument("--scenario", default=None, help=f"a published comparison: {', '.join(SCENARIOS)}")
    parser.add_argument(
        "--api-cost-ms",
        type=float,
        default=None,
        help="the HTTP modes' modelled per-request API work (vLLM 0.32: 5); with --api-cost-ms-per-1k (1.7)",
    )
    parser.add_argument("--api-cost-ms-per-1k", type=float, default=None)
    parser.add_argument(
        "--engine",
        default=None,
        metavar="URL|spawn",
        help="the servers the lab starts drive this engine (vLLM's completions API), or one the lab starts "
        "(spawn)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="API processes per server the lab starts (serve --workers N)",
    )
    parser.add_argument(
        "--reconnect",
        type=int,
        default=None,
        metavar="K",
        help="ws: reconnect to the other server every K turns (two servers share --db; default 0: never)",
    )
    parser.add_argument(
        "--db", default=None, help="the --db of the servers the lab starts (SQLite path or postgresql://…)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--quick", action="store_true", help="the < 3 min run of make bench")
    parser.add_argument("--no-plots", action="store_true")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    config = BenchConfig.quick_preset() if args.quick else BenchConfig()
    if args.scenario is not None:
        if args.scenario not in SCENARIOS:
            raise SystemExit(f"unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}")
        SCENARIOS[args.scenario].apply(config)
    changes = {
        "url": args.url,
        "modes": args.modes,
        "workloads": args.workload,
        "models": args.model,
        "profiles": args.profile,
        "sessions": args.sessions,
        "rollouts": args.rollouts,
        "warmup": args.warmup,
        "turns": args.turns,
        "tool_time_scale": args.tool_time_scale,
        "pings": args.pings,
        "api_key": args.api_key,
        "model_overrides": tuple(args.model_override) if args.model_override else None,
        "calibration_rounds": args.predict_rounds,
        "engine": args.engine,
        "workers": args.workers,
        "reconnect": args.reconnect,
        "db": args.db,
    }
    if args.api_cost_ms is not None or args.api_cost_ms_per_1k is not None:
        changes["server_flags"] = (
            *config.server_flags,
            "--api-cost-ms",
            str(args.api_cost_ms or 0.0),
            "--api-cost-ms-per-1k",
            str(args.api_cost_ms_per_1k or 0.0),
        )
    for name, value in changes.items():
        if value is not None:
            setattr(config, name, value)
    bad = [m for m in config.modes if m not in MODES] + [p for p in config.profiles if p not in PROFILES]
    if bad:
        raise SystemExit(
            f"unknown mode/profile: {', '.join(bad)} (modes: {', '.join(MODES)}; profiles: "
            f"{', '.join(PROFILES)})"
        )
    if config.url and (config.model_overrides or config.engine or config.workers > 1):
        raise SystemExit(
            "--model-override, --engine and --workers apply to the servers the lab starts; with --url, start "
            "that server with them"
        )
    if config.url and config.db:
        raise SystemExit(
            "--db applies to the servers the lab starts; with --url, start those servers with it"
        )
    if config.workers < 1:
        raise SystemExit("--workers must be >= 1")
    if config.reconnect < 0:
        raise SystemExit("--reconnect must be >= 0")
    if config.sessions < 1 or config.rollouts < 1 or config.warmup < 0:
        raise SystemExit("--sessions and --rollouts must be >= 1, --warmup >= 0")
    if args.no_predict:
        config.predict = False
    if args.predict and not config.predict:
        raise SystemExit("--predict and --no-predict exclude each other")
    return config


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "report":
        from proto.lab.writeup import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] == "repredict":
        from proto.lab.repredict import main as repredict_main

        return repredict_main(argv[1:])
    return run(argv)


def run(argv: list[str]) -> int:
    """``responses-lab bench [flags]``: one run of the lab, its results written to ``--out``."""
    parser = argparse.ArgumentParser(
        prog="responses-lab bench", description="the latency lab (also: bench report, bench repredict)"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    config = config_from_args(args)
    console = Console()
    from proto.lab.runner import total_turns

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("turns"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        calibration = (config.calibration_rounds + 6) * len(config.modes) if config.predict else 0
        task = progress.add_task("starting", total=(0 if args.predict else total_turns(config)) + calibration)
        result = asyncio.run(
            run_bench(
                config,
                on_turn=lambda: progress.advance(task),
                on_cell=lambda label: progress.update(task, description=label),
                cells=not args.predict,
            )
        )
    command = "responses-lab bench " + shlex.join(argv)
    rows: list[dict[str, object]] = []
    if result.calibration is not None:
        console.print("fast model: composing the curves …")
        rows = sweep(result.calibration, config.modes, config.tool_time_scale)
    results = results_json(result, command, rows)
    if args.scenario is not None:
        scenario = SCENARIOS[args.scenario]
        results["scenario"] = {
            "name": scenario.name,
            "authors": scenario.authors,
            "conditions": scenario.conditions,
            "fast_model": scenario.question(result.calibration)
            if scenario.question and result.calibration
            else None,
        }
    args.out.mkdir(parents=True, exist_ok=True)
    written = [write_json(results, args.out), write_csv(results, args.out)]
    if not args.no_plots:
        written += write_plots(results, args.out)
    written += write_trace(results_traces(result), args.out) if result.cells else []
    print_table(results, console)
    for run in results["runs"]:
        if run.get("store_vs_cached"):
            store, cached = run["store_vs_cached"]["store"], run["store_vs_cached"]["cached"]
            console.print(
                f"{run['profile']} {run['mode']} --reconnect {config.reconnect}: TTFT p50 after a reconnect "
                f"(store path)"
                f" {store['ttft_ms_p50']:.2f} ms over {store['turns']:.0f} turns, cached "
                f"{cached['ttft_ms_p50']:.2f} ms over"
                f" {cached['turns']:.0f}; overhead p50 {store['turn_overhead_ms_p50']:.2f} vs "
                f"{cached['turn_overhead_ms_p50']:.2f} ms"
            )
    console.print(f"wall {result.wall_s:.1f} s; wrote " + ", ".join(str(p) for p in written))
    return 0
