"""How late ``sleep_until`` returns, and what it costs in CPU, per clock, on one event loop.

    .venv/bin/python scripts/clock_lateness.py --loop asyncio|uvloop [--sleeps 2000] [--long 30] [--stream-s 2]

Clocks: ``old`` is RealClock before the timerfd (one ``asyncio.sleep(t - now)``, then
``asyncio.sleep(0)`` yields until due), ``old-spin2ms`` the same with its 2 ms spin window,
``coarse`` today's fallback (``asyncio.sleep`` only, never a spin), ``timerfd`` today's RealClock.

Three runs per clock:
* *random*: ``--sleeps`` deadlines drawn uniformly 0.1–2 ms ahead, one after the other; lateness is
  ``now() - t`` after the sleep returns (negative: early). CPU per sleep is process CPU time / sleeps.
* *long*: ``--long`` deadlines 5–100 ms ahead (ITLs of slow models, prefills): lateness p50 and max.
* *stream*: one 4 000 tok/s stream for ``--stream-s``: deadlines on a 250 µs grid, each wake-up releasing
  every token due (the engine's loop); CPU is process CPU time / wall time (1.0 = a whole core).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

from sampler.clock import Clock, RealClock


class OldClock:
    """RealClock as it was (commit 9cd33bf), counting its ``sleep(0)`` yields."""

    def __init__(self, spin_s: float = 0.0) -> None:
        self.spin_s = spin_s
        self.yields = 0

    def now(self) -> float:
        return time.perf_counter()

    async def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > self.spin_s:
            await asyncio.sleep(dt - self.spin_s)
        while self.now() < t:  # the old busy-wait, measured on purpose
            self.yields += 1
            await asyncio.sleep(0)

    def timer(self) -> None:
        return None


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def random_deadlines(
    clock: Clock, n: int, rng: random.Random, lo: float = 0.0001, hi: float = 0.002
) -> dict[str, float]:
    late: list[float] = []
    cpu0 = time.process_time()
    for _ in range(n):
        t = clock.now() + rng.uniform(lo, hi)
        await clock.sleep_until(t)
        late.append(clock.now() - t)
    cpu = time.process_time() - cpu0
    return {
        "p50_ms": pct(late, 0.5) * 1e3,
        "p99_ms": pct(late, 0.99) * 1e3,
        "max_ms": max(late) * 1e3,
        "min_ms": min(late) * 1e3,
        "cpu_us_per_sleep": cpu / n * 1e6,
    }


async def stream(clock: Clock, seconds: float, itl: float = 0.00025) -> dict[str, float]:
    cpu0, start = time.process_time(), clock.now()
    due, tokens, wakeups = start, 0, 0
    while due < start + seconds:
        await clock.sleep_until(due)
        now = clock.now()
        wakeups += 1
        while due <= now:
            tokens += 1
            due += itl
    wall = clock.now() - start
    return {"core": (time.process_time() - cpu0) / wall, "tok_per_wake": tokens / wakeups}


def runner(loop: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    if loop == "uvloop":
        import uvloop

        return uvloop.run
    return asyncio.run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    ap.add_argument("--sleeps", type=int, default=2000)
    ap.add_argument("--long", type=int, default=30)
    ap.add_argument("--stream-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    clocks: dict[str, Callable[[], Clock]] = {
        "old": OldClock,
        "old-spin2ms": lambda: OldClock(0.002),
        "coarse": lambda: RealClock(timerfd=False),
        "timerfd": RealClock,
    }
    print(f"loop={args.loop}; {args.sleeps} sleeps 0.1–2 ms ahead; {args.long} sleeps 5–100 ms ahead; "
          f"a 4 000 tok/s stream for {args.stream_s:g} s")
    print(f"{'clock':<13}{'late p50':>10}{'p99':>9}{'max':>9}{'min':>9}{'CPU/sleep':>11}{'yields/sleep':>13}"
          f"{'long p50':>10}{'max':>9}{'stream core':>13}{'tok/wake':>10}")
    for name, make in clocks.items():
        clock = make()
        out: dict[str, dict[str, float]] = {}

        async def run(clock: Clock = clock, out: dict[str, dict[str, float]] = out) -> None:
            await clock.sleep_until(clock.now() + 0.01)  # warm-up: the loop's timerfd, imports
            y0 = clock.yields if isinstance(clock, OldClock) else 0
            out["r"] = await random_deadlines(clock, args.sleeps, random.Random(args.seed))
            out["y"] = {"n": (clock.yields - y0) / args.sleeps if isinstance(clock, OldClock) else 0.0}
            long = await random_deadlines(clock, args.long, random.Random(args.seed), 0.005, 0.1)
            out["l"] = long
            out["s"] = await stream(clock, args.stream_s)

        runner(args.loop)(run())
        r, s, lg = out["r"], out["s"], out["l"]
        yields = f"{out['y']['n']:.1f}"
        print(f"{name:<13}{r['p50_ms']:>8.3f}ms{r['p99_ms']:>7.3f}ms{r['max_ms']:>7.3f}ms{r['min_ms']:>7.3f}ms"
              f"{r['cpu_us_per_sleep']:>9.1f}µs{yields:>13}{lg['p50_ms']:>8.3f}ms{lg['max_ms']:>7.3f}ms{s['core']:>12.0%}{s['tok_per_wake']:>10.2f}")


if __name__ == "__main__":
    main()
