"""``perf topology``: capacity of the whole system against its topology, streams per second, in one run.

Three topologies, started one after another on free loopback ports: the mock GPU in the API process
(``serve``), one API worker in front of ``responses-lab engine`` (``serve --engine URL``), and two
(``serve --workers 2 --engine URL``). Against each, C closed-loop long-lived clients (one process, this
one) each run back-to-back responses of ``--tokens`` tokens (``!tokens N !say``) for ``--seconds``; a
stream is one such response, create to ``response.completed``. Per cell: completed streams per second,
tokens per second delivered against the model's nominal rate, and the CPU seconds each process used per
stream (psutil: the API workers, the engine, this load generator).

On paper beyond this machine: with each API worker and the engine on a core of its own, N workers carry
at most ``min(N / api_cpu_per_stream, 1 / engine_cpu_per_stream)`` streams per second (each process is
one event loop: one core is its ceiling). The command prints that bound from the costs measured at the
highest concurrency. On 2 cores the measured figures are bounded by the cores: the workers, the engine and
the load generator share them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import connect

import proto.client.messages as messages
from proto.lab.analysis.metrics import percentile
from proto.perf.workload import FAST, MODEL, stream_body
from proto.processes import ChildEngine, ChildServer, cpu_seconds

OVERRIDE = f"{MODEL}:{FAST}"  # 1 ms prefill: decoding dominates
TOPOLOGIES = (("in-process", 1, False), ("engine+1 worker", 1, True), ("engine+2 workers", 2, True))


@dataclass
class Cell:
    topology: str
    concurrency: int
    streams: int
    seconds: float
    streams_per_s: float
    tokens_per_s: float
    nominal_tokens_per_s: float  # what the streams in flight would get at the model's rate
    api_cpu_ms_per_stream: float
    engine_cpu_ms_per_stream: float
    client_cpu_ms_per_stream: float
    ttft_ms_p50: float

    def line(self) -> str:
        return (
            f"{self.topology:17} C={self.concurrency:3}  {self.streams_per_s:7.1f} streams/s  "
            f"{self.tokens_per_s:9.0f} tok/s "
            f"(nominal {self.nominal_tokens_per_s:9.0f})  CPU ms/stream api "
            f"{self.api_cpu_ms_per_stream:5.2f} "
            f"engine {self.engine_cpu_ms_per_stream:5.2f} client {self.client_cpu_ms_per_stream:5.2f}  "
            f"TTFT p50 {self.ttft_ms_p50:6.2f} ms"
        )


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def client(url: str, tokens: int, stop_at: float, ttfts: list[float]) -> int:
    """Back-to-back responses on one long-lived connection until ``stop_at``; returns how many completed.
    Frames are only scanned for the two event types that matter (the generator must stay cheap)."""
    done = 0
    body = json.dumps(messages.create(stream_body(tokens, "capacity", "ok")))
    async with connect(url + "?protocol=longlived", max_queue=None) as ws:
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            await ws.send(body)
            first = True
            while True:
                frame = await ws.recv()
                if first and '"response.output_text.delta"' in frame:
                    ttfts.append((time.perf_counter() - sent) * 1e3)
                    first = False
                elif '"response.completed"' in frame:
                    done += 1
                    break
                elif '"response.failed"' in frame or '"error"' in frame[:40]:
                    raise RuntimeError(frame[:300])
    return done


@dataclass
class Topology:
    name: str
    server: ChildServer
    engine: ChildEngine | None

    def api_cpu(self) -> float:
        """The API processes (the supervisor and its workers; in process, the mock GPU's pacing too)."""
        return cpu_seconds(self.server.process)

    def engine_cpu(self) -> float:
        return self.engine.cpu_s() if self.engine is not None else 0.0


@contextlib.contextmanager
def topology(name: str, workers: int, remote: bool, tmp: Path) -> Iterator[Topology]:
    engine = ChildEngine(["--model-override", OVERRIDE]) if remote else None
    server: ChildServer | None = None
    try:
        flags = ["--model-override", OVERRIDE, "--log-level", "warning"]
        if engine is not None:
            engine.wait_ready()
            flags += ["--engine", engine.http_url]
        if workers > 1:
            flags += ["--workers", str(workers)]
        server = ChildServer(flags, db=str(tmp / f"{name}.db") if workers > 1 else ":memory:")
        server.wait_ready()
        if workers > 1:  # /healthz answers with the first worker up; wait for the others to accept too
            time.sleep(2.0)
        yield Topology(name, server, engine)
    finally:
        if server is not None:
            server.stop()
        if engine is not None:
            engine.stop()


async def measure(t: Topology, concurrency: int, tokens: int, seconds: float) -> Cell:
    # A short warm-up of every connection's code paths, then the measured window.
    await asyncio.gather(
        *(client(t.server.ws_url, tokens, time.perf_counter() + 0.3, []) for _ in range(concurrency))
    )
    ttfts: list[float] = []
    api0, eng0, cli0, t0 = t.api_cpu(), t.engine_cpu(), client_cpu(), time.perf_counter()
    counts = await asyncio.gather(
        *(client(t.server.ws_url, tokens, t0 + seconds, ttfts) for _ in range(concurrency))
    )
    wall = time.perf_counter() - t0
    api, eng, cli = t.api_cpu() - api0, t.engine_cpu() - eng0, client_cpu() - cli0
    streams = sum(counts)
    return Cell(
        topology=t.name,
        concurrency=concurrency,
        streams=streams,
        seconds=wall,
        streams_per_s=streams / wall,
        tokens_per_s=streams * tokens / wall,
        nominal_tokens_per_s=concurrency * 4000.0,
        api_cpu_ms_per_stream=api * 1e3 / streams,
        engine_cpu_ms_per_stream=eng * 1e3 / streams,
        client_cpu_ms_per_stream=cli * 1e3 / streams,
        ttft_ms_p50=percentile(ttfts, 50),
    )


def on_paper(cell: Cell, workers: int) -> float:
    """Streams/s with ``workers`` API workers and the engine each on a core of its own."""
    api = cell.api_cpu_ms_per_stream / 1e3
    engine = cell.engine_cpu_ms_per_stream / 1e3
    return min(workers / api, 1 / engine if engine else float("inf"))


async def run(args: argparse.Namespace) -> list[Cell]:
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, workers, remote in TOPOLOGIES:
            with topology(name, workers, remote, Path(tmp)) as t:
                for concurrency in args.concurrency:
                    cells.append(await measure(t, concurrency, args.tokens, args.seconds))
                    print(cells[-1].line(), flush=True)
    return cells


def add_arguments(parser: argparse.ArgumentParser) -> None:
    measured = parser.add_argument_group("measurement")
    output = parser.add_argument_group("output")
    measured.add_argument("--seconds", type=float, default=6.0, help="how long each level runs")
    measured.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[8, 32, 96],
        help="concurrent streams, comma list",
    )
    measured.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    output.add_argument("--out", type=Path, default=Path("capacity.json"), help="the JSON report")


def cmd_topology(args: argparse.Namespace) -> None:
    cells = asyncio.run(run(args))
    best = {
        name: max((c for c in cells if c.topology == name), key=lambda c: c.streams_per_s)
        for name in {c.topology for c in cells}
    }
    remote = best["engine+2 workers"]
    paper = {f"{n} workers": on_paper(remote, n) for n in (1, 2, 4, 8, 16)}
    print(
        "best streams/s: "
        + ", ".join(f"{name} {cell.streams_per_s:.1f}" for name, cell in sorted(best.items()))
    )
    print(
        f"on paper (costs of engine+2 workers at C={remote.concurrency}, a core per process): "
        + ", ".join(f"{k} {v:.0f}" for k, v in paper.items())
    )
    args.out.write_text(
        json.dumps(
            {"machine": machine(args), "cells": [asdict(c) for c in cells], "on_paper_streams_per_s": paper},
            indent=2,
        )
    )
    print(f"wrote {args.out}")


def machine(args: argparse.Namespace) -> dict[str, Any]:
    """The box and the command that reproduces the run."""
    flags = {k: getattr(args, k) for k in ("seconds", "concurrency", "tokens", "out")}
    return {
        "cpus": psutil.cpu_count(),
        "command": "responses-lab perf topology "
        + " ".join(f"--{k} {','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in flags.items()),
    }
