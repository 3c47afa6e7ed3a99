"""The engine-step loop on a FakeClock: prefill as shared compute under the token budget, decode steps that
grow with context and with the prefills beside them, KV admission and preemption, pinned suspensions,
speculative bursts, seeded jitter, the FIFO queue."""

import asyncio
import itertools
import random
from contextlib import aclosing

import pytest

from sampler.clock import FakeClock
from sampler.engine import EngineOverloaded
from sampler.gpu import GpuSequence, MockGPU
from sampler.models import ModelSpec, spec_tokens_mean

Emits = list[tuple[float, int]]


def make(**kw: object) -> tuple[MockGPU, FakeClock]:
    spec = ModelSpec(
        name="t",
        time_to_first_token_ms=0.0,
        prefill_overhead_ms=0.0,  # no dispatch: a turn's first chunk goes into the next step
        prefill_time_per_token_ms=0.05,
        inter_token_latency_ms=1.0,
        max_num_seqs=256,
        time_factor_under_load=1.0,
        kv_cache_size=30_000,
    ).override(**kw)
    clock = FakeClock()
    return MockGPU(spec, clock), clock


async def collect(
    clock: FakeClock, seq: GpuSequence, prompt: list[int], n_out: int, close: bool = False
) -> Emits:
    got: Emits = []
    try:
        async with aclosing(seq.run_turn(prompt, list(range(7, 7 + n_out)))) as it:
            async for k in it:
                got.append((clock.now(), k))
    finally:
        if close:
            seq.close()
    return got


def times(emits: Emits) -> list[float]:
    return [t for t, k in emits for _ in range(k)]


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 100_000) for _ in range(n)]


async def test_concurrent_prefills_take_the_sum_of_the_budgeted_steps() -> None:
    """100 turns of 3 000 new tokens arrive at once. The first arrival finds the engine idle and is
    scheduled alone (3 000 tokens); the other 99 are queued for the next boundary, and from then on each
    step packs 8 192 tokens of chunks in FIFO order (the last one what is left). A step costs 2 ms of host
    overhead + 0.05 ms a token, so a turn's first token comes at the end of the step that finishes its
    prompt: the last after 15.076 s, not the 150 ms that independent per-sequence timers would give."""
    gpu, clock = make(step_overhead_ms=2.0)
    rng = random.Random(1)
    seqs = [gpu.open() for _ in range(100)]
    tasks = [asyncio.create_task(collect(clock, s, prompt(rng, 3000), 1)) for s in seqs]
    await clock.run_until_idle()
    firsts = [times(await t)[0] for t in tasks]
    steps = [3000] + [8192] * 36 + [300_000 - 3000 - 8192 * 36]
    ends = list(itertools.accumulate((2.0 + 0.05 * c) / 1000 for c in steps))
    boundaries = list(itertools.accumulate(steps))
    expected = [ends[next(j for j, b in enumerate(boundaries) if b >= 3000 * (i + 1))] for i in range(100)]
    assert firsts == pytest.approx(expected, abs=1e-9)
    assert firsts[-1] == pytest.approx(15.076, abs=1e-9)
    assert gpu.metrics()["steps"] == len(steps)
    # The last turn is admitted with its first chunk, in the step that starts past 297 000 tokens: it
    # waited for that step (queue_wait_ms), then prefilled over two steps (prefill_ms: first chunk to last).
    first_chunk = next(j for j, b in enumerate(boundaries) if b > 297_000)
    r = seqs[-1].last_report
    assert r is not None and first_chunk == len(steps) - 2
    assert r.queue_wait_ms == pytest.approx(ends[first_chunk - 1] * 1000)
    assert r.prefill_ms == pytest.approx((ends[-1] - ends[first_chunk - 1]) * 1000)


async def test_itl_grows_with_context() -> None:
    """A decode step reads the KV of every decoding sequence: ITL + kv-read × context. Alone, the gap before
    token i + 1 is 10 + 0.001 × (prompt + i − 1) ms (the step feeding token i attends to all before it)."""
    for n_prompt in (1000, 20_000):
        gpu, clock = make(inter_token_latency_ms=10.0, kv_read_time_per_token_ms=0.001)
        task = asyncio.create_task(collect(clock, gpu.open(), prompt(random.Random(2), n_prompt), 30))
        await clock.run_until_idle()
        ts = times(await task)
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        assert gaps == pytest.approx([(10.0 + 0.001 * (n_prompt + i)) / 1000 for i in range(29)], abs=1e-12)


async def test_a_prefill_slows_the_decode_beside_it() -> None:
    """a decodes alone at 1 ms a step. b's 2 048-token prompt arrives: with a budget of 1 025 tokens, a's
    decode takes 1 and b's chunks 1 024 each, so two steps cost 1 + 1 024 × 0.01 = 11.24 ms and a's tokens
    come that far apart; then both decode, 1 ms a step."""
    gpu, clock = make(prefill_time_per_token_ms=0.01, max_num_batched_tokens=1025)
    ta = asyncio.create_task(collect(clock, gpu.open(), [1] * 16, 40))
    await clock.advance(0.0105)  # a is decoding (its steps end at 0.16, 1.16, … 10.16 ms)
    b = gpu.open()
    tb = asyncio.create_task(collect(clock, b, prompt(random.Random(3), 2048), 5))
    await clock.run_until_idle()
    ta_, tb_ = times(await ta), times(await tb)
    gaps = [round((y - x) * 1000, 9) for x, y in itertools.pairwise(ta_)]
    assert gaps.count(11.24) == 2 and set(gaps) == {1.0, 11.24}
    t_b0 = 0.00016 + 0.011  # b arrived mid-step: queued until the step ending at 11.16 ms
    assert tb_[0] == pytest.approx(t_b0 + 2 * 0.01124, abs=1e-12)
    assert b.last_report is not None and b.last_report.prefill_ms == pytest.approx(2 * 11.24)
    assert b.last_report.queue_wait_ms == pytest.approx(0.66)


async def test_kv_pressure_preempts_the_latest_and_it_recomputes() -> None:
    """24 blocks; a and b each grow to 64 + 200 tokens (17 blocks). When a (admitted first) needs a block
    and none is free, b (the latest admitted) is preempted: its blocks are freed, the full prompt blocks it
    computed stay cached, and it waits at the head of the queue. When a is done and closed, b is admitted
    again: its prompt hits the cache and only the rest (prompt tail + its tokens so far) is recomputed. Every
    token still arrives once, in order."""
    gpu, clock = make(kv_cache_size=24)
    rng = random.Random(4)
    a, b = gpu.open(), gpu.open()
    ta = asyncio.create_task(collect(clock, a, prompt(rng, 64), 200, close=True))
    await clock.settle()
    tb = asyncio.create_task(collect(clock, b, prompt(rng, 64), 200, close=True))
    await clock.run_until_idle()
    ea, eb = await ta, await tb
    m = gpu.metrics()
    assert m["preemptions"] == 1
    assert sum(k for _, k in ea) == 200 and sum(k for _, k in eb) == 200
    tb_ = times(eb)
    assert tb_ == sorted(tb_) and times(ea)[-1] < tb_[-1]
    # b stopped while a finished: its longest gap spans a's remaining steps and its own recompute
    assert max(y - x for x, y in itertools.pairwise(tb_)) > 0.05
    assert m["prefix_cache_hits"] >= 64 - 16  # b's recompute found its prompt's blocks (but the last)
    assert m["kv_blocks_used"] == 0 and m["running"] == 0


async def test_pinned_suspended_blocks_cost_the_other_sequences_capacity() -> None:
    """p holds 8 of 16 blocks while it waits for a tool. Two other turns of 60 + 20 tokens (5 blocks each)
    then do not fit beside it: the later one is preempted. Unpinned, or once the pins have been idle past
    kv-idle-ttl, they run side by side."""

    async def run(pin: bool, idle_s: float) -> dict[str, float]:
        gpu, clock = make(kv_cache_size=16, pin_suspended=pin, kv_idle_ttl_s=60.0)
        rng = random.Random(5)
        p = gpu.open()
        task = asyncio.create_task(collect(clock, p, prompt(rng, 96), 32))
        await clock.run_until_idle()
        await task
        p.suspend()
        pinned = gpu.metrics()["kv_blocks_pinned_suspended"]
        await clock.advance(idle_s)
        tasks = [
            asyncio.create_task(collect(clock, gpu.open(), prompt(rng, 60), 20, close=True)) for _ in "qq"
        ]
        await clock.run_until_idle()
        await asyncio.gather(*tasks)
        return {**gpu.metrics(), "pinned_before": pinned}

    pinned = await run(True, 1.0)
    assert pinned["pinned_before"] == 8 and pinned["kv_blocks_pinned_suspended"] == 8
    assert pinned["preemptions"] >= 1
    unpinned = await run(False, 1.0)
    assert unpinned["pinned_before"] == 0 and unpinned["preemptions"] == 0
    expired = await run(True, 61.0)  # idle past the TTL: the pressure unpins p
    assert expired["preemptions"] == 0 and expired["kv_blocks_pinned_suspended"] == 0


async def test_speculative_decoding_emits_bursts_at_the_expected_mean() -> None:
    """k = 4, α = 0.8: each 1 ms step emits 1 to 5 tokens at one instant, (1 − 0.8⁵)/0.2 = 3.36 on average."""
    gpu, clock = make(spec_tokens=4, spec_acceptance=0.8)
    task = asyncio.create_task(collect(clock, gpu.open(), [1, 2, 3], 20_000))
    await clock.run_until_idle()
    emits = await task
    per_step = [k for _, k in emits][1:]  # after the first token (the prefill's)
    assert set(per_step[:-1]) == {1, 2, 3, 4, 5}
    steps = [t for t, _ in emits]
    assert [round((y - x) * 1000, 9) for x, y in itertools.pairwise(steps)] == [1.0] * (len(steps) - 1)
    # 5 900 steps: the mean's standard error is ~0.02 tokens
    assert sum(per_step) / len(per_step) == pytest.approx(spec_tokens_mean(4, 0.8), abs=0.08)


async def test_jitter_is_reproducible_by_seed() -> None:
    async def run(seed: int) -> list[list[float]]:
        gpu, clock = make(itl_jitter_std=0.2, ttft_jitter_std=0.2, prefill_overhead_ms=5.0, seed=seed)
        tasks = [asyncio.create_task(collect(clock, gpu.open(), [i] * 300, 50)) for i in range(4)]
        await clock.run_until_idle()
        return [times(await t) for t in tasks]

    first = await run(11)
    assert first == await run(11)
    assert first != await run(12)
    gaps = {round(y - x, 12) for x, y in itertools.pairwise(first[0][1:])}
    assert len(gaps) > 20  # the steps are drawn, not constant


async def test_fifo_queue_no_overtaking_and_overload() -> None:
    """Past max-num-seqs turns wait in arrival order; past max-waiting they are refused before anything is
    yielded; a cancelled waiter leaves the queue."""
    gpu, clock = make(max_num_seqs=1, max_waiting=2, prefill_time_per_token_ms=1.0)
    order: list[int] = []

    async def turn(i: int) -> None:
        await collect(clock, gpu.open(), [i] * 10, 2)
        order.append(i)

    tasks = [asyncio.create_task(turn(i)) for i in range(3)]
    await clock.settle()
    assert (gpu.metrics()["running"], gpu.metrics()["waiting"]) == (1, 2)
    with pytest.raises(EngineOverloaded):
        await collect(clock, gpu.open(), [9], 1)
    tasks[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert gpu.metrics()["waiting"] == 1
    late = asyncio.create_task(turn(3))
    await clock.run_until_idle()
    await asyncio.gather(tasks[0], tasks[2], late)
    assert order == [0, 2, 3]


@pytest.mark.timeout(30)  # before the fix the preempted turn spun on the loop forever (a guard, not a bound)
async def test_a_preempted_coalesced_turn_processes_the_boundary_it_wakes_at() -> None:
    """As the KV-pressure test, but each turn's tokens are coalesced (``every_s`` 50 ms, as the published-run
    replay drives them). b, preempted and at the head of the queue, wakes at the step boundary while its
    coalescing floor is still ahead: it must process that boundary, not sleep until it again (at once, on a
    FakeClock) forever."""
    gpu, clock = make(kv_cache_size=24)
    rng = random.Random(4)

    async def run(seq: GpuSequence) -> int:
        got = 0
        ids = prompt(rng, 64)
        async with aclosing(seq.run_turn(ids, list(range(200)), every_s=0.05)) as it:
            async for k in it:
                got += k
        return got

    ta = asyncio.create_task(run(gpu.open()))
    await clock.settle()
    tb = asyncio.create_task(run(gpu.open()))
    await clock.run_until_idle()
    assert (await ta, await tb) == (200, 200)
    assert gpu.metrics()["preemptions"] == 1


async def test_a_prefix_two_suspended_sequences_share_is_pinned_once() -> None:
    """Two sequences with the same first 64 tokens (4 shared blocks) then 64 of their own, both suspended:
    the cache holds 4 + 2 x 4 (+ their outputs') blocks, and the pinned count is those distinct blocks,
    never more than the blocks in use."""
    gpu, clock = make(pin_suspended=True)
    rng = random.Random(11)
    shared = prompt(rng, 64)
    seqs = [gpu.open(), gpu.open()]
    for seq in seqs:
        task = asyncio.create_task(collect(clock, seq, shared + prompt(rng, 64), 16))
        await clock.run_until_idle()
        await task
        seq.suspend()
    m = gpu.metrics()
    assert m["kv_blocks_pinned_suspended"] == m["kv_blocks_used"]
    assert m["kv_blocks_pinned_suspended"] == 4 + 2 * ((128 + 16) // 16 - 4)
