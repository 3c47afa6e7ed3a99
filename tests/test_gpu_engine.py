"""MockGPU end to end on a FakeClock: pacing, reports, the prefix cache across turns, slots."""

import asyncio
import itertools
import math
from collections.abc import Callable
from contextlib import aclosing

import pytest

from sampler.clock import Clock, FakeClock, RealClock
from sampler.engine import EngineFailure, EngineOverloaded, Pacing
from sampler.gpu import GpuSequence, MockGPU
from sampler.models import ModelSpec

Emits = list[tuple[float, int]]


def make(**kw: object) -> tuple[MockGPU, FakeClock]:
    spec = ModelSpec(
        name="t",
        time_to_first_token_ms=50.0,
        prefill_overhead_ms=30.0,
        prefill_time_per_token_ms=0.25,
        inter_token_latency_ms=1.0,
        max_num_seqs=4,
        time_factor_under_load=1.0,
        kv_cache_size=1000,
    ).override(**kw)
    clock = FakeClock()
    return MockGPU(spec, clock), clock


async def collect(
    clock: FakeClock, seq: GpuSequence, prompt: list[int], n_out: int, base: int = 10_000
) -> Emits:
    got: Emits = []
    async with aclosing(seq.run_turn(prompt, list(range(base, base + n_out)))) as it:
        async for k in it:
            got.append((clock.now(), k))
    return got


def times(emits: Emits) -> list[float]:
    return [t for t, k in emits for _ in range(k)]


async def run(clock: FakeClock, seq: GpuSequence, prompt: list[int], n_out: int) -> Emits:
    task = asyncio.create_task(collect(clock, seq, prompt, n_out))
    await clock.run_until_idle()
    return await task


async def test_single_turn_exact_timing_and_report() -> None:
    gpu, clock = make()
    seq = gpu.open()
    emits = await run(clock, seq, list(range(100)), 5)
    t_first = (30.0 + 100 * 0.25) / 1000
    assert times(emits) == pytest.approx([t_first + i * 0.001 for i in range(5)], abs=1e-12)
    r = seq.last_report
    assert r is not None
    report = r.to_dict()
    assert report.pop("lookup_ms") > 0  # real CPU time, even on a FakeClock
    assert r.written_by_ttl == {}  # a sequence without breakpoints writes without lifetimes
    assert report == pytest.approx(
        {
            "prompt_tokens": 100,
            "cached_tokens": 0,
            "prefill_ms": 55.0,
            "queue_wait_ms": 0.0,
            "decode_ms": 4.0,
            "output_tokens": 5,
            "first_late_ms": 0.0,
            "written_tokens": 96,  # the prompt's 6 full blocks, none stored before
            "expired_tokens": 0,
            "block_size": 16,
        }
    )


async def test_several_due_tokens_per_coarse_wake_up() -> None:
    gpu, clock = make(
        tokens_per_s=4000, prefill_overhead_ms=0.0, prefill_time_per_token_ms=0.0, time_to_first_token_ms=1.0
    )
    task = asyncio.create_task(collect(clock, gpu.open(), [1, 2, 3], 12))
    await clock.jump(0.0011)
    for _ in range(3):
        await clock.jump(0.001)  # wake-ups at 1.1, 2.1, 3.1, 4.1 ms; due at 1 ms, then every 250 µs
    emits = await task
    assert [k for _, k in emits] == [1, 4, 4, 3]


@pytest.mark.slow
async def test_no_drift_over_10000_tokens_at_4000_tps() -> None:
    gpu, clock = make(tokens_per_s=4000)
    seq = gpu.open()
    emits = await run(clock, seq, [7] * 16, 10_000)
    t_first = (30.0 + 16 * 0.25) / 1000
    ts = times(emits)
    assert len(ts) == 10_000
    assert ts[-1] == pytest.approx(t_first + 9_999 * 0.00025, abs=1e-9)
    assert max(abs(t - (t_first + i * 0.00025)) for i, t in enumerate(ts)) < 1e-9
    assert seq.last_report is not None and seq.last_report.decode_ms == pytest.approx(9_999 * 0.25, abs=1e-6)


async def test_no_drift_when_the_consumer_wakes_late() -> None:
    """Irregular, late wake-ups release every due token at once; the schedule does not shift."""
    gpu, clock = make(
        tokens_per_s=4000, prefill_overhead_ms=0.0, prefill_time_per_token_ms=0.0, time_to_first_token_ms=1.0
    )
    task = asyncio.create_task(collect(clock, gpu.open(), [1], 10_000))
    step = 0
    while not task.done():
        step += 1
        await clock.jump(0.0007 if step % 3 else 0.0031)
    emits = await task
    assert max(k for _, k in emits) > 10  # the long gaps released many tokens at once
    for t, _ in emits:  # everything due by each wake-up was released, nothing more
        released = sum(k for t2, k in emits if t2 <= t)
        due = (t - 0.001) / 0.00025 + 1  # tokens whose deadline is <= t (float ulps either way)
        assert min(10_000, math.floor(due - 1e-6)) <= released <= min(10_000, math.floor(due + 1e-6))


async def test_concurrent_prefills_share_steps_and_decodes_slow_with_the_batch() -> None:
    """Both turns dispatch (30 ms, holding their slots), then prefill in one step: 80 tokens × 0.25 ms =
    20 ms, so both first tokens come at 50 ms (alone, 40 ms). Then they decode together, a step of two
    decodes costing ITL × L(2) = 1 × 1.5 ms (f = 2, max-num-seqs 3); once b's 3 tokens are out, a's steps
    are 1 ms again."""
    gpu, clock = make(time_factor_under_load=2.0, max_num_seqs=3)
    a, b = gpu.open(), gpu.open()
    ta = asyncio.create_task(collect(clock, a, [1] * 40, 200))
    await clock.settle()
    tb = asyncio.create_task(collect(clock, b, [2] * 40, 3))
    await clock.run_until_idle()
    tb_, ta_ = times(await tb), times(await ta)
    for seq in (a, b):
        assert seq.last_report is not None and seq.last_report.prefill_ms == pytest.approx(50.0)
    assert tb_ == pytest.approx([0.050, 0.0515, 0.053], abs=1e-12)
    assert ta_[:3] == pytest.approx(tb_, abs=1e-12)  # the same steps: one wake-up for both
    assert ta_[3:6] == pytest.approx([0.054, 0.055, 0.056], abs=1e-12)


async def test_sequences_decoding_together_release_their_tokens_at_the_batchs_steps() -> None:
    """One decode step serves the whole batch: after their first tokens, concurrent sequences' tokens
    fall due at the same instants (the clock wakes once per step for all of them), each sequence at the
    model's rate; and a sequence alone decodes at t_first + k × ITL exactly. A sequence that becomes ready
    mid-step (its dispatch ends 0.37 ms into a step) gets its (free) prefill chunk in the next step, its
    first token at that step's end, and its second one step later."""
    gpu, clock = make(prefill_overhead_ms=0.0, prefill_time_per_token_ms=0.0)
    seqs = [gpu.open() for _ in range(4)]
    tasks = []
    for i, seq in enumerate(seqs):
        tasks.append(asyncio.create_task(collect(clock, seq, [i], 200, base=100 * i)))
        await clock.settle()
        await clock.jump(0.00037)  # joins between two steps
    await clock.run_until_idle()
    streams = [times(await t) for t in tasks]
    lo, hi = (
        max(ts[1] for ts in streams),
        min(ts[-1] for ts in streams),
    )  # every one past its first token, none done
    together = [{t for t in ts if lo <= t <= hi} for ts in streams]
    assert len(together[0]) > 100 and together[0] == together[1] == together[2] == together[3]
    for ts in streams:
        gaps = [b - a for a, b in itertools.pairwise(ts[2:])]
        assert gaps == pytest.approx([0.001] * len(gaps), abs=1e-9)
        assert ts[1] - ts[0] == pytest.approx(0.001, abs=1e-9)
    alone, clock2 = make(prefill_overhead_ms=0.0, prefill_time_per_token_ms=0.0)
    ts = times(await run(clock2, alone.open(), [1], 50))
    assert ts == pytest.approx([ts[0] + 0.001 * k for k in range(50)], abs=1e-9)


async def test_resumed_turn_hits_the_prefix_cache() -> None:
    gpu, clock = make()
    seq = gpu.open()
    prompt = list(range(100))
    await run(clock, seq, prompt, 20)
    # Next prompt = previous prompt + output + new items: 120 known tokens = 7 full blocks.
    prompt2 = prompt + list(range(10_000, 10_020)) + list(range(500, 530))
    await run(clock, seq, prompt2, 1)
    r = seq.last_report
    assert r is not None and r.cached_tokens == 112
    assert r.prefill_ms == pytest.approx(30.0 + (150 - 112) * 0.25)
    m = gpu.metrics()
    assert m["prefix_cache_hits"] == 112 and m["prefix_cache_queries"] == 250
    assert m["prefix_cache_hit_rate"] == pytest.approx(112 / 250)


async def test_other_sequences_share_prefix_blocks_by_chained_hash() -> None:
    gpu, clock = make()
    await run(clock, gpu.open(), list(range(64)), 1)
    seq = gpu.open()
    changed_second_block = list(range(64))
    changed_second_block[20] = -1
    await run(clock, seq, [*changed_second_block, 1], 1)
    # blocks 2, 3 are equal but chain on block 1
    assert seq.last_report is not None and seq.last_report.cached_tokens == 16


async def test_pinned_suspended_sequence_survives_pressure() -> None:
    gpu, clock = make(kv_cache_size=12, block_size=16)
    seq = gpu.open()
    prompt = list(range(96))
    await run(clock, seq, prompt, 32)  # 128 tokens = 8 blocks pinned
    seq.suspend()
    await run(clock, gpu.open(), list(range(1000, 1000 + 64)), 16)  # wants 5 blocks, 4 free
    await run(clock, seq, [*prompt, *range(10_000, 10_032), 5], 1)
    assert seq.last_report is not None and seq.last_report.cached_tokens == 128


async def test_unpinned_suspended_sequence_pays_prefill_for_what_was_evicted() -> None:
    gpu, clock = make(kv_cache_size=12, block_size=16, pin_suspended=False)
    seq = gpu.open()
    prompt = list(range(96))
    await run(clock, seq, prompt, 32)
    seq.suspend()
    assert gpu.metrics()["kv_blocks_used"] == 0
    await run(clock, gpu.open(), list(range(1000, 1000 + 64)), 16)  # 5 blocks: evicts 1 of ours (our tail)
    await run(clock, seq, [*prompt, *range(10_000, 10_032), 5], 1)
    r = seq.last_report
    assert r is not None and r.cached_tokens == 112
    assert r.prefill_ms == pytest.approx(30.0 + (129 - 112) * 0.25)


async def test_unpinned_without_pressure_still_hits() -> None:
    gpu, clock = make(pin_suspended=False)
    seq = gpu.open()
    await run(clock, seq, list(range(96)), 32)
    seq.suspend()
    await run(clock, seq, [*range(96), *range(10_000, 10_032), 5], 1)
    assert seq.last_report is not None and seq.last_report.cached_tokens == 128


async def test_fifo_queue_past_max_num_seqs() -> None:
    gpu, clock = make(
        max_num_seqs=2, prefill_overhead_ms=0.0, prefill_time_per_token_ms=0.0, time_to_first_token_ms=10.0
    )
    seqs = [gpu.open() for _ in range(4)]
    tasks = []
    for i, s in enumerate(seqs):
        tasks.append(asyncio.create_task(collect(clock, s, [i], 1 + 5 * (i == 0))))  # seq 0 decodes longer
        await clock.settle()
    m = gpu.metrics()
    assert (m["running"], m["waiting"]) == (2, 2)
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    waits = [s.last_report.queue_wait_ms for s in seqs if s.last_report]
    # seq 1 ends at 10 ms -> seq 2 starts; seq 0 ends at 15 ms -> seq 3 starts.
    assert waits == pytest.approx([0.0, 0.0, 10.0, 15.0])
    assert gpu.metrics()["running"] == 0


async def test_engine_overloaded_past_max_waiting() -> None:
    gpu, clock = make(max_num_seqs=1, max_waiting=1)
    running = asyncio.create_task(collect(clock, gpu.open(), [1], 3))
    queued = asyncio.create_task(collect(clock, gpu.open(), [2], 3))
    await clock.settle()
    with pytest.raises(EngineOverloaded):
        await collect(clock, gpu.open(), [3], 3)
    await clock.run_until_idle()
    await asyncio.gather(running, queued)


async def test_cancellation_mid_turn_releases_the_slot() -> None:
    gpu, clock = make(max_num_seqs=1)
    first = gpu.open()
    t1 = asyncio.create_task(collect(clock, first, list(range(40)), 1000))
    t2 = asyncio.create_task(collect(clock, gpu.open(), [5], 2))
    await clock.advance(0.050)  # first is decoding
    assert gpu.metrics()["waiting"] == 1
    # Nothing cached to pin, but the running turn holds the KV of its context: 40 prompt tokens and the 11
    # tokens of 40, 41, … 50 ms, with the 12th's being computed = 52 tokens = 4 blocks of 16.
    assert gpu.metrics()["kv_blocks_used"] == 4
    t1.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t1
    await clock.run_until_idle()
    await t2
    assert gpu.metrics()["running"] == 0 and first.last_report is None


async def test_breaking_out_releases_the_slot_and_turn_pins() -> None:
    gpu, clock = make()
    seq = gpu.open()
    await run(clock, seq, list(range(64)), 16)  # 5 blocks held

    async def partial() -> None:
        async with aclosing(seq.run_turn([*range(64), *range(10_000, 10_016), 1], [1, 2, 3])) as it:
            async for _ in it:
                break

    task = asyncio.create_task(partial())
    await clock.run_until_idle()
    await task
    m = gpu.metrics()
    assert m["running"] == 0 and m["kv_blocks_used"] == 5


async def test_close_is_idempotent_and_unpins() -> None:
    gpu, clock = make()
    seq = gpu.open()
    await run(clock, seq, list(range(64)), 16)
    assert gpu.metrics()["kv_blocks_used"] == 5
    seq.close()
    seq.close()
    assert gpu.metrics()["kv_blocks_used"] == 0 and gpu.metrics()["kv_blocks_stored"] == 5
    with pytest.raises(RuntimeError):
        await collect(clock, seq, [1], 1)


async def test_close_while_suspended_at_a_yield() -> None:
    gpu, clock = make(max_num_seqs=1)
    seq = gpu.open()
    it = seq.run_turn(list(range(40)), list(range(10)))
    task = asyncio.create_task(it.__anext__())
    await clock.run_until_idle()
    assert await task == 1
    seq.close()
    assert gpu.metrics()["running"] == 0
    with pytest.raises(StopAsyncIteration):
        await it.__anext__()
    assert gpu.metrics()["kv_blocks_used"] == 0 and seq.last_report is None


async def test_injected_failure_releases_everything() -> None:
    gpu, clock = make(fail_rate=1.0)
    seq = gpu.open()
    task = asyncio.create_task(collect(clock, seq, list(range(40)), 50))
    await clock.run_until_idle()
    with pytest.raises(EngineFailure):
        await task
    assert gpu.metrics()["running"] == 0 and gpu.metrics()["kv_blocks_used"] == 0


async def test_empty_output_still_pays_prefill() -> None:
    gpu, clock = make()
    seq = gpu.open()
    assert await run(clock, seq, list(range(40)), 0) == []
    assert clock.now() == pytest.approx(0.040) and seq.last_report is not None


async def test_one_turn_at_a_time() -> None:
    gpu, clock = make()
    seq = gpu.open()
    task = asyncio.create_task(collect(clock, seq, [1], 5))
    await clock.settle()
    with pytest.raises(RuntimeError):
        await collect(clock, seq, [1], 5)
    await clock.run_until_idle()
    await task


@pytest.mark.parametrize("timerfd", [True, False])
async def test_real_clock_never_returns_before_the_deadline(timerfd: bool) -> None:
    clock = RealClock(timerfd=timerfd)  # tests/test_clock.py covers it on both event loops
    for dt in (-1.0, 0.0, 0.0003, 0.002):
        t = clock.now() + dt
        await clock.sleep_until(t)
        assert clock.now() >= t


# ---- run_paced: the owner waits on the clock's timer and releases the tokens from there
# ---------------------


async def collect_paced(
    clock: Clock, seq: GpuSequence, prompt: list[int], n_out: int, limit: Callable[[int], int]
) -> tuple[Emits, Emits]:
    """Iterate ``run_paced`` as an owner does (``ResponseDriver._stream`` is the real one): at each ``Pacing``
    wait on its timer, release up to ``limit(deadlines so far)`` tokens at each deadline (0: resume the turn
    instead), and resume the turn once nothing is left to wait for. (yielded, released), with times."""
    yielded: Emits = []
    released: Emits = []
    deadlines = itertools.count()

    async def wait(pacing: Pacing) -> None:
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def fire() -> None:
            if woken.done():
                return
            k = pacing.release(limit(next(deadlines)))
            if k:
                released.append((clock.now(), k))
                at = pacing.next_due()
                if at is not None:
                    calls.append(pacing.timer.call_at(at, fire))
                    return
            woken.set_result(None)

        at = pacing.next_due()
        assert at is not None
        calls = [pacing.timer.call_at(at, fire)]
        try:
            await woken
        finally:
            calls[-1].cancel()

    async with aclosing(seq.run_paced(prompt, list(range(10_000, 10_000 + n_out)))) as it:
        async for due in it:
            if isinstance(due, int):
                yielded.append((clock.now(), due))
            else:
                await wait(due)
    return yielded, released


async def test_the_owner_releases_every_later_wake_up_at_the_same_times_with_the_same_report() -> None:
    plain_gpu, plain_clock = make(itl_jitter_std=0.2, seed=7)
    plain = plain_gpu.open()
    expected = times(await run(plain_clock, plain, list(range(100)), 40))
    gpu, clock = make(itl_jitter_std=0.2, seed=7)
    seq = gpu.open()
    task = asyncio.create_task(collect_paced(clock, seq, list(range(100)), 40, lambda _i: 1000))
    await clock.run_until_idle()
    yielded, released = await task
    assert yielded == [(expected[0], 1)]  # the first token wakes the task (it opens the item); nothing after
    assert times(yielded) + times(released) == pytest.approx(expected, abs=1e-12)
    assert seq.last_report is not None and plain.last_report is not None
    assert {**seq.last_report.to_dict(), "lookup_ms": 0} == pytest.approx(
        {**plain.last_report.to_dict(), "lookup_ms": 0}
    )
    assert clock.pending == 0 and gpu.metrics()["running"] == 0


async def test_what_the_owner_leaves_is_yielded_when_it_was_due() -> None:
    gpu, clock = make()
    seq = gpu.open()
    task = asyncio.create_task(
        collect_paced(clock, seq, list(range(40)), 30, lambda i: 0 if i % 3 == 2 else 1)
    )
    await clock.run_until_idle()
    yielded, released = await task
    t_first = 0.040
    assert times(yielded)[0] == pytest.approx(t_first)
    assert sorted(times(yielded) + times(released)) == pytest.approx(
        [t_first + 0.001 * i for i in range(30)], abs=1e-9
    )
    # each token once
    assert len(yielded) > 5 and sum(k for _, k in yielded) + sum(k for _, k in released) == 30


async def test_a_release_takes_no_more_than_its_limit_and_the_rest_stays_due() -> None:
    gpu, clock = make()
    seq = gpu.open()
    got: list[int | None] = []
    paused, go = asyncio.Event(), asyncio.Event()

    async def iterate() -> None:
        async with aclosing(seq.run_paced(list(range(40)), list(range(20)))) as it:
            async for due in it:
                if isinstance(due, int):
                    got.append(due)
                    continue
                if not paused.is_set():
                    paused.set()
                    await go.wait()  # ten steps pass with nobody releasing: ten tokens are due
                    at = due.next_due()
                    assert at is not None and at < clock.now()  # due already (a late wake-up)
                    got.append(due.release(3))
                    got.append(None)

    task = asyncio.create_task(iterate())
    while not paused.is_set():
        await clock.advance(0.0005)
    await clock.advance(0.0105)
    go.set()
    await clock.run_until_idle()
    await task
    assert got[:4] == [1, 3, None, 7]  # the turn, resumed, yields the other seven at once
    assert sum(k for k in got if k) == 20


async def test_a_task_cancelled_while_the_owner_streams_leaves_no_timer_and_no_slot() -> None:
    gpu, clock = make(max_num_seqs=1)
    seq = gpu.open()
    released: Emits = []

    async def collect() -> None:
        _yielded, got = await collect_paced(clock, seq, list(range(40)), 1000, lambda _i: 1000)
        released.extend(got)

    task = asyncio.create_task(collect())
    await clock.advance(0.060)
    assert clock.pending == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.pending == 0 and gpu.metrics()["running"] == 0


async def test_an_injected_failure_and_a_close_reach_the_task_while_the_owner_streams() -> None:
    gpu, clock = make(fail_rate=1.0, seed=3)
    seq = gpu.open()
    task = asyncio.create_task(collect_paced(clock, seq, list(range(40)), 200, lambda _i: 1000))
    await clock.run_until_idle()
    with pytest.raises(EngineFailure, match=r"after (\d+) of 200"):
        await task
    assert gpu.metrics()["running"] == 0

    gpu2, clock2 = make()
    closing = gpu2.open()
    task = asyncio.create_task(collect_paced(clock2, closing, list(range(40)), 200, lambda _i: 1000))
    await clock2.advance(0.050)
    closing.close()
    await clock2.run_until_idle()
    yielded, _released = await task
    assert yielded == [(pytest.approx(0.040), 1)]
    assert gpu2.metrics()["running"] == 0 and closing.last_report is None


async def test_run_turn_and_a_clock_without_a_timer_yield_counts_only() -> None:
    gpu, clock = make()
    seq = gpu.open()
    emits = await run(clock, seq, list(range(40)), 20)
    # run_turn: ints, slept in the task (``collect`` would fail otherwise)
    assert sum(k for _, k in emits) == 20

    gpu = MockGPU(
        make()[0].spec.override(
            prefill_overhead_ms=1.0, prefill_time_per_token_ms=0.0, inter_token_latency_ms=0.2
        ),
        RealClock(timerfd=False),
    )
    seq = gpu.open()
    got: list[object] = []
    async with aclosing(seq.run_paced([1, 2, 3], list(range(10)))) as it:
        async for due in it:
            got.append(due)
    assert all(isinstance(k, int) for k in got) and sum(k for k in got if isinstance(k, int)) == 10


async def test_resuming_a_paced_turn_at_once_sleeps_in_the_task() -> None:
    """An owner that does not wait (resumes at once at every ``Pacing``) gets run_turn's counts and times."""
    plain_gpu, plain_clock = make(itl_jitter_std=0.2, seed=5)
    expected = await run(plain_clock, plain_gpu.open(), list(range(40)), 25)
    gpu, clock = make(itl_jitter_std=0.2, seed=5)
    seq = gpu.open()

    async def resume_at_once() -> Emits:
        got: Emits = []
        async with aclosing(seq.run_paced(list(range(40)), list(range(25)))) as it:
            async for due in it:
                if isinstance(due, int):
                    got.append((clock.now(), due))
        return got

    task = asyncio.create_task(resume_at_once())
    await clock.run_until_idle()
    assert times(await task) == pytest.approx(times(expected), abs=1e-12)


async def test_written_tokens_are_the_prompt_blocks_the_cache_stored() -> None:
    """A turn writes the prompt's full blocks it found missing; a later prompt on the same prefix reads
    them (cached) and writes only its own new blocks; a sequence with another salt shares none."""
    gpu, clock = make()
    first = gpu.open()
    await run(clock, first, list(range(100)), 4)  # 6 full blocks stored
    assert first.last_report is not None
    assert (first.last_report.cached_tokens, first.last_report.written_tokens) == (0, 96)
    first.close()
    again = gpu.open()
    await run(clock, again, [*range(100), *range(500, 540)], 4)  # 140 tokens: 8 full blocks
    assert again.last_report is not None
    assert (again.last_report.cached_tokens, again.last_report.written_tokens) == (96, 32)
    again.close()
    salted = gpu.open(salt="12345")
    await run(clock, salted, list(range(100)), 4)
    assert salted.last_report is not None
    assert (salted.last_report.cached_tokens, salted.last_report.written_tokens) == (0, 96)
    salted.close()
    stored = gpu.cache.blocks_stored
    resalted = gpu.open(salt="12345")
    await run(clock, resalted, list(range(100)), 0)  # no output: a prewarm's turn reads what it wrote
    assert resalted.last_report is not None
    assert (resalted.last_report.cached_tokens, resalted.last_report.written_tokens) == (96, 0)
    assert gpu.cache.blocks_stored == stored
