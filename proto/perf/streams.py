"""``perf stream`` (server CPU per streamed token against the bare stack's floor and the cost of waking once
per decode step) and ``perf deflate`` (the same with permessage-deflate negotiated or not)."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
from multiprocessing.connection import Connection

import psutil
from websockets.asyncio.client import connect

from proto.core.events import TERMINAL_TYPES
from proto.perf.counting import count_streams
from proto.perf.schedstat import thread_cpu_seconds
from proto.perf.servers import GO, floor_server, lab_server, servers
from proto.perf.workload import FAST, MODEL, say_tokens

LONGLIVED = "/v1/responses?protocol=longlived"


def _idle_wakes(period: float, n: int, out: Connection) -> None:
    """A process that does nothing but sleep on the clock, ``n`` times ``period`` apart: its CPU per
    wake-up."""
    from sampler.clock import RealClock

    async def main() -> float:
        clock = RealClock()
        t0, c0 = clock.now(), thread_cpu_seconds(psutil.Process())
        for i in range(n):
            await clock.sleep_until(t0 + (i + 1) * period)
        return (thread_cpu_seconds(psutil.Process()) - c0) / n

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


def floor_us_per_frame(loop: str, tokens: int, pace: str, streams: int) -> float:
    """The floor app's CPU per frame at that pace and number of streams (after a short warm-up)."""
    query = f"n={tokens}" + ("" if pace == "flat-out" else f"&rate={pace}")
    with floor_server(loop) as (port, process):
        asyncio.run(count_streams(port, "/floor?n=2000", GO, 2, process))  # warm-up
        cpu, frames, _ = asyncio.run(count_streams(port, f"/floor?{query}", GO, streams, process))
    return cpu / frames * 1e6


def cmd_stream(args: argparse.Namespace) -> None:
    loop = args.loop
    print(
        f"server CPU per streamed token (one delta event each), {args.tokens} tokens per stream, loop {loop};"
    )
    print(
        "floor: a bare starlette+uvicorn(wsproto) app, one `await ws.send_text` per frame of the same size, "
        "at the"
    )
    print(
        "same pace and number of streams (flat out: as fast as it goes; else paced on the same timerfd "
        "clock);"
    )
    print(
        "wake: the CPU of a process that only wakes once per decode step (1 / pace) on that clock, ÷ streams"
    )
    print(
        f"{'server':<10}{'pace':<12}{'streams':>8}{'µs/token':>10}{'floor µs':>10}{'ratio':>8}{'wake µs':>9}"
        f"{'tok/s':>11}"
    )
    wakes: dict[str, float] = {}
    for pace, streams in [(m, s) for m in args.models for s in args.streams]:
        floor = floor_us_per_frame(loop, args.tokens, pace, streams)
        if pace != "flat-out" and pace not in wakes:
            wakes[pace] = idle_wake_us(1.0 / float(pace))  # once per pace: it does not depend on the streams
        wake = "—" if pace == "flat-out" else f"{wakes[pace] / streams:.2f}"
        for label, path in servers(args):
            rate = "inter-token-latency=0.001," if pace == "flat-out" else f"tokens-per-second={pace},"
            flags = [
                "--model-override",
                f"{MODEL}:{rate}{FAST},time-factor-under-load=1",
                "--loop",
                loop,
                *args.flags,
            ]
            with lab_server(flags, path) as server:
                asyncio.run(count_streams(server.port, LONGLIVED, say_tokens(2000), 2, server.process))
                cpu, tokens, wall = asyncio.run(
                    count_streams(server.port, LONGLIVED, say_tokens(args.tokens), streams, server.process)
                )
            us = cpu / tokens * 1e6
            name = pace if pace == "flat-out" else f"{pace} tok/s"
            print(
                f"{label:<10}{name:<12}{streams:>8}{us:>10.2f}{floor:>10.2f}{us / floor:>7.2f}×{wake:>9}"
                f"{tokens / wall:>11,.0f}"
            )


async def deflate_once(
    url: str, tokens: int, compression: str | None, process: psutil.Process
) -> tuple[float, float]:
    """Server CPU per token and wire bytes per server frame (counted where the client's websockets
    protocol is fed the socket's bytes: headers and compression included)."""
    async with connect(
        url + "?protocol=longlived", compression=compression, ping_interval=None, max_size=2**24
    ) as ws:
        received = [0]
        feed = ws.protocol.receive_data

        def counted(data: bytes | bytearray) -> None:
            received[0] += len(data)
            feed(data)

        ws.protocol.receive_data = counted  # type: ignore[method-assign]
        await ws.send(json.dumps(say_tokens(200)))
        while json.loads(await ws.recv())["type"] not in TERMINAL_TYPES:
            pass
        cpu0, bytes0 = thread_cpu_seconds(process), received[0]
        await ws.send(json.dumps(say_tokens(tokens)))
        n = 1
        while json.loads(await ws.recv())["type"] not in TERMINAL_TYPES:
            n += 1
        return (thread_cpu_seconds(process) - cpu0) / tokens * 1e6, (received[0] - bytes0) / n


def cmd_deflate(args: argparse.Namespace) -> None:
    rate = (
        "4000 tok/s"
        if args.rate
        else "flat out (the model at 10⁶ tok/s: the server and the client set the pace)"
    )
    print(
        f"permessage-deflate: the websockets client's default offer, one stream of {args.tokens} tokens, "
        f"{rate}"
    )
    print(f"{'server':<10}{'server':<36}{'client offers':<15}{'µs/token':>10}{'bytes/frame':>16}")
    for label, path in servers(args):
        # This checkout has --ws-per-message-deflate (off by default); an older server has uvicorn's default
        # (accept).
        choices = [
            ("accepts (--ws-per-message-deflate)", ["--ws-per-message-deflate"]),
            ("declines (default)", []),
        ]
        if label == "before":
            choices = [("accepts (uvicorn's default)", [])]
        for name, extra in choices:
            knobs = FAST if args.rate else f"inter-token-latency=0.001,{FAST}"
            flags = ["--model-override", f"{MODEL}:{knobs}", *extra, *args.flags]
            with lab_server(flags, path) as server:
                for offer in ("deflate", None):
                    us, per_frame = asyncio.run(
                        deflate_once(server.ws_url, args.tokens, offer, server.process)
                    )
                    print(f"{label:<10}{name:<36}{offer or 'nothing':<15}{us:>10.2f}{per_frame:>16.1f}")
