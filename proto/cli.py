"""``responses-lab`` (also ``python -m proto``): serve, engine, demo, bench, soak, chaos, perf."""

from __future__ import annotations

import argparse
import sys

from proto.helpfmt import HelpFormatter, apply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="responses-lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    from proto.server.config import add_arguments

    serve = commands.add_parser("serve", help="run the server (mock GPU behind every transport)")
    add_arguments(serve)
    demo = commands.add_parser("demo", help="a coding-agent rollout over the long-lived protocol")
    demo.add_argument("--url", default=None, help="a running server (default: start one)")
    demo.add_argument("--model", default="mock-1000tps", help="the mock model the rollout runs on")
    # bench's flags live in proto/lab/bench.py; everything after `bench` is handed to it.
    commands.add_parser(
        "bench",
        help="the latency lab: one workload over the four transports; bench report, repredict, fleet",
        add_help=False,
    )
    commands.add_parser(
        "engine",
        help="the mock GPU as its own process, behind vLLM's completions API (proto/engine)",
        add_help=False,
    )
    commands.add_parser(
        "soak", help="load and soak: N connections x M turns, RSS, leaks (proto/load/soak.py)", add_help=False
    )
    commands.add_parser(
        "chaos",
        help="the long chaos run: every fault scenario, round after round (proto/load/chaos.py)",
        add_help=False,
    )
    commands.add_parser(
        "perf",
        help="the hot-path regression suite: turn, cpu, stream, capacity, rss, deflate, topology "
        "(proto/perf)",
        add_help=False,
    )

    apply(parser)  # serve and demo format their help as every subcommand does
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from proto.server.config import from_args

        settings = from_args(args)
        if settings.workers > 1:
            from proto.server.workers import serve_workers

            serve_workers(settings)
        else:
            from proto.server.serve import serve as run_server

            run_server(settings)
        return 0
    if args.command == "demo":
        from proto.demo import main as demo_main

        return demo_main([*(["--url", args.url] if args.url else []), "--model", args.model, *rest])
    if args.command == "bench":
        from proto.lab.bench import main as bench_main

        return bench_main(rest)
    if args.command == "engine":
        from proto.engine.serve import main as engine_main

        return engine_main(rest)
    if args.command == "soak":
        from proto.load.soak import main as soak_main

        return soak_main(rest)
    if args.command == "chaos":
        from proto.load.chaos import main as chaos_main

        return chaos_main(rest)
    if args.command == "perf":
        from proto.perf import main as perf_main

        return perf_main(rest)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
