"""``perf capacity``: N long-lived streams at once, each at ``--rate`` tok/s — every stream's achieved rate ÷
configured, the longest gap between two reads that carried deltas, and the server's CPU and run-queue wait."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from dataclasses import dataclass

from proto.lab.analysis.metrics import percentile
from proto.perf.counting import Counting, counting
from proto.perf.schedstat import cpu_and_wait
from proto.perf.servers import lab_server, servers
from proto.perf.workload import FAST, MODEL, say_tokens
from proto.processes import ChildServer


@dataclass(frozen=True)
class Level:
    """One run of N streams, over the window in which every stream ran."""

    ratios: list[float]  # each stream's rate ÷ the configured rate
    gaps_ms: list[float]  # each stream's longest gap between reads that carried deltas
    cpu: float  # the server's share of the wall time on a CPU
    waited: float  # ... and ready but waiting for one (another process had it)


def cmd_capacity(args: argparse.Namespace) -> None:
    tokens = int(args.rate * args.seconds)
    print(
        f"capacity: N long-lived streams × {args.rate:.0f} tok/s ({tokens} tokens each, "
        f"time-factor-under-load=1), loop {args.loop}"
    )
    print(
        "rates and gaps over the window in which every stream runs; CPU and run-queue wait: the server's "
        "share of"
    )
    print(
        "the wall time on a CPU, and ready but waiting for one (another process had it); µs/token = CPU / "
        "tokens"
    )
    print(
        f"{'server':<10}{'streams':>8}{'min rate':>10}{'p50 rate':>10}{'≥99 %':>8}{'max gap':>10}"
        f"{'p99 gap':>9}{'CPU':>10}{'runq wait':>10}{'µs/token':>10}{'tries':>6}"
    )
    for streams in args.streams:  # before and this side by side at each level: the box's load drifts
        for label, path in servers(args):
            runs = least_contended(args, path, streams, tokens)
            level = min(runs, key=lambda run: run.waited)
            ok = sum(r >= 0.99 for r in level.ratios)
            print(
                f"{label:<10}{streams:>8}{min(level.ratios):>9.1%}{percentile(level.ratios, 50):>10.1%}"
                f"{ok:>5}/{streams:<3}"
                f"{max(level.gaps_ms):>8.1f}ms{percentile(level.gaps_ms, 99):>7.1f}ms{level.cpu:>10.0%}"
                f"{level.waited:>10.0%}"
                f"{level.cpu / (streams * args.rate) * 1e6:>10.2f}{len(runs):>6}"
            )


def least_contended(args: argparse.Namespace, path: str | None, streams: int, tokens: int) -> list[Level]:
    """The box is shared: a level is run again (up to ``--tries`` times) while the server waited for a CPU
    more than ``--max-wait`` of the window (another process had the core). Every run, in order."""
    flags = [
        "--model-override",
        f"{MODEL}:tokens-per-second={args.rate},time-factor-under-load=1,{FAST}",
        "--loop",
        args.loop,
        *args.flags,
    ]
    runs: list[Level] = []
    for _ in range(args.tries):
        with lab_server(flags, path) as server:
            runs.append(asyncio.run(capacity_once(server, streams, tokens, args.rate)))
        if runs[-1].waited <= args.max_wait:
            break
    return runs


async def capacity_once(server: ChildServer, streams: int, tokens: int, rate: float) -> Level:
    """Every stream's rate ÷ ``rate`` and its longest gap, over the window in which *all* streams ran
    (from the last stream's first delta to the first stream's last): the start-up ramp and the tail
    where streams end together are not the steady state the sweep asks about."""
    conns = [await counting(server.port, "/v1/responses?protocol=longlived") for _ in range(streams)]
    samples: list[
        tuple[float, float, float]
    ] = []  # (time, server CPU s, server run-queue wait s), every 50 ms

    async def sample_cpu() -> None:
        while True:
            samples.append((time.perf_counter(), *cpu_and_wait(server.process)))
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
    return level_of(conns, samples, rate)


def level_of(conns: list[Counting], samples: list[tuple[float, float, float]], rate: float) -> Level:
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
    window = [sample for sample in samples if start <= sample[0] <= end]
    span = window[-1][0] - window[0][0]
    return Level(ratios, gaps, (window[-1][1] - window[0][1]) / span, (window[-1][2] - window[0][2]) / span)
