"""The hot path at the stack's floor: the measurements behind NOTES.md, "Issue 10", as commands anyone can rerun.

    .venv/bin/python scripts/hotpath.py turn      [--contexts 1000,100000] [--turns 50] [--append 1000]
    .venv/bin/python scripts/hotpath.py cpu       [--context 100000] [--turns 20]
    .venv/bin/python scripts/hotpath.py stream    [--tokens 16000] [--streams 1,32] [--models flat-out,4000,1000]
    .venv/bin/python scripts/hotpath.py capacity  [--streams 64,96,128,160] [--rate 1000] [--seconds 8]
    .venv/bin/python scripts/hotpath.py rss       [--contexts 1000,10000,100000] [--count 12]
    .venv/bin/python scripts/hotpath.py deflate   [--tokens 16000]

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

Clients that only count (``stream``, ``capacity``, ``deflate`` off) read raw bytes and count frames by a
marker instead of parsing them: a Python WebSocket client parsing 100 k frames/s would be the bottleneck
on a 2-core box, not the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from websockets.asyncio.client import ClientConnection, connect

from proto.core.events import TERMINAL_TYPES
from proto.processes import ChildServer
from proto.server.serve import free_port

MODEL = "mock-4000tps"
FAST = "prefill-overhead=1,prefill-time-per-token=0"  # a 1 ms prefill
TOOLS = [{"type": "function", "name": "grep"}]
# One token each with its leading space (sampler/tokens.py pads the model's output with the same words):
# a text of N of them is exactly N tokens.
WORDS = (" the", " code", " and", " then", " check", " file", " test", " we", " will", " run")


def filler(tokens: int, salt: int = 0) -> str:
    """Exactly ``tokens`` tokens of text; a different ``salt`` gives a different text (no shared KV prefix)."""
    return "".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(tokens)) if salt else "".join(WORDS[i % len(WORDS)] for i in range(tokens))


def sched_seconds(process: psutil.Process) -> tuple[float, float]:
    """(CPU time, run-queue wait) of the process's threads, to the ns: /proc/PID/task/*/schedstat's first
    two fields. The wait is time the server was ready to run but another process had the CPU — on a
    shared box, the share of a stall that is not the server's doing."""
    cpu = wait = 0
    for task in Path(f"/proc/{process.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            fields = (task / "schedstat").read_text().split()
            cpu += int(fields[0])
            wait += int(fields[1])
    return cpu / 1e9, wait / 1e9


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time the process's threads have used, to the ns (the scheduler's own count, summed over
    /proc/PID/task; psutil's is in 10 ms ticks). A thread that has exited is no longer counted: the servers
    here keep theirs (event loop, store writer and readers, ledger writer) for their whole life."""
    total = 0
    for task in Path(f"/proc/{process.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] if ordered else float("nan")


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---- servers ------------------------------------------------------------------------------------


PROFILE: list[str] = []  # --profile DIR: every server runs under py-spy, its raw stacks written there


@contextlib.contextmanager
def lab_server(flags: Sequence[str], server_path: str | None) -> Iterator[ChildServer]:
    """``responses-lab serve FLAGS`` in a child process, from ``server_path`` when given."""
    with ChildServer(["--log-level", "error", *flags], pythonpath=server_path) as server:
        if not PROFILE:
            yield server
            return
        # Attached once the server is up: start-up is not in the profile. --nonblocking: the server is not
        # paused per sample (its figures stay close to an unprofiled run's).
        out = Path(PROFILE[0]) / f"{time.strftime('%H%M%S')}-{server.port}.txt"
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking", "--rate", "1000",
                                "--format", "raw", "--output", str(out), "--pid", str(server.proc.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches
        try:
            yield server
        finally:
            spy.send_signal(signal.SIGINT)  # it writes its file and exits
            spy.wait(30)


# A delta event of the size ours have (a 24-hex item id, a one-token delta, a 5-digit sequence number).
FLOOR_FRAME = json.dumps({"type": "response.output_text.delta", "item_id": "msg_" + "0" * 24, "output_index": 0,
                          "content_index": 0, "delta": " the", "sequence_number": 12345}, separators=(",", ":"))


GO = {"type": "go"}  # what the floor app waits for before it streams


def _floor_serve(port: int, loop: str) -> None:
    """The stack's floor: starlette + uvicorn(wsproto), nothing else, sending one constant frame per
    ``await ws.send_text``: flat out, or paced at ``rate`` frames/s on the server's own clock (RealClock,
    absolute deadlines, every frame due at a wake-up sent then: the engine's pacing without the engine)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    from sampler.clock import RealClock

    async def stream(ws: WebSocket) -> None:
        await ws.accept()
        await ws.receive_text()  # go: every connection is open before any stream starts
        n = int(ws.query_params["n"])
        rate = float(ws.query_params.get("rate", 0))
        text = FLOOR_FRAME
        if rate:
            clock = RealClock()
            start, sent = clock.now(), 0
            while sent < n:
                await clock.sleep_until(start + sent / rate)
                due = min(n, int((clock.now() - start) * rate) + 1)
                for _ in range(sent, due):
                    await ws.send_text(text)
                sent = due
        else:
            for _ in range(n):
                await ws.send_text(text)
        await ws.send_text('{"type":"response.completed"}')
        with contextlib.suppress(Exception):
            await ws.receive()  # the client closes

    app = Starlette(routes=[WebSocketRoute("/floor", stream)])
    uvicorn.run(app, host="127.0.0.1", port=port, ws="wsproto", loop=loop, ws_per_message_deflate=False,
                ws_ping_interval=None, log_level="error", lifespan="off")


@contextlib.contextmanager
def floor_server(loop: str) -> Iterator[tuple[int, psutil.Process]]:
    port = free_port()
    child = multiprocessing.get_context("spawn").Process(target=_floor_serve, args=(port, loop), daemon=True)
    child.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with contextlib.closing(__import__("socket").create_connection(("127.0.0.1", port), 0.2)):
                    break
            except OSError:
                if time.monotonic() > deadline or not child.is_alive():
                    raise
                time.sleep(0.05)
        assert child.pid is not None
        yield port, psutil.Process(child.pid)
    finally:
        child.terminate()
        child.join(10)


# ---- a counting client: raw bytes, frames counted by marker ---------------------------------------


def client_frame(payload: bytes) -> bytes:
    """One masked text frame (RFC 6455 §5.3: a client masks every frame)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    key = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")
    return head + mask + masked


DELTA = b'.delta"'  # in every *.delta event's type, in no other event of these streams
END = b'"response.completed"'
ENDS = (END, b'"response.incomplete"', b'"response.failed"')  # a stream that did not complete ends too (an error)


class Counting(asyncio.Protocol):
    """A WebSocket connection whose server frames are counted, never parsed: the time of every read that
    carried deltas, and how many it carried. Server frames are unmasked and (deflate declined) plain text."""

    def __init__(self, path: str, port: int) -> None:
        self.request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._head = b""
        self._tail = b""
        self.reads: list[tuple[float, int]] = []  # (perf_counter, deltas in that read)
        self.bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.opened.done():
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self._head.startswith(b"HTTP/1.1 101"):
                self.opened.set_exception(RuntimeError(self._head[:200].decode(errors="replace")))
                return
            data, self._head = self._head[end + 4 :], b""
            self.opened.set_result(None)
            if not data:
                return
        self.bytes += len(data)
        chunk = self._tail + data
        n = chunk.count(DELTA)
        if n:
            self.reads.append((now, n))
        if not self.ended.done():
            for end in ENDS:
                if end in chunk:
                    if end is END:
                        self.ended.set_result(None)
                    else:
                        self.ended.set_exception(RuntimeError(f"the stream ended {end.decode()}"))
                    break
        self._tail = chunk[-(max(map(len, ENDS)) - 1) :]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_exception(exc or ConnectionError("closed before the end marker"))

    def send(self, event: dict[str, Any]) -> None:
        assert self.transport is not None
        self.transport.write(client_frame(json.dumps(event).encode()))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.write(struct.pack("!BB", 0x88, 0x80) + os.urandom(4))
            self.transport.close()

    @property
    def deltas(self) -> int:
        return sum(n for _, n in self.reads)

    def rate(self) -> float:
        """Deltas per second between the first read that carried one and the last."""
        if len(self.reads) < 2:
            return 0.0
        return (self.deltas - self.reads[0][1]) / (self.reads[-1][0] - self.reads[0][0])

    def max_gap_ms(self) -> float:
        times = [t for t, _ in self.reads]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0) * 1e3


async def counting(port: int, path: str) -> Counting:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: Counting(path, port), "127.0.0.1", port)
    await proto.opened
    return proto


def say_tokens(tokens: int) -> dict[str, Any]:
    return {"type": "response.create", "model": MODEL, "input": f"stream\n!tokens {tokens} !say go"}


# ---- turn: per-turn overhead against the ping floor -----------------------------------------------


@dataclass
class TurnRun:
    context: int
    overhead_ms: list[float] = field(default_factory=list)
    ping_ms: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms_per_turn: float = 0.0


def turn_script(turns: int) -> str:
    return "\n".join(["Work on the repository.", *(f'!call grep {{"turn": {k}}}' for k in range(turns)), "!say done"])


async def longlived_turns(url: str, context: int, turns: int, append: int, server: psutil.Process, pings: int = 3) -> TurnRun:
    run = TurnRun(context)
    create = {"type": "response.create", "model": MODEL, "tools": TOOLS,
              "input": [{"role": "user", "content": turn_script(turns)}, {"role": "user", "content": filler(context)}]}
    output = filler(append)
    async with connect(url + "?protocol=longlived", max_size=2**26, compression=None, ping_interval=None) as ws:
        await ws.send(json.dumps(create))
        sent = first = 0.0
        cpu0 = 0.0
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
            reports = event["response"]["lab"]["turns"]
            if turn > 0:  # turn 0 is the create's (TTFT includes rendering the whole context once)
                report = reports[-1]
                run.overhead_ms.append((first - sent) * 1e3 - report["prefill_ms"] - report["queue_wait_ms"])
                for name, ms in report["phases_ms"].items():
                    run.phases.setdefault(name, []).append(ms)
            if kind in TERMINAL_TYPES:
                run.cpu_ms_per_turn = (cpu_seconds(server) - cpu0) * 1e3 / max(1, turn)
                return run
            for _ in range(pings):
                t0 = time.perf_counter()
                await (await ws.ping())
                run.ping_ms.append((time.perf_counter() - t0) * 1e3)
            if turn == 0:
                cpu0 = cpu_seconds(server)
            calls = event["pending_calls"]
            outputs = [{"type": "function_call_output", "call_id": c["call_id"], "output": output} for c in calls]
            data = json.dumps({"type": "response.append", "input": outputs})
            first = 0.0
            sent = time.perf_counter()
            await ws.send(data)
            turn += 1


# The server's own stages on the path from the append to the first delta (lab.turns[].phases_ms):
# scanning and tokenizing the appended items, and the mock GPU's clock waking late. engine_lookup runs
# inside the modelled prefill (it is on the path only where it outlasts it).
PATH_STAGES = ("safety", "render_tokenize", "clock_late")


def cmd_turn(args: argparse.Namespace) -> None:
    print(f"per-turn overhead: long-lived, {args.turns} turns of ~{args.append}-token appends, {MODEL} with a 1 ms prefill;")
    print("append sent → first delta − modelled prefill − queue wait, p50 over the turns; ping: WebSocket ping RTT on")
    print("the same connection before each append; rest = overhead − ping − safety − render_tokenize − clock_late")
    print(f"{'server':<10}{'context':>9}{'overhead':>10}{'p90':>8}{'ping':>7}{'÷ping':>7}{'first10':>9}{'last10':>8}"
          f"{'safety':>8}{'tokenize':>9}{'clock':>7}{'rest':>7}{'lookup':>8}{'CPU/turn':>10}")
    for context in args.contexts:
        for label, path in servers(args):
            with lab_server(["--model-override", f"{MODEL}:{FAST}", *args.flags], path) as server:
                run = asyncio.run(longlived_turns(server.ws_url, context, args.turns, args.append, server.process))
            p50, ping = med(run.overhead_ms), med(run.ping_ms)
            stage = {name: med(run.phases.get(name, [0.0])) for name in (*PATH_STAGES, "engine_lookup")}
            rest = p50 - ping - sum(stage[name] for name in PATH_STAGES)
            print(f"{label:<10}{context:>9}{p50:>8.3f}ms{pct(run.overhead_ms, 90):>8.3f}{ping:>7.3f}{p50 / ping:>7.1f}"
                  f"{med(run.overhead_ms[:10]):>9.3f}{med(run.overhead_ms[-10:]):>8.3f}{stage['safety']:>8.3f}"
                  f"{stage['render_tokenize']:>9.3f}{stage['clock_late']:>7.3f}{rest:>7.3f}{stage['engine_lookup']:>8.3f}"
                  f"{run.cpu_ms_per_turn:>8.2f}ms")


# ---- cpu: long-lived vs HTTP full history ----------------------------------------------------------


async def http_turns(http_url: str, context: int, turns: int, append: int, server: psutil.Process) -> float:
    """Server CPU per turn of an ``http`` rollout: the whole history re-sent every turn (SSE)."""
    history: list[Any] = [{"role": "user", "content": turn_script(turns)}, {"role": "user", "content": filler(context)}]
    output = filler(append)
    cpu0 = 0.0
    async with httpx.AsyncClient(base_url=http_url, timeout=600) as client:
        for turn in range(turns + 1):
            if turn == 1:
                cpu0 = cpu_seconds(server)
            body = {"model": MODEL, "tools": TOOLS, "input": history, "stream": True}
            response: dict[str, Any] = {}
            async with client.stream("POST", "/v1/responses", json=body) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        if event.get("type") in TERMINAL_TYPES:
                            response = event["response"]
            calls = [item for item in response["output"] if item["type"] == "function_call"]
            if not calls:
                break
            history += [*response["output"], *({"type": "function_call_output", "call_id": c["call_id"], "output": output} for c in calls)]
    return (cpu_seconds(server) - cpu0) * 1e3 / turns


def cmd_cpu(args: argparse.Namespace) -> None:
    print(f"server CPU per turn at {args.context} tokens, ~{args.append}-token appends, {args.turns} turns")
    print(f"{'server':<10}{'long-lived':>12}{'HTTP full history':>19}{'ratio':>8}")
    for label, path in servers(args):
        flags = ["--model-override", f"{MODEL}:{FAST}", *args.flags]
        with lab_server(flags, path) as server:
            ll = asyncio.run(longlived_turns(server.ws_url, args.context, args.turns, args.append, server.process)).cpu_ms_per_turn
        with lab_server(flags, path) as server:
            http = asyncio.run(http_turns(server.http_url, args.context, args.turns, args.append, server.process))
        print(f"{label:<10}{ll:>10.2f}ms{http:>17.2f}ms{ll / http:>8.1%}")


# ---- stream: server CPU per token against the bare stack's floor ------------------------------------


async def count_streams(port: int, path: str, first: dict[str, Any] | None, streams: int, process: psutil.Process) -> tuple[float, int, float]:
    """``streams`` counting connections at once; returns (server CPU s, deltas, wall s)."""
    conns = [await counting(port, path) for _ in range(streams)]
    cpu0, t0 = cpu_seconds(process), time.perf_counter()
    for conn in conns:
        if first is not None:
            conn.send(first)
    await asyncio.gather(*(c.ended for c in conns))
    cpu, wall = cpu_seconds(process) - cpu0, time.perf_counter() - t0
    for conn in conns:
        conn.close()
    return cpu, sum(c.deltas for c in conns), wall


def _idle_wakes(period: float, n: int, out: Any) -> None:
    """A process that does nothing but sleep on the clock, ``n`` times ``period`` apart: its CPU per wake-up."""
    from sampler.clock import RealClock

    async def main() -> float:
        clock = RealClock()
        t0, c0 = clock.now(), cpu_seconds(psutil.Process())
        for i in range(n):
            await clock.sleep_until(t0 + (i + 1) * period)
        return (cpu_seconds(psutil.Process()) - c0) / n

    out.send(asyncio.run(main()))


def idle_wake_us(period: float, n: int = 3000) -> float:
    """CPU µs a wake-up costs a process that only sleeps on the timerfd clock, ``period`` apart (in a child):
    what any paced sender pays per decode step before it sends anything."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_idle_wakes, args=(period, n, theirs), daemon=True)
    child.start()
    try:
        return float(mine.recv()) * 1e6
    finally:
        child.join(10)


def cmd_stream(args: argparse.Namespace) -> None:
    loop = args.loop
    print(f"server CPU per streamed token (one delta event each), {args.tokens} tokens per stream, loop {loop};")
    print("floor: a bare starlette+uvicorn(wsproto) app, one `await ws.send_text` per frame of the same size, at the")
    print("same pace and number of streams (flat out: as fast as it goes; else paced on the same timerfd clock);")
    print("wake: the CPU of a process that only wakes once per decode step (1 / pace) on that clock, ÷ streams")
    print(f"{'server':<10}{'pace':<12}{'streams':>8}{'µs/token':>10}{'floor µs':>10}{'ratio':>8}{'wake µs':>9}{'tok/s':>11}")
    wakes: dict[str, float] = {}
    for pace, streams in [(m, s) for m in args.models for s in args.streams]:
        query = f"n={args.tokens}" + ("" if pace == "flat-out" else f"&rate={pace}")
        with floor_server(loop) as (port, process):
            asyncio.run(count_streams(port, "/floor?n=2000", GO, 2, process))  # warm-up
            cpu, frames, _ = asyncio.run(count_streams(port, f"/floor?{query}", GO, streams, process))
        floor = cpu / frames * 1e6
        if pace != "flat-out" and pace not in wakes:
            wakes[pace] = idle_wake_us(1.0 / float(pace))  # once per pace: it does not depend on the streams
        wake = "—" if pace == "flat-out" else f"{wakes[pace] / streams:.2f}"
        for label, path in servers(args):
            rate = "inter-token-latency=0.001," if pace == "flat-out" else f"tokens-per-second={pace},"
            flags = ["--model-override", f"{MODEL}:{rate}{FAST},time-factor-under-load=1", "--loop", loop, *args.flags]
            with lab_server(flags, path) as server:
                asyncio.run(count_streams(server.port, "/v1/responses?protocol=longlived", say_tokens(2000), 2, server.process))
                cpu, tokens, wall = asyncio.run(count_streams(server.port, "/v1/responses?protocol=longlived", say_tokens(args.tokens), streams, server.process))
            us = cpu / tokens * 1e6
            name = pace if pace == "flat-out" else f"{pace} tok/s"
            print(f"{label:<10}{name:<12}{streams:>8}{us:>10.2f}{floor:>10.2f}{us / floor:>7.2f}×{wake:>9}{tokens / wall:>11,.0f}")


# ---- capacity: N streams × rate ------------------------------------------------------------------------


def cmd_capacity(args: argparse.Namespace) -> None:
    tokens = int(args.rate * args.seconds)
    print(f"capacity: N long-lived streams × {args.rate:.0f} tok/s ({tokens} tokens each, time-factor-under-load=1), loop {args.loop}")
    print("rates and gaps over the window in which every stream runs; CPU and run-queue wait: the server's share of")
    print("the wall time on a CPU, and ready but waiting for one (another process had it); µs/token = CPU / tokens")
    print(f"{'server':<10}{'streams':>8}{'min rate':>10}{'p50 rate':>10}{'≥99 %':>8}{'max gap':>10}{'p99 gap':>9}{'CPU':>10}{'runq wait':>10}{'µs/token':>10}{'tries':>6}")
    for streams in args.streams:  # before and this side by side at each level: the box's load drifts
        for label, path in servers(args):
            flags = ["--model-override", f"{MODEL}:tokens-per-second={args.rate},time-factor-under-load=1,{FAST}", "--loop", args.loop, *args.flags]
            # The box is shared: a level is run again (up to --tries times) while the server waited for a CPU
            # more than --max-wait of the window (another process had the core); the least contended run is shown.
            runs = []
            for _ in range(args.tries):
                with lab_server(flags, path) as server:
                    runs.append(asyncio.run(capacity_once(server, streams, tokens, args.rate)))
                if runs[-1][3] <= args.max_wait:
                    break
            ratios, gaps, cpu, waited = min(runs, key=lambda run: run[3])
            ok = sum(r >= 0.99 for r in ratios)
            print(f"{label:<10}{streams:>8}{min(ratios):>9.1%}{med(ratios):>10.1%}{ok:>5}/{streams:<3}{max(gaps):>8.1f}ms"
                  f"{pct(gaps, 99):>7.1f}ms{cpu:>10.0%}{waited:>10.0%}{cpu / (streams * args.rate) * 1e6:>10.2f}{len(runs):>6}")


async def capacity_once(server: ChildServer, streams: int, tokens: int, rate: float) -> tuple[list[float], list[float], float, float]:
    """Every stream's rate ÷ ``rate`` and its longest gap, over the window in which *all* streams ran
    (from the last stream's first delta to the first stream's last): the start-up ramp and the tail
    where streams end together are not the steady state the sweep asks about."""
    conns = [await counting(server.port, "/v1/responses?protocol=longlived") for _ in range(streams)]
    samples: list[tuple[float, float, float]] = []  # (time, server CPU s, server run-queue wait s), every 50 ms

    async def sample_cpu() -> None:
        while True:
            samples.append((time.perf_counter(), *sched_seconds(server.process)))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample_cpu())
    for i, conn in enumerate(conns):
        conn.send(say_tokens(tokens))
        if i % 16 == 15:
            await asyncio.sleep(0.002)  # staggered a little, as real arrivals are
    await asyncio.gather(*(c.ended for c in conns))
    sampler.cancel()
    for conn in conns:
        conn.close()
    start = max(c.reads[0][0] for c in conns)
    end = min(c.reads[-1][0] for c in conns)
    if end - start < 1.0:
        raise RuntimeError(f"the streams overlapped for only {end - start:.2f} s: raise --seconds")
    ratios, gaps = [], []
    for conn in conns:
        inside = [(t, n) for t, n in conn.reads if start <= t <= end]
        before = [t for t, _ in conn.reads if t < start]
        times = ([before[-1]] if before else []) + [t for t, _ in inside]
        ratios.append(sum(n for _, n in inside) / (end - start) / rate)
        gaps.append(max(b - a for a, b in itertools.pairwise(times)) * 1e3)
    inside = [sample for sample in samples if start <= sample[0] <= end]
    span = inside[-1][0] - inside[0][0]
    return ratios, gaps, (inside[-1][1] - inside[0][1]) / span, (inside[-1][2] - inside[0][2]) / span


# ---- rss: per suspended response by context ---------------------------------------------------------------


async def suspend_one(url: str, context: int, salt: int) -> ClientConnection:
    ws = await connect(url + "?protocol=longlived", max_size=2**26, compression=None, ping_interval=None)
    script = f"Hold {salt}.\n!call grep {{}}\n!say done"
    await ws.send(json.dumps({"type": "response.create", "model": MODEL, "tools": TOOLS,
                              "input": [{"role": "user", "content": script}, {"role": "user", "content": filler(context, salt)}]}))
    while (kind := json.loads(await ws.recv())["type"]) != "response.done":
        if kind == "error" or kind in TERMINAL_TYPES:
            raise RuntimeError(kind)
    return ws


async def rss_once(server: ChildServer, context: int, count: int) -> tuple[float, float]:
    """RSS per response over the first ``count`` held at once, and per response over ``count`` more."""
    warm = [await suspend_one(server.ws_url, context, 10_000 + k) for k in range(2)]
    for ws in warm:
        await ws.close()
    await asyncio.sleep(0.5)
    rss = [server.process.memory_info().rss]
    held: list[ClientConnection] = []
    for wave in range(2):
        held += [await suspend_one(server.ws_url, context, wave * count + k + 1) for k in range(count)]
        await asyncio.sleep(0.5)
        rss.append(server.process.memory_info().rss)
    for ws in held:
        await ws.close()
    return (rss[1] - rss[0]) / count, (rss[2] - rss[1]) / count


def cmd_rss(args: argparse.Namespace) -> None:
    print(f"server RSS per suspended long-lived response, each context distinct: the first {args.count} held at once,")
    print(f"then {args.count} more. The mock GPU's KV pool (30 000 blocks of 16 tokens) is shared and bounded: once")
    print("it is full a response pins nothing more, so the second figure is what a response itself holds")
    print(f"{'server':<10}{'context':>9}{'first':>12}{'B/token':>9}{'next':>12}{'B/token':>9}")
    for label, path in servers(args):
        for context in args.contexts:
            with lab_server(["--model-override", f"{MODEL}:{FAST}", *args.flags], path) as server:
                first, more = asyncio.run(rss_once(server, context, args.count))
            print(f"{label:<10}{context:>9}{first / 2**20:>10.3f}MB{first / context:>9.1f}{more / 2**20:>10.3f}MB{more / context:>9.1f}")


# ---- deflate ---------------------------------------------------------------------------------------------


async def deflate_once(url: str, tokens: int, compression: str | None, process: psutil.Process) -> tuple[float, float]:
    """Server CPU per token and wire bytes per server frame (counted where the client's websockets
    protocol is fed the socket's bytes: headers and compression included)."""
    async with connect(url + "?protocol=longlived", compression=compression, ping_interval=None, max_size=2**24) as ws:
        received = [0]
        feed = ws.protocol.receive_data

        def counted(data: bytes) -> None:
            received[0] += len(data)
            feed(data)

        ws.protocol.receive_data = counted  # type: ignore[method-assign]
        await ws.send(json.dumps(say_tokens(200)))
        while json.loads(await ws.recv())["type"] not in TERMINAL_TYPES:
            pass
        cpu0, bytes0 = cpu_seconds(process), received[0]
        await ws.send(json.dumps(say_tokens(tokens)))
        n = 1
        while json.loads(await ws.recv())["type"] not in TERMINAL_TYPES:
            n += 1
        return (cpu_seconds(process) - cpu0) / tokens * 1e6, (received[0] - bytes0) / n


def cmd_deflate(args: argparse.Namespace) -> None:
    rate = "4000 tok/s" if args.rate else "flat out (the model at 10⁶ tok/s: the server and the client set the pace)"
    print(f"permessage-deflate: the websockets client's default offer, one stream of {args.tokens} tokens, {rate}")
    print(f"{'server':<10}{'server':<36}{'client offers':<15}{'µs/token':>10}{'bytes/frame':>16}")
    for label, path in servers(args):
        # This branch has --ws-per-message-deflate (off by default); an older server has uvicorn's default (accept).
        choices = [("accepts (--ws-per-message-deflate)", ["--ws-per-message-deflate"]), ("declines (default)", [])]
        if label == "before":
            choices = [("accepts (uvicorn's default)", [])]
        for name, extra in choices:
            knobs = FAST if args.rate else f"inter-token-latency=0.001,{FAST}"
            flags = ["--model-override", f"{MODEL}:{knobs}", *extra, *args.flags]
            with lab_server(flags, path) as server:
                for offer in ("deflate", None):
                    us, per_frame = asyncio.run(deflate_once(server.ws_url, args.tokens, offer, server.process))
                    print(f"{label:<10}{name:<36}{offer or 'nothing':<15}{us:>10.2f}{per_frame:>16.1f}")


# ---- profile: what a py-spy run spent its samples on --------------------------------------------------------


def cmd_profile(args: argparse.Namespace) -> None:
    """Self and inclusive shares of py-spy's raw (collapsed) stacks, the event loop's idle wait left out."""
    selfs: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for path in args.files:
        for line in Path(path).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
                      for f in stack.split(";")]
            if not frames or any(f.startswith(("select (", "poll (", "_run_once (selectors")) for f in frames[-1:]):
                continue
            n = int(count)
            total += n
            selfs[frames[-1]] = selfs.get(frames[-1], 0) + n
            for f in set(frames):
                incl[f] = incl.get(f, 0) + n
    print(f"{total} busy samples")
    for title, table in (("self", selfs), ("inclusive", incl)):
        print(f"-- {title}")
        for name, n in sorted(table.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{n / total:7.1%}  {name}")


# ---- the command line --------------------------------------------------------------------------------------


def servers(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    pairs: list[tuple[str, str | None]] = []
    if args.compare:
        pairs.append(("before", args.compare))
    pairs.append(("this" if args.compare or not args.server_path else "other", args.server_path))
    return pairs


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server-path", default=None, help="run the server from this checkout (PYTHONPATH)")
    parser.add_argument("--compare", default=None, metavar="DIR", help="also run the server from DIR first ('before')")
    parser.add_argument("--profile", default=None, metavar="DIR", help="run every server under py-spy (raw stacks in DIR; CPU figures then meaningless)")
    parser.add_argument("--flag", dest="flags", action="append", default=[], help="an extra `serve` flag (repeatable)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("turn")
    p.add_argument("--contexts", type=ints, default=[1000, 100_000])
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--append", type=int, default=1000)
    p = sub.add_parser("cpu")
    p.add_argument("--context", type=int, default=100_000)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--append", type=int, default=1000)
    p = sub.add_parser("stream")
    p.add_argument("--tokens", type=int, default=16_000, help="per stream (the models' max output is 16 384)")
    p.add_argument("--streams", type=ints, default=[1, 32])
    p.add_argument("--models", type=lambda s: s.split(","), default=["flat-out", "4000", "1000"], help="paces: flat-out or tok/s")
    p.add_argument("--loop", default="asyncio")
    p = sub.add_parser("capacity")
    p.add_argument("--streams", type=ints, default=[64, 96, 128, 160, 192, 256])
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--loop", default="asyncio")
    p.add_argument("--tries", type=int, default=4, help="runs of a level at most, while the box is contended")
    p.add_argument("--max-wait", type=float, default=0.05, help="the server's run-queue wait share a run may have")
    p = sub.add_parser("rss")
    p.add_argument("--contexts", type=ints, default=[1000, 10_000, 100_000])
    p.add_argument("--count", type=int, default=12)
    p = sub.add_parser("deflate")
    p.add_argument("--tokens", type=int, default=16_000)
    p.add_argument("--rate", action="store_true", help="at the model's 4 000 tok/s instead of flat out")
    p = sub.add_parser("profile", help="summarise py-spy raw output written by --profile")
    p.add_argument("files", nargs="+")
    p.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        PROFILE.append(args.profile)
    {"turn": cmd_turn, "cpu": cmd_cpu, "stream": cmd_stream, "capacity": cmd_capacity, "rss": cmd_rss, "deflate": cmd_deflate, "profile": cmd_profile}[args.command](args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
