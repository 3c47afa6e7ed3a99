"""``perf engine``: the mock GPU's step loop under a fleet — N concurrent sequences on one engine, on the real
clock, in this process (no server): the loop's own CPU per step, the whole process's (the N consumers' wake-
ups included), and how much of what fell due the consumers had taken when the window closed (its pace).

CPU figures are CPU time (``time.thread_time`` / ``time.process_time``), not wall time: the box may be
shared, and the figure that bounds a fleet is what the loop costs, not what the scheduler gave it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from contextlib import aclosing

from sampler.clock import RealClock
from sampler.gpu import GpuSequence, MockGPU
from sampler.overrides import model_specs


def add_arguments(p: argparse.ArgumentParser) -> None:
    measured = p.add_argument_group("measurement")
    gpu = p.add_argument_group("the mock GPU")
    measured.add_argument(
        "--sequences",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[64, 512],
        help="concurrent sequences on the engine, one measurement each (comma-separated)",
    )
    gpu.add_argument("--model", default="mock-65tps", help="the mock model whose step loop is measured")
    gpu.add_argument(
        "--max-num-seqs",
        type=int,
        default=1024,
        help="the engine's batch bound (default 1024: vLLM's for a >= 70 GiB GPU, so that every sequence "
        "runs)",
    )
    measured.add_argument("--seconds", type=float, default=5.0, help="measured once every sequence decodes")
    measured.add_argument("--prompt", type=int, default=200, help="distinct prompt tokens per sequence")


async def _fleet(gpu: MockGPU, n: int, prompt: int, seconds: float) -> dict[str, float]:
    clock = gpu.clock
    rng = random.Random(0)
    delivered = [0] * n
    decoding = asyncio.Event()
    started = [0]
    out = list(range(1, gpu.spec.max_output_tokens))

    async def consume(i: int, seq: GpuSequence) -> None:
        ids = [rng.randrange(1, 100_000) for _ in range(prompt)]
        async with aclosing(seq.run_turn(ids, out)) as it:
            async for k in it:
                if not delivered[i]:
                    started[0] += 1
                    if started[0] == n:
                        decoding.set()
                delivered[i] += k

    seqs = [gpu.open() for _ in range(n)]
    tasks = [asyncio.create_task(consume(i, s)) for i, s in enumerate(seqs)]
    await decoding.wait()  # the prefills: measured from the first step with every sequence decoding
    sched = gpu.scheduler
    t0, cpu0, steps0, sched0 = clock.now(), time.process_time(), sched.steps, sched.cpu_ns
    await clock.sleep_until(t0 + seconds)
    cpu, t_end = time.process_time() - cpu0, clock.now()
    sched.advance(t_end)
    # every turn's, running or queued (a fleet outgrows the KV cache: the preempted wait in the queue)
    due = sum(s._req.emitted for s in seqs if s._req is not None)
    taken = sum(delivered)
    steps = sched.steps - steps0
    running = sched.running
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in seqs:
        s.close()
    return {
        "steps": steps,
        "step_ms": (t_end - t0) * 1e3 / steps if steps else 0.0,
        "loop_cpu_us_per_step": (sched.cpu_ns - sched0) / 1e3 / steps if steps else 0.0,
        "process_cpu_us_per_step": cpu * 1e6 / steps if steps else 0.0,
        "pace": taken / due if due else 0.0,
        "running": float(running),
        "preemptions": float(sched.preemptions),
    }


def cmd_engine(args: argparse.Namespace) -> None:
    spec = model_specs()[args.model].override(max_num_seqs=args.max_num_seqs)
    print(
        f"perf engine: {args.model}, {args.seconds:g} s per level, CPU time (not wall: the box may be shared)"
    )
    for n in args.sequences:
        gpu = MockGPU(spec, RealClock())
        r = asyncio.run(_fleet(gpu, n, args.prompt, args.seconds))
        share = r["loop_cpu_us_per_step"] / 10 / r["step_ms"] if r["step_ms"] else 0.0
        print(
            f"  {n:5d} sequences  {r['running']:5.0f} running  {r['steps']:6.0f} steps of"
            f" {r['step_ms']:7.2f} ms  loop CPU {r['loop_cpu_us_per_step']:8.1f} us/step ({share:5.2f} % of"
            f" a step)  process CPU {r['process_cpu_us_per_step']:8.1f} us/step  preemptions"
            f" {r['preemptions']:5.0f}  pace {r['pace']:6.1%}"
        )
