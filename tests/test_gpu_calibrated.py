"""The calibrated classes on a FakeClock: every step of ``mock-h200-llama70b`` (Llama-3.1-70B, H200 TP8,
vLLM) is timed from its profile's tables (``StepTables.step_ms`` + the profile's step overhead), and its
batch and KV limits are the profile's knobs (docs/mock-gpu.md, "Step tables")."""

import asyncio
import itertools
from contextlib import aclosing

import pytest

from sampler.clock import FakeClock
from sampler.gpu import GpuSequence, MockGPU
from sampler.models import MODELS
from sampler.steptables import StepTables, profiles

NAME = "mock-h200-llama70b"
SPEC = MODELS[NAME]
TABLES = StepTables.load("h200-llama3.1-70b-tp8-vllm")
OVERHEAD = TABLES.knob("step-overhead")


def step_s(prefill: list[tuple[int, int]], decode_ctx: list[int]) -> float:
    return (OVERHEAD + TABLES.step_ms(prefill, decode_ctx)) / 1000.0


async def first_tokens(clock: FakeClock, seq: GpuSequence, prompt: range, n_out: int) -> list[float]:
    got: list[float] = []
    async with aclosing(seq.run_turn(prompt, list(range(7, 7 + n_out)))) as it:
        async for k in it:
            got.extend([clock.now()] * k)
    return got


def test_every_profile_is_a_catalogue_class_with_its_knobs_and_sources() -> None:
    by_profile = {s.step_profile: s for s in MODELS.values() if s.step_profile is not None}
    assert set(by_profile) == set(profiles())
    assert {"mock-h200-llama8b", "mock-h200-llama70b", "mock-h100-llama70b-fp8"} <= set(MODELS)
    for profile, spec in by_profile.items():
        t = StepTables.load(profile)
        assert (
            spec.step_overhead_ms,
            spec.dispatch_ms,
            spec.max_num_batched_tokens,
            spec.max_num_seqs,
            spec.kv_cache_size,
            spec.block_size,
        ) == (
            t.knob("step-overhead"),
            t.knob("prefill-dispatch"),
            t.knob("max-num-batched-tokens"),
            t.knob("max-num-seqs"),
            t.knob("kv-cache-size"),
            t.knob("block-size"),
        )
        assert spec.calibration is not None
        sources = spec.calibration.sources
        assert str(t.knobs["kv-cache-size"]["source"]) in sources["kv-cache-size"]
        p = t.provenance
        for part in (p["package"], p["system"], p["backend"], p["model"], f"TP{p['tp']}"):
            assert str(part) in sources["step-profile"], (profile, part)


async def test_100_concurrent_3k_prefills_take_the_budgeted_steps_of_the_tables() -> None:
    """The first arrival is scheduled alone; the other 99 pack 8 192-token steps in FIFO order, each chunk
    attending to its own sequence's tokens already in KV. A turn's first token comes at the end of the step
    that finishes its prompt: 38 steps of the tables, 12.2 s for the last, where a timer per sequence would
    give each turn its own single prefill (0.12 s)."""
    clock = FakeClock()
    gpu = MockGPU(SPEC, clock)
    n, isl = 100, 3000
    tasks = [
        asyncio.create_task(first_tokens(clock, gpu.open(), range(i * 10_000, i * 10_000 + isl), 1))
        for i in range(n)
    ]
    await clock.run_until_idle()
    firsts = [(await t)[0] for t in tasks]
    # The steps the token budget gives, from the tables.
    left = [isl] * n
    steps: list[list[tuple[int, int]]] = [[(isl, 0)]]
    left[0] = 0
    finished_in: dict[int, int] = {0: 0}
    while any(left):
        budget, step = SPEC.max_num_batched_tokens, []
        for i in range(n):
            if left[i] and budget:
                chunk = min(left[i], budget)
                step.append((chunk, isl - left[i]))
                left[i] -= chunk
                budget -= chunk
                if not left[i]:
                    finished_in[i] = len(steps)
        steps.append(step)
    ends = list(itertools.accumulate(step_s(s, []) for s in steps))
    assert firsts == pytest.approx([ends[finished_in[i]] for i in range(n)], rel=1e-9)
    assert gpu.metrics()["steps"] == len(steps) == 38
    lone = step_s([(isl, 0)], [])
    assert firsts[-1] > 30 * lone and 10.0 < firsts[-1] < 20.0


async def test_itl_grows_with_context_per_the_decode_table() -> None:
    """Alone, the gap before output token i + 1 is one decode step at context prompt + i: overhead +
    the tables' step: 14.2 ms at 120 k of context against 11.3 ms at 1 k (TP8 splits the KV read eight
    ways, so the GEMMs dominate a lone decode)."""
    means = []
    for isl in (1024, 120_000):
        clock = FakeClock()
        gpu = MockGPU(SPEC, clock)
        task = asyncio.create_task(first_tokens(clock, gpu.open(), range(isl), 20))
        await clock.run_until_idle()
        gaps = [b - a for a, b in itertools.pairwise(await task)]
        assert gaps == pytest.approx([step_s([], [isl + i]) for i in range(19)], rel=1e-9)
        means.append(sum(gaps) / len(gaps))
    assert means[1] > 1.2 * means[0]


async def test_a_prefill_slows_the_running_decode() -> None:
    """a decodes alone; b's 20 000-token prompt arrives. For the three steps that carry b's chunks (8 191,
    8 191 and 3 618 tokens: the budget less a's decode), a's token gap is that whole step from the tables;
    otherwise it is a lone decode step."""
    clock = FakeClock()
    gpu = MockGPU(SPEC, clock)
    isl_a = 16
    ta = asyncio.create_task(first_tokens(clock, gpu.open(), range(isl_a), 80))
    await clock.advance(0.1)
    tb = asyncio.create_task(first_tokens(clock, gpu.open(), range(10**6, 10**6 + 20_000), 1))
    await clock.run_until_idle()
    ts, (b_first,) = await ta, await tb
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    slow = [i for i, g in enumerate(gaps) if g > 2 * step_s([], [isl_a + i])]
    assert len(slow) == 3 and slow == list(range(slow[0], slow[0] + 3))
    chunks = [(8191, 0), (8191, 8191), (3618, 16_382)]
    for i, chunk in zip(slow, chunks, strict=True):
        assert gaps[i] == pytest.approx(step_s([chunk], [isl_a + i]), rel=1e-9)
    for i, g in enumerate(gaps):
        if i not in slow:
            assert g == pytest.approx(step_s([], [isl_a + i]), rel=1e-9)
    assert b_first == pytest.approx(ts[slow[-1] + 1], abs=1e-12)  # b's first token ends its last chunk


@pytest.mark.slow
async def test_preemption_comes_at_the_kv_capacity_of_the_knobs() -> None:
    """24 suspended sequences pin 7 261 blocks each (a 116 176-token prompt), leaving 1 000 of the profile's
    175 264 (its kv-cache-size). Then a (x blocks of prompt, 3 tokens) and b (y blocks, 2 tokens) arrive:
    a prefills alone, then decodes beside b's one-chunk prefill, then both decode: x + y + 2 blocks at the
    peak. At x + y + 2 = 1 000 nobody is preempted; at 1 001 the latest admitted (b) is, and recomputes."""
    blocks, bs = SPEC.kv_cache_size, SPEC.block_size
    assert blocks == TABLES.knob("kv-cache-size") == 175_264 and bs == TABLES.knob("block-size")
    pinned_each, free = 7261, 1000
    assert 24 * pinned_each + free == blocks

    async def run(y: int) -> dict[str, float]:
        clock = FakeClock()
        gpu = MockGPU(SPEC, clock)
        fillers = [gpu.open() for _ in range(24)]
        turns = [
            asyncio.create_task(first_tokens(clock, seq, range(i * 10**6, i * 10**6 + pinned_each * bs), 1))
            for i, seq in enumerate(fillers)
        ]
        await clock.run_until_idle()
        await asyncio.gather(*turns)
        for seq in fillers:
            seq.suspend()
        assert gpu.metrics()["kv_blocks_pinned_suspended"] == 24 * pinned_each
        base, x = 10**8, 499
        ta = asyncio.create_task(first_tokens(clock, gpu.open(), range(base, base + x * bs), 3))
        tb = asyncio.create_task(first_tokens(clock, gpu.open(), range(2 * base, 2 * base + y * bs), 2))
        await clock.run_until_idle()
        assert (len(await ta), len(await tb)) == (3, 2)
        return gpu.metrics()

    at_capacity = await run(free - 2 - 499)
    assert at_capacity["preemptions"] == 0
    assert at_capacity["kv_blocks_pinned_suspended"] == 24 * pinned_each  # within the TTL: still pinned
    assert (await run(free - 2 - 499 + 1))["preemptions"] == 1
