"""``responses-lab`` (also ``python -m proto``): serve, engine, demo, bench, soak, chaos, perf."""

from __future__ import annotations

import argparse
import sys

from proto.helpfmt import HelpFormatter, apply

# Each command's parser is its module's own: ``main`` hands everything after the command's name to it, so
# ``responses-lab COMMAND --help`` is that module's help (serve's is built here, from ``Settings``).
COMMANDS = {
    "demo": "a coding-agent rollout over the long-lived protocol (proto/demo)",
    "bench": "the latency lab: one workload over the four transports; bench report, repredict, merge, fleet",
    "engine": "the mock GPU as its own process, behind vLLM's completions API (proto/engine)",
    "soak": "load and soak: N connections x M turns, RSS, leaks (proto/load/soak.py)",
    "chaos": "the long chaos run: every fault scenario, round after round (proto/load/chaos.py)",
    "perf": "the hot-path regression suite: turn, cpu, stream, capacity, rss, deflate, topology, engine "
    "(proto/perf)",
}


def parser() -> argparse.ArgumentParser:
    """``responses-lab``'s own parser: ``serve``'s flags, and a name for every other command."""
    from proto.server.config import add_arguments

    top = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="responses-lab", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the server (mock GPU behind every transport)")
    add_arguments(serve)
    for name, text in COMMANDS.items():
        commands.add_parser(name, help=text, add_help=False)
    return apply(top)  # serve formats its help as every subcommand does


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args, rest = cli.parse_known_args(argv)
    if args.command == "serve":
        if rest:
            cli.error(f"unrecognized arguments: {' '.join(rest)}")
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

        return demo_main(rest)
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
    cli.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
