"""Real-clock pacing of the mock GPU, directly on MockGPU (no transport).

    .venv/bin/python scripts/gpu_pacing.py [--loop asyncio|uvloop] [--clock timerfd|coarse] [--seconds 3]

Per model: configured vs observed tokens/s over one long turn, how late tokens leave against their
deadlines, tokens per wake-up, the process CPU the decode took (share of one core), and modelled vs
observed TTFT over a few uncached prompts. ``--clock coarse`` is RealClock's fallback (asyncio.sleep).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from contextlib import aclosing

from sampler.clock import RealClock
from sampler.gpu import MockGPU
from sampler.models import resolve_model


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def decode(gpu: MockGPU, n: int) -> dict[str, float]:
    seq = gpu.open()
    stamps: list[float] = []
    wakeups = 0
    prompt, output = list(range(1000)), list(range(n))
    start, cpu0 = time.perf_counter(), time.process_time()
    async with aclosing(seq.run_turn(prompt, output)) as it:
        async for k in it:
            now = time.perf_counter()
            wakeups += 1
            stamps.extend([now] * k)
    core = (time.process_time() - cpu0) / (time.perf_counter() - start)
    report = seq.last_report
    assert report is not None
    itl = gpu.spec.inter_token_latency_ms / 1000
    # Lateness against the modelled schedule: call start + queue wait + prefill + i x ITL.
    t_first = start + (report.queue_wait_ms + report.prefill_ms) / 1000
    late_ms = [(t - (t_first + i * itl)) * 1000 for i, t in enumerate(stamps)]
    return {
        "observed_tps": (n - 1) / (stamps[-1] - stamps[0]),
        "late_p50_ms": pct(late_ms, 0.5),
        "late_p99_ms": pct(late_ms, 0.99),
        "late_last_ms": late_ms[-1],
        "tokens_per_wakeup": n / wakeups,
        "core": core,
    }


async def ttft(gpu: MockGPU, prompt_tokens: int, runs: int) -> tuple[float, list[float]]:
    errors = []
    modelled = 0.0
    for r in range(runs):
        seq = gpu.open()
        prompt = [r * 1_000_000 + i for i in range(prompt_tokens)]  # distinct: never a cache hit
        start = time.perf_counter()
        first = None
        async with aclosing(seq.run_turn(prompt, [1])) as it:
            async for _ in it:
                first = time.perf_counter()
        assert first is not None and seq.last_report is not None
        modelled = seq.last_report.prefill_ms
        errors.append((first - start) * 1000 - modelled)
        seq.close()
    return modelled, errors


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    ap.add_argument("--clock", choices=["timerfd", "coarse"], default="timerfd",
                    help="RealClock() or its fallback, RealClock(timerfd=False)")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each decode run")
    ap.add_argument("--ttft-runs", type=int, default=5)
    return ap.parse_args()


async def main(args: argparse.Namespace) -> None:
    clock = RealClock(timerfd=args.clock == "timerfd")
    print(f"loop={args.loop}, clock={args.clock}; decode runs of ~{args.seconds:g} s; prompt 1000 uncached tokens")
    print(f"{'model':<14}{'conf tok/s':>11}{'obs tok/s':>11}{'err %':>8}{'late p50':>10}{'late p99':>10}"
          f"{'late last':>11}{'tok/wake':>9}{'CPU':>6}{'TTFT mod':>10}{'obs-mod mean':>13}{'max':>9}")
    for name in ("mock-65tps", "mock-1000tps", "mock-4000tps"):
        gpu = MockGPU(resolve_model(name), clock)
        conf = gpu.spec.tokens_per_s
        d = await decode(gpu, max(2, round(conf * args.seconds)))
        modelled, errs = await ttft(gpu, 1000, args.ttft_runs)
        print(f"{name:<14}{conf:>11.1f}{d['observed_tps']:>11.2f}{(d['observed_tps'] / conf - 1) * 100:>8.3f}"
              f"{d['late_p50_ms']:>8.3f}ms{d['late_p99_ms']:>8.3f}ms{d['late_last_ms']:>9.3f}ms"
              f"{d['tokens_per_wakeup']:>9.2f}{d['core']:>6.0%}{modelled:>8.2f}ms{statistics.mean(errs):>11.3f}ms"
              f"{max(errs):>7.3f}ms")


if __name__ == "__main__":
    args = parse()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
