"""Replay published GPU benchmarks on the mock GPU, run as the publisher ran them, and print each figure as
a ratio to the published one (docs/mock-gpu.md, "Against published runs").

    make replay-published
    .venv/bin/python scripts/replay_published.py [--only nim|trtllm|vllm] [--requests-per-client N]

The published figures are data, with their sources: ``sampler/profiles/published/*.json``.

* NVIDIA NIM, Llama-3.3-70B on 2 x H100 FP8 TP2: 5 000 input / 500 output tokens at a fixed concurrency of
  1 to 250 (each client sends its next request when its last one ends): mean TTFT, ITL, output throughput.
* TensorRT-LLM's throughput overview: every request queued at once, output tokens/s per GPU.
* vLLM's CI latency runs: one batch of 8 prompts of 32 tokens, 128 output tokens each, end to end.

The mock is driven through its Python API (``MockGPU`` / ``GpuSequence.run_turn`` on a ``FakeClock``); the
only input is a ``ModelSpec``: the catalogue's calibrated class that runs the benchmark's profile
(``spec_for``), so every step is timed from the profile's tables with the profile's knobs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sampler.clock import FakeClock  # noqa: E402
from sampler.gpu import MockGPU  # noqa: E402
from sampler.models import MODELS, ModelSpec  # noqa: E402
from sampler.steptables import PROFILES_DIR  # noqa: E402

PUBLISHED = PROFILES_DIR / "published"
COALESCE_S = 0.05  # wake-ups coalesced (tokens released together; no deadline moves): replay cost only


def spec_for(profile: str) -> ModelSpec:
    """The catalogue's calibrated class for ``profile`` (its ``step_profile``): the step loop, timed from the
    profile's tables, with the knobs the catalogue read from the profile."""
    for spec in MODELS.values():
        if spec.step_profile == profile:
            return spec
    raise KeyError(f"no catalogue model runs the profile {profile!r} (sampler/models.py)")


@dataclass
class Run:
    ttft_ms: list[float]
    itl_ms: list[float]
    output_tokens: int
    makespan_s: float  # start to the last token's deadline


async def _turn(gpu: MockGPU, base: int, isl: int, osl: int, run: Run) -> None:
    seq = gpu.open()
    start = gpu.clock.now()
    try:
        # Distinct ids per request: no prefix is shared (the publishers' prompts are random).
        prompt = range(base, base + isl)
        async with contextlib.aclosing(seq.run_turn(prompt, range(osl), every_s=COALESCE_S)) as turn:
            async for _ in turn:
                pass
        r = seq.last_report
        assert r is not None
        run.ttft_ms.append(r.queue_wait_ms + r.prefill_ms)
        if r.output_tokens > 1:
            run.itl_ms.append(r.decode_ms / (r.output_tokens - 1))
        run.output_tokens += r.output_tokens
        # the last token's deadline (the coalesced wake-up that released it may come up to COALESCE_S later)
        run.makespan_s = max(run.makespan_s, start + (r.queue_wait_ms + r.prefill_ms + r.decode_ms) / 1000.0)
    finally:
        seq.close()


async def replay(spec: ModelSpec, isl: int, osl: int, clients: int, per_client: int) -> Run:
    """``clients`` closed-loop clients, ``per_client`` requests each, started together (all at once when
    ``per_client`` is 1: the offline throughput and latency runs)."""
    clock = FakeClock()
    gpu = MockGPU(spec, clock)
    run = Run([], [], 0, 0.0)
    ids = iter(range(10**9))

    async def client() -> None:
        for _ in range(per_client):
            await _turn(gpu, next(ids) * (isl + 1) * 2, isl, osl, run)

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    return run


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((PUBLISHED / name).read_text()))


Row = tuple[str, str, str, str, float, float]  # benchmark, profile, setting, metric, published, mock


def nim(per_client: int) -> Iterator[Row]:
    data = _load("nim_llama33_70b.json")
    spec = spec_for(data["profile"])
    for conc, ttft, itl, tput in data["rows"]:
        run = asyncio.run(replay(spec, data["isl"], data["osl"], conc, per_client))
        setting = f"c={conc} {data['isl']}/{data['osl']}"
        yield "NIM", spec.name, setting, "TTFT ms", ttft, _mean(run.ttft_ms)
        yield "NIM", spec.name, setting, "ITL ms", itl, _mean(run.itl_ms)
        yield "NIM", spec.name, setting, "tok/s", tput, run.output_tokens / run.makespan_s


def trtllm(requests: int) -> Iterator[Row]:
    data = _load("trtllm_perf_overview.json")
    for gpu, tp, quant, isl, osl, per_gpu, profile in data["rows"]:
        if profile is None:
            continue
        spec = spec_for(profile)
        run = asyncio.run(replay(spec, isl, osl, requests, 1))
        setting = f"{gpu} TP{tp} {quant} {isl}/{osl}, {requests} queued"
        yield "TRT-LLM", spec.name, setting, "tok/s/GPU", per_gpu, run.output_tokens / run.makespan_s / tp


def vllm_ci() -> Iterator[Row]:
    data = _load("vllm_ci_latency.json")
    for test, gpu, latency, profile in data["rows"]:
        if profile is None:
            continue
        spec = spec_for(profile)
        run = asyncio.run(replay(spec, data["isl"], data["osl"], data["batch"], 1))
        setting = f"{test} {gpu} batch {data['batch']} {data['isl']}/{data['osl']}"
        yield "vLLM CI", spec.name, setting, "latency ms", latency, run.makespan_s * 1000.0


SUITES: dict[str, Callable[[argparse.Namespace], Iterator[Row]]] = {
    "nim": lambda a: nim(a.requests_per_client),
    "trtllm": lambda a: trtllm(a.trtllm_requests),
    "vllm": lambda a: vllm_ci(),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(SUITES), action="append", help="these suites only")
    ap.add_argument("--requests-per-client", type=int, default=2, help="NIM replay: requests per client")
    ap.add_argument("--trtllm-requests", type=int, default=512, help="TRT-LLM replay: requests queued")
    args = ap.parse_args(argv)
    print("| benchmark | mock model | setting | metric | published | mock | mock / published |")
    print("|---|---|---|---|---|---|---|")
    for suite in args.only or sorted(SUITES):
        for bench, model, setting, metric, published, mock in SUITES[suite](args):
            ratio = mock / published
            print(
                f"| {bench} | {model} | {setting} | {metric} | {published:,.2f} | {mock:,.2f} | {ratio:.2f} |"
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
