"""``responses-lab bench``: the command line of the lab. ``bench report …``, ``bench repredict …``,
``bench merge …`` and ``bench validate …`` are its subcommands over kept runs
(:mod:`proto.lab.report.writeup`, :mod:`proto.lab.analysis.repredict`, :func:`merge`,
:mod:`proto.lab.analysis.validate`); any other first argument is a flag of the run itself
(``responses-lab bench --quick``).

A run with cells keeps each finished cell's record in ``--out`` as it finishes (:mod:`proto.lab.run.store`),
so ``--resume DIR`` goes on where a crash or a Ctrl-C stopped it, and ``--shard I/N`` runs a part of the grid
that ``bench merge`` puts together with the others (docs/lab.md, "Long sweeps")."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from proto.core.response import MODES
from proto.helpfmt import HelpFormatter
from proto.lab.analysis.predict import PASSES, Calibration, Prediction
from proto.lab.analysis.stats import MIN_ROLLOUTS
from proto.lab.analysis.sweep import sweep
from proto.lab.config import AGENTIC_API, PEER_MODES, PROFILES, BenchConfig, profile_named, with_networks
from proto.lab.records import GridRow, provenance
from proto.lab.report.results import (
    grid_predictions,
    load,
    predict_cells,
    results_json,
    write_csv,
    write_grid_csv,
    write_json,
)
from proto.lab.report.tables import print_grid, print_table, write_plots
from proto.lab.report.timeline import write_trace
from proto.lab.run.network import NETWORKS, RUN_KEY, NetworkError, NetworkUnavailable, requirements
from proto.lab.run.peers import PeerError, PeerUnavailable, agentic_server
from proto.lab.run.runner import BenchResult, CellKey, CellResult, cell_turns, grid, replays_of, run_bench
from proto.lab.run.store import (
    RunDir,
    Shard,
    SweepError,
    assemble,
    check_shards,
    group,
    label,
    shard_cells,
    sorted_shards,
    without,
)
from proto.lab.workload.codex_rollout import RolloutError
from proto.lab.workload.plan import PlanError
from proto.lab.workload.scenarios import SCENARIOS
from proto.lab.workload.traces import TraceError


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grid = parser.add_argument_group("the grid: modes, workloads, models, profiles")
    rollouts = parser.add_argument_group("rollouts: sizes, seed, jitter")
    servers = parser.add_argument_group("the servers measured")
    fast_model = parser.add_argument_group("the fast model")
    output = parser.add_argument_group("output and long sweeps")
    servers.add_argument(
        "--url",
        default=None,
        help="a running Responses server's WebSocket URL, this project's or any other (timed from the client "
        "side only, and each run record's peer.timing says so; default: start one per profile)",
    )
    grid.add_argument(
        "--modes", type=_csv, default=None, help=f"comma list of {','.join(MODES)} (default: all)"
    )
    grid.add_argument(
        "--peer",
        action="append",
        choices=PEER_MODES,
        default=None,
        help="also run another project's server as one more mode, in front of this server's http mode: "
        'agentic-api (vLLM\'s gateway; `make peers` installs it; docs/lab.md, "Peers")',
    )
    servers.add_argument(
        "--client",
        choices=("codex",),
        default=None,
        help="the real Codex CLI as the client, through a repository task, beside the lab's own client "
        '(its own flags: bench --client codex --help; docs/lab.md, "The real agent") (default: none)',
    )
    grid.add_argument(
        "--workload", type=_csv, default=None, help="NAME or FILE, comma list (default: coding-agent)"
    )
    grid.add_argument(
        "--model", type=_csv, default=None, help="comma list (default: mock-1000tps; --quick: mock-4000tps)"
    )
    grid.add_argument(
        "--profile",
        type=_csv,
        default=None,
        help=f"the rules factor: presets {','.join(PROFILES)} or hops:SAFETY/RESOLVE/STORE[:before|beside]"
        "[:user|new|all] (default: local,production-like,production-like-beside)",
    )
    servers.add_argument(
        "--network",
        type=_csv,
        default=None,
        help=f"a factor: each profile's server behind each shaped link, in a network namespace of its own "
        f"(needs root): {','.join(NETWORKS)} or net:RTT/JITTER/UP/DOWN (ms, ms, Mbit/s; - not shaped), "
        '+tls for TLS (docs/lab.md, "Network") (default: none, loopback)',
    )
    rollouts.add_argument(
        "--sessions", type=int, default=None, help="concurrent rollouts per mode (default 4; --quick 2)"
    )
    rollouts.add_argument(
        "--rollouts", type=int, default=None, help="measured rollouts per session (default 3; --quick 2)"
    )
    rollouts.add_argument(
        "--warmup", type=int, default=None, help="uncounted warm-up rollouts per session (default 1)"
    )
    rollouts.add_argument(
        "--turns", type=int, default=None, help="shorten the workload to N turns (default: all; --quick: 15)"
    )
    rollouts.add_argument(
        "--tool-time-scale",
        type=float,
        default=None,
        help="multiply recorded tool times (default 1.0; --quick 0.02)",
    )
    rollouts.add_argument(
        "--pings", type=int, default=None, help="WebSocket pings for the floor (default 500; --quick 200)"
    )
    servers.add_argument("--api-key", default=None, help="bearer key for a running server given by --url")
    servers.add_argument(
        "--model-override",
        action="append",
        default=None,
        metavar="MODEL:KNOB=V,…",
        help="passed to the servers the lab starts, e.g. mock-1000tps:prefill-time-per-token=0.025 "
        "(repeatable)",
    )
    fast_model.add_argument(
        "--predict",
        action="store_true",
        help="the fast model only: calibrate every mode, compose the curves, predict every cell of the grid "
        "(none run on the real clock)",
    )
    fast_model.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --predict: the fast model's calibration from a kept run's results.json (or run.json) "
        "instead of measuring one",
    )
    fast_model.add_argument(
        "--no-predict",
        action="store_true",
        help="skip the fast model's calibration (no predictions, no sweep)",
    )
    fast_model.add_argument(
        "--predict-rounds",
        type=int,
        default=None,
        help="calibration rounds per mode (default 240; --quick 120)",
    )
    grid.add_argument("--scenario", default=None, help=f"a published comparison: {', '.join(SCENARIOS)}")
    servers.add_argument(
        "--api-cost-ms",
        type=float,
        default=None,
        help="the HTTP modes' modelled per-request API work (vLLM 0.32: 5); with --api-cost-ms-per-1k (1.7) "
        "(default 0: none modelled)",
    )
    servers.add_argument(
        "--api-cost-ms-per-1k",
        type=float,
        default=None,
        help="the HTTP modes' modelled API work per 1 000 history tokens (vLLM 0.32: 1.7; default 0)",
    )
    servers.add_argument(
        "--engine",
        default=None,
        metavar="URL|spawn",
        help="the servers the lab starts drive this engine (vLLM's completions API), or one the lab starts "
        "(spawn) (default: the mock GPU in each server's process)",
    )
    servers.add_argument(
        "--workers",
        type=int,
        default=None,
        help="API processes per server the lab starts (serve --workers N; default 1)",
    )
    servers.add_argument(
        "--reconnect",
        type=int,
        default=None,
        metavar="K",
        help="ws: reconnect to the other server every K turns (two servers share --db; default 0: never)",
    )
    servers.add_argument(
        "--db",
        default=None,
        help="the --db of the servers the lab starts, a SQLite path or postgresql://… (default: :memory:; "
        "with --reconnect or --workers > 1, a temporary SQLite file)",
    )
    rollouts.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the run's seed: each rollout's tool times and the mock GPU's jitter (default 1)",
    )
    rollouts.add_argument(
        "--no-jitter", action="store_true", help="the mock GPU without jitter (default: jitter on, seeded)"
    )
    servers.add_argument(
        "--fresh-server",
        action="store_true",
        help="new server processes for every rollout index of a group (default: one per profile)",
    )
    output.add_argument(
        "--out",
        type=Path,
        default=Path("bench-out"),
        help="where results.json, results.csv, the plots and trace.json go",
    )
    grid.add_argument(
        "--quick", action="store_true", help="the ~4 min run of make bench (40 measured rollouts)"
    )
    output.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    output.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="go on with DIR's run: its flags, its floor and calibration; only the cells not there yet",
    )
    output.add_argument(
        "--shard",
        type=_shard,
        default=None,
        metavar="I/N",
        help="run the I-th of N parts of the grid (1 <= I <= N); put them together with bench merge",
    )


def _shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        "seed": args.seed,
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
    if args.peer:
        config.modes = (*config.modes, *(p for p in args.peer if p not in config.modes))
    if config.url and any(m in PEER_MODES for m in config.modes):
        raise SystemExit("--peer starts its own upstream; with --url the server given is measured as it is")
    if config.engine == "spawn" and any(m in PEER_MODES for m in config.modes):
        raise SystemExit("--peer runs its upstream on its own engine: give --engine a URL, or none")
    if AGENTIC_API in config.modes:
        agentic_server()  # not installed or not runnable: PeerUnavailable, before any cell has run
    bad = [m for m in config.modes if m not in (*MODES, *PEER_MODES)]
    if bad:
        raise SystemExit(f"unknown mode: {', '.join(bad)} (modes: {', '.join((*MODES, *PEER_MODES))})")
    if args.network:
        if config.url:
            raise SystemExit("--network places the servers the lab starts; with --url, shape that link")
        config.profiles = with_networks(config.profiles, args.network)
    for name in config.profiles:
        try:
            profile_named(name)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    if any(profile_named(name).network for name in config.profiles):
        requirements()  # NetworkUnavailable: what this machine or user lacks, before anything starts
        # A server behind a link listens beyond loopback: keyed (a key of the run's own unless given).
        config.api_key = config.api_key or RUN_KEY
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
    if args.no_jitter:
        config.jitter = False
    if args.fresh_server:
        if config.url:
            raise SystemExit("--fresh-server starts the lab's own servers; it does not go with --url")
        config.fresh_server = True
    if args.no_predict:
        config.predict = False
    if args.predict and not config.predict:
        raise SystemExit("--predict and --no-predict exclude each other")
    return config


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "report":
        from proto.lab.report.writeup import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] == "repredict":
        from proto.lab.analysis.repredict import main as repredict_main

        return repredict_main(argv[1:])
    if argv and argv[0] == "merge":
        return merge(argv[1:])
    if argv and argv[0] == "validate":
        from proto.lab.analysis.validate import main as validate_main

        return validate_main(argv[1:])
    if argv and argv[0] == "fleet":
        from proto.lab.run.fleet import main as fleet_main

        return fleet_main(argv[1:])
    if any(a == "--client" or a.startswith("--client=") for a in argv):
        from proto.lab.run.codex_bench import main as codex_main

        return codex_main(argv, main)
    return run(argv)


# bench's subcommands, as ``bench --help`` lists them; ``main`` hands each its own arguments.
SUBCOMMANDS = {
    "report": "a kept run's write-up, or the lab's results document (proto/lab/report/writeup.py)",
    "repredict": "the fast model's predictions of kept runs again, from their calibration "
    "(proto/lab/analysis/repredict.py)",
    "merge": "one results.json from the shards of one run (bench --shard I/N --out DIR)",
    "validate": "the fast model judged on its gains, out of sample; --run DIR measures the validation "
    "sample (proto/lab/analysis/validate.py)",
    "fleet": 'N agents against one shared engine, every mode on one schedule (docs/lab.md, "Fleets")',
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="responses-lab bench",
        usage="%(prog)s [-h] [FLAG …]\n       %(prog)s {" + ",".join(SUBCOMMANDS) + "} …",
        description="the latency lab: one run, its results written to --out",
    )
    names = parser.add_subparsers(title="subcommands (first, before any flag)", dest="subcommand")
    for name, text in SUBCOMMANDS.items():
        names.add_parser(name, help=text, add_help=False)
    add_arguments(parser)
    return parser


def run(argv: list[str]) -> int:
    """``responses-lab bench [flags]``: one run of the lab, its results written to ``--out``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.subcommand is not None:  # ``main`` hands a subcommand its arguments only when it comes first
        parser.error(f"unrecognized arguments: {' '.join(argv[argv.index(args.subcommand) :])}")
    console = Console()
    try:
        if args.calibration is not None and not args.predict:
            raise SystemExit("--calibration applies to --predict only")
        if args.predict:
            if args.resume:
                raise SystemExit("--predict runs no cells: there is nothing to resume")
            return _predict_only(args, argv, console)
        return _cells(parser, args, argv, console)
    except (SweepError, TraceError, RolloutError, PlanError, NetworkUnavailable, NetworkError) as exc:
        # the user's input, or what the machine lacks for it: one line, no trace
        Console(stderr=True).print(f"responses-lab bench: {exc}", highlight=False, soft_wrap=True)
        return 2
    except (PeerUnavailable, PeerError) as exc:  # a peer not installed, not started, or not as planned
        Console(stderr=True).print(f"responses-lab bench: {exc}", highlight=False, soft_wrap=True)
        return 1


def _progress(console: Console) -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("turns"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=False)


def _predict_only(args: argparse.Namespace, argv: list[str], console: Console) -> int:
    """``--predict``: the fast model alone (calibration, curves, every cell of the grid predicted); no
    real-clock cells, no run directory."""
    config = config_from_args(args)
    started = time.perf_counter()
    if args.calibration is not None:
        kept = load(args.calibration).get("calibration")
        if not kept:
            raise SystemExit(f"{args.calibration}: no calibration in it")
        result = BenchResult(config, calibration=Calibration.from_json(kept))
    else:
        result = _calibrate(config, console, for_cells=False)
    rows: list[dict[str, object]] = []
    cells: list[GridRow] = []
    if result.calibration is not None:
        console.print("fast model: composing the curves …")
        rows = sweep(result.calibration, config.modes, config.tool_time_scale)
        replays = replays_of(config)
        keys = shard_cells(grid(config, replays), args.shard)  # with --shard: the cells that shard would run
        console.print(f"fast model: predicting the grid's {len(keys)} cells …")
        cells = grid_predictions(result.calibration, keys, {r.name: r for r in replays}, config)
    results = results_json(result, "responses-lab bench " + shlex.join(argv), rows)
    results["grid"] = msgspec.to_builtins(cells)
    results["wall_s"] = time.perf_counter() - started
    if args.calibration is not None:
        results["calibration_from"] = str(args.calibration)
    if args.shard is not None:
        results["shard"] = str(args.shard)
    if args.scenario is not None:
        results["scenario"] = _scenario(args.scenario, result.calibration)
    args.out.mkdir(parents=True, exist_ok=True)
    written = write_outputs(results, [], args.out, plots=not args.no_plots)
    written.append(write_grid_csv(results, args.out))
    print_table(results, console)
    print_grid(results, console)
    wall = sum(row.predicted_wall_s for row in cells)
    console.print(
        f"the grid on the real clock: {len(cells)} cells, {_duration(wall)} of measured rollouts by the fast "
        f"model (warm-up, connections and server starts not counted)",
        highlight=False,
    )
    console.print(f"wall {results['wall_s']:.1f} s; wrote " + ", ".join(str(p) for p in written))
    return 0


def _calibrate(config: BenchConfig, console: Console, for_cells: bool) -> BenchResult:
    """The fast model's calibration, with its progress bar. ``for_cells``: over the history range of the
    run's own workloads (run_bench with cells, none of them to run), else ``--predict``'s 128 k."""
    with _progress(console) as progress:
        task = progress.add_task("starting", total=_calibration_sends(config))
        return asyncio.run(
            run_bench(
                config,
                on_turn=lambda: progress.advance(task),
                on_cell=lambda text: progress.update(task, description=text),
                cells=for_cells,
                todo=frozenset() if for_cells else None,
            )
        )


def _calibration_sends(config: BenchConfig) -> int:
    """The calibration's sends (for the progress bar): two warm-up rollouts of 3 rounds, then every round
    on each pass, per mode."""
    return (config.calibration_rounds * PASSES + 6) * len(config.modes)


def _scenario(name: str, calibration: Calibration | None) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    return {
        "name": scenario.name,
        "authors": scenario.authors,
        "conditions": scenario.conditions,
        "fast_model": scenario.question(calibration) if scenario.question and calibration else None,
    }


# Flags a resumed run may be given alone that do not change what it measures (``--db`` again for the
# password its manifest does not keep; ``--out`` and ``--shard`` are checked against DIR's).
_RESUME_EXTRAS = frozenset({"--api-key", "--db", "--no-plots", "--resume", "--out", "--shard"})


def _open_run(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]
) -> tuple[argparse.Namespace, BenchConfig, RunDir]:
    """The run directory and the configuration: a fresh run's, or ``--resume DIR``'s own (its command
    line, then the flags given here: any that changes a cell is refused by :meth:`RunDir.resume`)."""
    if args.resume is None:
        config = config_from_args(args)
        cells = grid(config, replays_of(config))
        if args.shard is not None and not shard_cells(cells, args.shard):
            groups = len({group(k) for k in cells})
            raise SweepError(
                f"shard {args.shard} has no cells: the grid has {groups} (profile, workload, model) "
                f"group(s), and a group's modes run in one shard; use N <= {groups}"
            )
        return args, config, RunDir.create(args.out, argv, config, cells, args.shard, provenance())
    out_given = any(a == "--out" or a.startswith("--out=") for a in argv)
    if out_given and args.out.resolve() != args.resume.resolve():
        raise SystemExit("--resume DIR writes to DIR: leave --out out (or give the same DIR)")
    run_dir = RunDir.open(args.resume)
    given = without(argv, "--resume")
    own = [a for a in given if a.startswith("--") and a.split("=")[0] not in _RESUME_EXTRAS]
    effective = given if own else [*run_dir.data["argv"], *given]
    args = parser.parse_args([*effective, "--out", str(args.resume)])
    config = config_from_args(args)
    run_dir.resume(config, args.shard, provenance())
    return args, config, run_dir


def _cells(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str], console: Console
) -> int:
    """A run with real-clock cells, each kept in the run directory as it finishes."""
    args, config, run_dir = _open_run(parser, args, argv)
    out: Path = args.out
    mine = run_dir.cells()
    before = run_dir.done()
    todo = [k for k in mine if k not in before]
    shard = f" (shard {run_dir.data['shard']} of {len(run_dir.grid())})" if run_dir.data["shard"] else ""
    console.print(
        f"cells: {len(mine)}{shard}; {len(before)} done before, {len(todo)} to run; kept in {out}/cells",
        highlight=False,
    )
    replays = {r.name: r for r in replays_of(config)}
    try:
        calibration = _calibration(args, config, run_dir, console) if todo else None
        if args.scenario is not None and run_dir.data["scenario"] is None:
            stored = run_dir.data["calibration"]
            run_dir.data["scenario"] = _scenario(args.scenario, stored and Calibration.from_json(stored))
            run_dir.save()
        predictions = _predictions(calibration, todo, replays, config, console)
        tracker = Eta(len(mine), len(before), predictions)
        estimate = tracker.remaining_s()
        if estimate is not None:
            console.print(f"the fast model's estimate for the cells left: {_duration(estimate)}")

        def done(cell: CellResult) -> None:
            key: CellKey = (cell.profile, cell.workload, cell.model, cell.mode)
            p = predictions.get(key)
            run_dir.write_record(cell, p[0] if p else None)
            console.print(tracker.finished(key), highlight=False, soft_wrap=True)  # one line a cell

        def floor(profile: str, pings: list[float]) -> None:
            run_dir.data["floor_pings_ms"][profile] = pings
            run_dir.save()

        if todo:
            with _progress(console) as progress:

                def starting(text: str) -> None:
                    progress.update(task, description=text)
                    tracker.start()

                turns = sum(cell_turns(config, replays[k[1]]) for k in todo)
                task = progress.add_task("starting", total=turns)
                with interruptible() as interrupted:

                    def turned() -> None:
                        interrupted()
                        progress.advance(task)

                    def cell_starts(text: str) -> None:
                        interrupted()
                        starting(text)

                    interrupted.run(
                        run_bench(
                            config,
                            on_turn=turned,
                            on_cell=cell_starts,
                            calibration=calibration,
                            todo=set(todo),
                            floors=run_dir.data["floor_pings_ms"],
                            on_floor=floor,
                            on_done=done,
                        )
                    )
    except KeyboardInterrupt:
        run_dir.save()
        results, _ = assemble([run_dir])
        written = [write_json(results, out), write_csv(results, out)]
        left = len(mine) - len(run_dir.done())
        Console(stderr=True).print(
            f"interrupted: {len(mine) - left} of {len(mine)} cells finished, each kept in {out}/cells "
            f"({', '.join(str(p) for p in written)} hold them; {left} left). Resume with: "
            f"responses-lab bench --resume {out}",
            highlight=False,
            soft_wrap=True,
        )
        return 130
    finished = run_dir.done()
    run_dir.data["complete"] = all(k in finished for k in mine)
    run_dir.save()
    results, timelines = assemble([run_dir])
    written = write_outputs(results, timelines, out, plots=not args.no_plots)
    print_table(results, console)
    _print_reconnects(results, config, console)
    _print_rollouts(results, config, console)
    console.print(f"wall {run_dir.wall_s():.1f} s; wrote " + ", ".join(str(p) for p in written))
    return 0


class _Interrupted(Exception):
    """SIGINT came during the run: raised at the next turn or cell (:class:`Interruptible`)."""


class Interruptible:
    """SIGINT during a sweep, made certain. Its handler cancels the run's task at once, as ``asyncio.run``
    does, and also sets a flag that stops the run at the next turn or cell: a cancellation can be swallowed
    on its way (Python 3.11's ``asyncio.wait_for`` returns a result that completed as the cancel arrived),
    and the sweep then went on to its end and exited 0. Calling the object is the check."""

    def __init__(self) -> None:
        self.hit = False
        self.task: asyncio.Task[Any] | None = None

    def __call__(self) -> None:
        if self.hit:
            raise _Interrupted

    def handler(self, signum: int, frame: object) -> None:
        self.hit = True
        task = self.task
        if task is not None and not task.done():
            task.get_loop().call_soon_threadsafe(task.cancel)

    def run(self, coro: Coroutine[Any, Any, Any]) -> None:
        """``asyncio.run(coro)``; KeyboardInterrupt if SIGINT came, however the run ended."""

        async def main() -> None:
            self.task = asyncio.current_task()
            await coro

        try:
            asyncio.run(main())
        except (asyncio.CancelledError, _Interrupted):
            if not self.hit:
                raise
            raise KeyboardInterrupt from None
        if self.hit:
            raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible() -> Iterator[Interruptible]:
    state = Interruptible()
    previous = signal.signal(signal.SIGINT, state.handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def _calibration(
    args: argparse.Namespace, config: BenchConfig, run_dir: RunDir, console: Console
) -> Calibration | None:
    """The run's calibration: measured once (and its curves composed), kept in the manifest, and read
    back from there, so a resumed run's cells are predicted from the very fits its first cells were."""
    if not config.predict:
        return None
    if run_dir.data["calibration"] is None:
        result = _calibrate(config, console, for_cells=True)
        assert result.calibration is not None
        console.print("fast model: composing the curves …")
        run_dir.data["sweep"] = sweep(result.calibration, config.modes, config.tool_time_scale)
        run_dir.data["calibration"] = result.calibration.to_json()
        run_dir.save()
    return Calibration.from_json(run_dir.data["calibration"])


def _predictions(
    calibration: Calibration | None,
    todo: Sequence[CellKey],
    replays: dict[str, Any],
    config: BenchConfig,
    console: Console,
) -> dict[CellKey, tuple[Prediction, float]]:
    """Each cell left, predicted before it runs: its record's prediction and, as (prediction, wall), the
    progress line's ETA."""
    if calibration is None or not todo:
        return {}
    console.print(f"fast model: predicting {len(todo)} cells …")
    return predict_cells(calibration, todo, replays, config)


class Eta:
    """The progress line: cells done of all, and the time left: the fast model's walls of the cells left,
    scaled by how the cells done in this attempt compared with theirs (warm-up, connections and the
    machine's pace are not in a prediction); without predictions, the cells' mean pace."""

    def __init__(
        self,
        total: int,
        done: int,
        predictions: dict[CellKey, tuple[Prediction, float]],
    ) -> None:
        self.total, self.done = total, done
        self.walls = {k: wall for k, (_, wall) in predictions.items()}
        self.left = set(predictions)
        self.elapsed = 0.0  # this attempt's cells: seconds
        self.predicted = 0.0  # and their predicted walls
        self.count = 0
        self.last = time.perf_counter()
        self.pending = total - done

    def start(self) -> None:
        """A cell (or a profile's floor before it) starts: its time counts from here."""
        self.last = time.perf_counter()

    def remaining_s(self) -> float | None:
        if self.walls:
            scale = self.elapsed / self.predicted if self.predicted > 0 else 1.0
            return scale * sum(self.walls[k] for k in self.left)
        if self.count:
            return self.elapsed / self.count * self.pending
        return None

    def finished(self, key: CellKey) -> str:
        now = time.perf_counter()
        took, self.last = now - self.last, now
        self.done += 1
        self.pending -= 1
        self.count += 1
        self.elapsed += took
        if key in self.left:
            self.left.discard(key)
            self.predicted += self.walls[key]
        eta = self.remaining_s()
        text = "–" if eta is None else _duration(eta)
        return f"cell {self.done}/{self.total} done · {label(key)} · {took:.1f} s · ETA {text}"


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


def write_outputs(
    results: dict[str, Any], timelines: list[dict[str, Any]], out: Path, plots: bool = True
) -> list[Path]:
    """results.json, results.csv, the plots, trace.json and timeline.png (when there are cells)."""
    out.mkdir(parents=True, exist_ok=True)
    written = [write_json(results, out), write_csv(results, out)]
    if plots:
        written += write_plots(results, out)
    if timelines:
        written += write_trace(timelines, out)
    return written


def _print_rollouts(results: dict[str, Any], config: BenchConfig, console: Console) -> None:
    """How many measured rollouts the run holds, per mode and in all, and whether a cell has fewer than a
    default cell's (--quick's do, by design)."""
    per = [len(run.get("rollout_records") or []) for run in results["runs"]]
    if not per:
        return
    few = min(per) < MIN_ROLLOUTS
    note = f"; fewer than the {MIN_ROLLOUTS} per mode of a default cell" if few else ""
    quick = " (--quick)" if config.quick else ""
    console.print(
        f"ran {sum(per)} measured rollouts{quick}: {min(per)}-{max(per)} per cell, {len(per)} cells{note}",
        highlight=False,
    )


def _print_reconnects(results: dict[str, Any], config: BenchConfig, console: Console) -> None:
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


def merge(argv: list[str]) -> int:
    """``responses-lab bench merge DIR... --out OUT``: one results.json (CSV, plots, trace.json) from the
    run directories of shards of one run, holding exactly their cells' records."""
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="responses-lab bench merge",
        description="one results.json from the shards of one run (bench --shard I/N --out DIR)",
    )
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="the shards' run directories")
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out", type=Path, required=True, help="the merged run directory (not one of the shards)"
    )
    output.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    console = Console()
    try:
        if any(d.resolve() == args.out.resolve() for d in args.dirs):
            raise SweepError(f"--out {args.out} is one of the shards: merge into another directory")
        dirs = [RunDir.open(d) for d in args.dirs]
        check_shards(dirs)
        dirs = sorted_shards(dirs)
        results, timelines = assemble(dirs, "responses-lab bench merge " + shlex.join(argv))
    except SweepError as exc:
        Console(stderr=True).print(f"responses-lab bench merge: {exc}", highlight=False, soft_wrap=True)
        return 2
    written = write_outputs(results, timelines, args.out, plots=not args.no_plots)
    print_table(results, console)
    cells = results["cells"]
    console.print(
        f"merged {cells['done']} of {cells['of']} cells from "
        + ", ".join(f"{d.path} ({d.data['shard'] or 'whole'})" for d in dirs),
        highlight=False,
    )
    if cells["missing"]:
        console.print(
            f"missing {len(cells['missing'])} cells (not run yet, or their shard not given): "
            + "; ".join(cells["missing"]),
            highlight=False,
        )
    console.print("wrote " + ", ".join(str(p) for p in written))
    return 0
