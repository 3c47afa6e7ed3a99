"""``responses-lab perf``: the hot path at the stack's floor, a regression suite to run before and after a
change.

    responses-lab perf turn      [--contexts 1000,100000] [--turns 50] [--append 1000]
    responses-lab perf cpu       [--context 100000] [--turns 20]
    responses-lab perf stream    [--tokens 16000] [--streams 1,32] [--models flat-out,4000,1000]
    responses-lab perf capacity  [--streams 64,96,128,160] [--rate 1000] [--seconds 8]
    responses-lab perf rss       [--contexts 1000,10000,100000] [--count 12]
    responses-lab perf deflate   [--tokens 16000]
    responses-lab perf topology  [--seconds 6] [--concurrency 8,32,96] [--tokens 100] [--out capacity.json]
    responses-lab perf engine    [--sequences 64,512] [--model mock-h100-8b] [--seconds 5]
    responses-lab perf profile   FILE… [--top 40]

Every server runs in a child process (``responses-lab serve``; psutil reads *its* CPU time and RSS), on
loopback, with a 1 ms prefill so the modelled GPU time stays small. ``--server-path DIR`` runs the server
from another checkout (``git archive <commit> | tar -x -C DIR``) and ``--compare DIR`` runs both, one after
the other in the same run, so a before/after is a ratio of one run. Every figure is printed next to the
floor it is compared with, measured in the same run:

* ``turn`` — per-turn API overhead of a long-lived response: ``response.append`` sent → the turn's first
  delta, minus the modelled prefill and queue wait the server reports for that turn, against WebSocket
  ping round trips on the same connection (answered below the app) taken just before each append; with
  the server's own per-turn stages (``lab.turns[].phases_ms``) and its CPU per turn.
* ``cpu`` — server CPU per turn at a large context: the long-lived response (only the new items cross
  the wire) against HTTP with the full history re-sent each turn (``http`` mode, SSE), same workload.
* ``stream`` — server CPU per streamed token (one ``output_text.delta`` each) against a bare starlette +
  uvicorn(wsproto) app sending a frame of the same size flat out (``await ws.send_text`` in a loop), and,
  at a paced rate, against what a process that only wakes once per decode step costs (per token).
* ``capacity`` — N long-lived streams at once, each ``--rate`` tok/s: every stream's achieved rate ÷
  configured, and the longest gap between two reads that carried deltas.
* ``rss`` — server RSS per suspended long-lived response, by context size (each context distinct).
* ``deflate`` — server CPU per token and bytes on the wire with permessage-deflate negotiated or not.
* ``topology`` — streams per second of the whole system: in process, one API worker in front of
  ``responses-lab engine``, two (this checkout's server only; ``proto/perf/topology.py``).
* ``engine`` — the mock GPU's step loop alone (no server), N sequences on one engine: the loop's CPU per
  step and the process's, as CPU time (``proto/perf/engine.py``), and the share of the due tokens taken.
* ``profile`` — self and inclusive shares of the py-spy stacks ``--profile DIR`` wrote.

Clients that only count (``stream``, ``capacity``, ``deflate`` off) read raw bytes and count frames by a
marker instead of parsing them: a Python WebSocket client parsing 100 k frames/s would be the bottleneck
on a 2-core box, not the server it measures. Every message the suite sends is built with
``proto.client.messages`` (``proto/perf/workload.py``), and the HTTP rollout of ``cpu`` is
``proto.client.http.HttpClient`` (SSE parsed by ``proto.client.sse``); the other clients keep their own
sockets where they time or count below what a library client exposes (pings between turns, a deflate
offer, raw bytes), and encode with ``json.dumps`` as they always have: the same frames on the wire.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from proto.helpfmt import HelpFormatter, apply

Command = Callable[[argparse.Namespace], None]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
    from proto.perf import engine, topology

    top = argparse.ArgumentParser(
        prog="responses-lab perf", description=__doc__, formatter_class=HelpFormatter
    )
    servers = top.add_argument_group("the servers measured")
    servers.add_argument("--server-path", default=None, help="run the server from this checkout (PYTHONPATH)")
    servers.add_argument(
        "--compare", default=None, metavar="DIR", help="also run the server from DIR first ('before')"
    )
    servers.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="run every server under py-spy (raw stacks in DIR; CPU figures then meaningless)",
    )
    servers.add_argument(
        "--flag", dest="flags", action="append", default=[], help="an extra `serve` flag (repeatable)"
    )
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("turn", help="per-turn overhead of a long-lived response against the ping floor")
    measured = p.add_argument_group("measurement")
    measured.add_argument(
        "--contexts", type=ints, default=[1000, 100_000], help="context sizes in tokens, comma list"
    )
    measured.add_argument("--turns", type=int, default=50, help="turns measured per context")
    measured.add_argument("--append", type=int, default=1000, help="tokens appended per turn")
    p = sub.add_parser("cpu", help="server CPU per turn: long-lived against HTTP with the full history")
    measured = p.add_argument_group("measurement")
    measured.add_argument("--context", type=int, default=100_000, help="context size in tokens")
    measured.add_argument("--turns", type=int, default=20, help="turns measured per transport")
    measured.add_argument("--append", type=int, default=1000, help="tokens appended per turn")
    p = sub.add_parser("stream", help="server CPU per streamed token against the bare stack's floor")
    measured = p.add_argument_group("measurement")
    server = p.add_argument_group("the server")
    measured.add_argument(
        "--tokens", type=int, default=16_000, help="per stream (the models' max output is 16 384)"
    )
    measured.add_argument("--streams", type=ints, default=[1, 32], help="concurrent streams, comma list")
    measured.add_argument(
        "--models",
        type=lambda s: s.split(","),
        default=["flat-out", "4000", "1000"],
        help="paces: flat-out or tok/s",
    )
    server.add_argument("--loop", default="asyncio", help="the server's event loop: asyncio or uvloop")
    p = sub.add_parser("capacity", help="N long-lived streams at once: achieved rate and gaps")
    measured = p.add_argument_group("measurement")
    server = p.add_argument_group("the server")
    contention = p.add_argument_group("a contended machine")
    measured.add_argument(
        "--streams",
        type=ints,
        default=[64, 96, 128, 160, 192, 256],
        help="levels of concurrent streams, comma list",
    )
    measured.add_argument("--rate", type=float, default=1000.0, help="each stream's pace in tokens/s")
    measured.add_argument("--seconds", type=float, default=8.0, help="how long each level runs")
    server.add_argument("--loop", default="asyncio", help="the server's event loop: asyncio or uvloop")
    contention.add_argument(
        "--tries", type=int, default=4, help="runs of a level at most, while the box is contended"
    )
    contention.add_argument(
        "--max-wait", type=float, default=0.05, help="the server's run-queue wait share a run may have"
    )
    p = sub.add_parser("rss", help="server RSS per suspended long-lived response, by context")
    measured = p.add_argument_group("measurement")
    measured.add_argument(
        "--contexts", type=ints, default=[1000, 10_000, 100_000], help="context sizes in tokens, comma list"
    )
    measured.add_argument("--count", type=int, default=12, help="suspended responses held per context")
    p = sub.add_parser(
        "deflate", help="server CPU per token and bytes per frame, permessage-deflate on or off"
    )
    measured = p.add_argument_group("measurement")
    measured.add_argument("--tokens", type=int, default=16_000, help="tokens per stream")
    measured.add_argument(
        "--rate", action="store_true", help="at the model's 4 000 tok/s instead of flat out"
    )
    p = sub.add_parser(
        "topology",
        help="streams per second: in process, behind an engine, two workers",
        description=topology.__doc__,
        formatter_class=HelpFormatter,
    )
    topology.add_arguments(p)
    p = sub.add_parser("engine", help="the mock GPU's step loop under N sequences: CPU per step, pace")
    engine.add_arguments(p)
    p = sub.add_parser("profile", help="summarise py-spy raw output written by --profile")
    p.add_argument("files", nargs="+", metavar="FILE", help="py-spy raw stacks (--profile DIR's files)")
    p.add_argument_group("output").add_argument("--top", type=int, default=40, help="frames listed")
    return apply(top)


def command(name: str) -> Command:
    """The subcommand's function, imported when it runs: ``--help`` loads no measurement."""
    if name in ("turn", "cpu"):
        from proto.perf import turns

        return turns.cmd_turn if name == "turn" else turns.cmd_cpu
    if name in ("stream", "deflate"):
        from proto.perf import streams

        return streams.cmd_stream if name == "stream" else streams.cmd_deflate
    if name == "capacity":
        from proto.perf.capacity import cmd_capacity

        return cmd_capacity
    if name == "rss":
        from proto.perf.rss import cmd_rss

        return cmd_rss
    if name == "engine":
        from proto.perf.engine import cmd_engine

        return cmd_engine
    if name == "topology":
        from proto.perf.topology import cmd_topology

        return cmd_topology
    from proto.perf.pyspy import cmd_profile

    return cmd_profile


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.profile:
        from proto.perf.servers import PROFILE

        Path(args.profile).mkdir(parents=True, exist_ok=True)
        PROFILE.append(args.profile)
    command(args.command)(args)
    return 0
