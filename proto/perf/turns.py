"""``perf turn`` (per-turn overhead against the ping floor) and ``perf cpu`` (server CPU per turn,
long-lived against HTTP with the full history re-sent)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
from websockets.asyncio.client import ClientConnection, connect

import proto.client.messages as messages
from proto.client.errors import ProtocolFailure
from proto.client.http import HttpClient
from proto.core.events import TERMINAL_TYPES
from proto.lab.analysis.metrics import percentile
from proto.perf.schedstat import thread_cpu_seconds
from proto.perf.servers import lab_server, servers
from proto.perf.workload import FAST, MODEL, TOOLS, filler, rollout_body, rollout_input, turn_script

# The server's own stages on the path from the append to the first delta (lab.turns[].phases_ms):
# scanning and tokenizing the appended items, and the mock GPU's clock waking late. engine_lookup runs
# inside the modelled prefill (it is on the path only where it outlasts it).
PATH_STAGES = ("safety", "render_tokenize", "clock_late")


@dataclass
class TurnRun:
    context: int
    overhead_ms: list[float] = field(default_factory=list)
    ping_ms: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms_per_turn: float = 0.0

    def add_turn(self, sent: float, first: float, report: dict[str, Any]) -> None:
        """A turn's overhead: append sent → first delta, minus the modelled prefill and queue wait."""
        self.overhead_ms.append((first - sent) * 1e3 - report["prefill_ms"] - report["queue_wait_ms"])
        for name, ms in report["phases_ms"].items():
            self.phases.setdefault(name, []).append(ms)


async def longlived_turns(
    url: str, context: int, turns: int, append: int, server: psutil.Process, pings: int = 3
) -> TurnRun:
    """One long-lived rollout of ``turns`` tool calls over a ``context``-token history, each answered with
    ``append`` tokens; ``pings`` WebSocket pings on the same connection before each append."""
    run = TurnRun(context)
    create = messages.create(rollout_body(turn_script(turns), context))
    output = filler(append)
    # A websockets connection of its own, its frames json.dumps's as they always were (proto.client.ws would
    # encode them compactly: other bytes on the wire, another figure than a before/after's earlier runs).
    async with connect(
        url + "?protocol=longlived", max_size=2**26, compression=None, ping_interval=None
    ) as ws:
        await ws.send(json.dumps(create))
        sent = first = cpu0 = 0.0
        turn = 0
        while True:
            event = json.loads(await ws.recv())
            kind = event["type"]
            if kind.endswith(".delta") and not first:
                first = time.perf_counter()
            if kind == "error":
                raise RuntimeError(event)
            if kind != "response.done" and kind not in TERMINAL_TYPES:
                continue
            if turn > 0:  # turn 0 is the create's (TTFT includes rendering the whole context once)
                run.add_turn(sent, first, event["response"]["lab"]["turns"][-1])
            if kind in TERMINAL_TYPES:
                run.cpu_ms_per_turn = (thread_cpu_seconds(server) - cpu0) * 1e3 / max(1, turn)
                return run
            run.ping_ms += await ping_times(ws, pings)
            if turn == 0:
                cpu0 = thread_cpu_seconds(server)
            data = json.dumps(messages.append(messages.outputs(event["pending_calls"], output)))
            first = 0.0
            sent = time.perf_counter()
            await ws.send(data)
            turn += 1


async def ping_times(ws: ClientConnection, pings: int) -> list[float]:
    """Round trips (ms) of ``pings`` WebSocket pings, one after the other (answered below the app)."""
    times = []
    for _ in range(pings):
        t0 = time.perf_counter()
        await (await ws.ping())
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def cmd_turn(args: argparse.Namespace) -> None:
    print(
        f"per-turn overhead: long-lived, {args.turns} turns of ~{args.append}-token appends, {MODEL} with a "
        f"1 ms prefill;"
    )
    print(
        "append sent → first delta − modelled prefill − queue wait, p50 over the turns; ping: WebSocket ping "
        "RTT on"
    )
    print(
        "the same connection before each append; rest = overhead − ping − safety − render_tokenize − "
        "clock_late"
    )
    print(
        f"{'server':<10}{'context':>9}{'overhead':>10}{'p90':>8}{'ping':>7}{'÷ping':>7}{'first10':>9}"
        f"{'last10':>8}"
        f"{'safety':>8}{'tokenize':>9}{'clock':>7}{'rest':>7}{'lookup':>8}{'CPU/turn':>10}"
    )
    for context in args.contexts:
        for label, path in servers(args):
            with lab_server(["--model-override", f"{MODEL}:{FAST}", *args.flags], path) as server:
                run = asyncio.run(
                    longlived_turns(server.ws_url, context, args.turns, args.append, server.process)
                )
            print(turn_row(label, run))


def turn_row(label: str, run: TurnRun) -> str:
    p50, ping = percentile(run.overhead_ms, 50), percentile(run.ping_ms, 50)
    stage = {name: percentile(run.phases.get(name, [0.0]), 50) for name in (*PATH_STAGES, "engine_lookup")}
    rest = p50 - ping - sum(stage[name] for name in PATH_STAGES)
    return (
        f"{label:<10}{run.context:>9}{p50:>8.3f}ms{percentile(run.overhead_ms, 90):>8.3f}{ping:>7.3f}"
        f"{p50 / ping:>7.1f}"
        f"{percentile(run.overhead_ms[:10], 50):>9.3f}{percentile(run.overhead_ms[-10:], 50):>8.3f}"
        f"{stage['safety']:>8.3f}"
        f"{stage['render_tokenize']:>9.3f}{stage['clock_late']:>7.3f}{rest:>7.3f}"
        f"{stage['engine_lookup']:>8.3f}"
        f"{run.cpu_ms_per_turn:>8.2f}ms"
    )


async def http_turns(http_url: str, context: int, turns: int, append: int, server: psutil.Process) -> float:
    """Server CPU per turn of an ``http`` rollout: the whole history re-sent every turn (SSE), the response's
    output items as they came and the calls' outputs appended to it."""
    history: list[Any] = rollout_input(turn_script(turns), context)
    output = filler(append)
    cpu0 = 0.0
    async with HttpClient(http_url) as client:
        for turn in range(turns + 1):
            if turn == 1:
                cpu0 = thread_cpu_seconds(server)
            response = await sse_response(client, messages.body(MODEL, history, TOOLS))
            calls = messages.function_calls(response)
            if not calls:
                break
            history += [*response["output"], *messages.outputs(calls, output)]
    return (thread_cpu_seconds(server) - cpu0) * 1e3 / turns


async def sse_response(client: HttpClient, body: dict[str, Any]) -> dict[str, Any]:
    """POST a streamed create; the response its terminal event carries. The body is read to its end, so the
    keep-alive connection goes back to the pool and every turn reuses it."""
    response: dict[str, Any] = {}
    async with client.stream(body) as events:
        async for event in events:
            if event.type == "error":
                raise ProtocolFailure(event.data.get("error") or {})
            if event.type in TERMINAL_TYPES:
                response = event.data["response"]
    return response


def cmd_cpu(args: argparse.Namespace) -> None:
    print(f"server CPU per turn at {args.context} tokens, ~{args.append}-token appends, {args.turns} turns")
    print(f"{'server':<10}{'long-lived':>12}{'HTTP full history':>19}{'ratio':>8}")
    for label, path in servers(args):
        flags = ["--model-override", f"{MODEL}:{FAST}", *args.flags]
        with lab_server(flags, path) as server:
            ll = asyncio.run(
                longlived_turns(server.ws_url, args.context, args.turns, args.append, server.process)
            ).cpu_ms_per_turn
        with lab_server(flags, path) as server:
            http = asyncio.run(
                http_turns(server.http_url, args.context, args.turns, args.append, server.process)
            )
        print(f"{label:<10}{ll:>10.2f}ms{http:>17.2f}ms{ll / http:>8.1%}")
