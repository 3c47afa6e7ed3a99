"""O(new) turns: a long-lived sequence hashes, compares, looks up and pins only its new tail, with the same
keys and the same cache state as hashing every prompt from scratch; a rewritten history is noticed."""

from __future__ import annotations

import asyncio
import random
from contextlib import aclosing
from dataclasses import replace
from typing import Any

import pytest

import sampler.gpu
from sampler.clock import FakeClock
from sampler.gpu import GpuSequence, MockGPU
from sampler.kvcache import Prompt, TokenLog, block_keys
from sampler.models import ModelSpec

BS = 16
HEADER = (100264, 882, 198)  # what Conversation.prompt() puts after the context: <|im_start|>assistant\n
CALL_HEADER = (100264, 78191, 311, 28, 2068, 198)  # <|im_start|>assistant to=grep\n: differs after 2 tokens


def make(**kw: Any) -> tuple[MockGPU, FakeClock]:
    spec = ModelSpec(
        name="t",
        time_to_first_token_ms=1.0,
        prefill_overhead_ms=1.0,
        prefill_time_per_token_ms=0.0,
        inter_token_latency_ms=0.1,
        max_num_seqs=8,
        time_factor_under_load=1.0,
        kv_cache_size=4000,
        block_size=BS,
    ).override(**kw)
    clock = FakeClock()
    return MockGPU(spec, clock), clock


async def turn(clock: FakeClock, seq: GpuSequence, prompt: Any, output: list[int]) -> None:
    async def drive() -> None:
        async with aclosing(seq.run_turn(prompt, output)) as ticks:
            async for _ in ticks:
                pass

    task = asyncio.create_task(drive())
    await clock.run_until_idle()
    await task


def cache_state(gpu: MockGPU) -> tuple[dict[int, int], list[int], int, int]:
    c = gpu.cache
    return dict(c._refs), list(c._free), c.queries, c.hits


class Rollout:
    """A conversation as the sampling loop grows it: context, then per turn the model's output (after the
    assistant header, or a call's header that differs from it) and the next appended items."""

    def __init__(self, rng: random.Random, context: int, seed: int | None = None) -> None:
        self.log = TokenLog(rng.randrange(100_000) for _ in range(context))
        self.rng = rng if seed is None else random.Random(seed)  # the turns' own draws

    def output(self) -> list[int]:
        return [self.rng.randrange(100_000) for _ in range(self.rng.randrange(0, 40))]

    def grow(self, output: list[int], call: bool) -> None:
        self.log.extend([*(CALL_HEADER if call else HEADER), *output, 100265])
        # the tool's output
        self.log.extend(self.rng.randrange(100_000) for _ in range(self.rng.randrange(1, 70)))


class CountingCache:
    """Counts the keys a cache is asked to acquire, release or look up."""

    def __init__(self, gpu: MockGPU) -> None:
        self.keys = 0
        cache = gpu.cache
        acquire, release = cache.acquire, cache.release
        counter = self

        class Refs(dict[int, int]):
            def __contains__(self, key: object) -> bool:  # what PrefixCache.match asks of every key it walks
                counter.keys += 1
                return super().__contains__(key)

        def counted_acquire(keys: Any, ttl_s: float | None = None) -> list[int]:
            self.keys += len(keys)
            return acquire(keys, ttl_s)

        def counted_release(keys: Any) -> None:
            self.keys += len(keys)
            release(keys)

        cache._refs = Refs(cache._refs)
        cache.acquire = counted_acquire  # type: ignore[method-assign]
        cache.release = counted_release  # type: ignore[method-assign]


@pytest.mark.parametrize("pin_suspended", [True, False])
async def test_same_keys_and_cache_state_as_hashing_each_prompt_whole(pin_suspended: bool) -> None:
    rng = random.Random(7)
    # 400 blocks (the context window too: 6 400 tokens); the rollout grows to ~4 000 tokens, and the other
    # sequence's 4 000–6 000 tokens do not fit beside it: blocks are evicted.
    fast_gpu, fast_clock = make(pin_suspended=pin_suspended, kv_cache_size=400)
    whole_gpu, whole_clock = make(pin_suspended=pin_suspended, kv_cache_size=400)
    fast, whole = fast_gpu.open(), whole_gpu.open()
    rollout = Rollout(rng, 700)
    full = 0
    for k in range(30):
        prompt = Prompt.of(rollout.log, HEADER)
        flat = [*rollout.log.ids, *HEADER]
        output = rollout.output()
        await turn(fast_clock, fast, prompt, output)
        await turn(whole_clock, whole, flat, output)
        assert list(fast._keys) == block_keys([*flat, *output], BS)  # the chain: prompt + output
        assert fast.last_report is not None and whole.last_report is not None
        assert replace(fast.last_report, lookup_ms=0.0) == replace(whole.last_report, lookup_ms=0.0)
        assert cache_state(fast_gpu) == cache_state(whole_gpu)
        fast.suspend()
        whole.suspend()
        if k % 5 == 4:  # another sequence puts the small cache under pressure: evictions in LRU order
            other = [rng.randrange(100_000) for _ in range(rng.randrange(4_000, 6_000))]
            others = fast_gpu.open(), whole_gpu.open()
            evictions = fast_gpu.cache.evictions
            await turn(fast_clock, others[0], other, [1, 2, 3])
            await turn(whole_clock, others[1], list(other), [1, 2, 3])
            assert cache_state(fast_gpu) == cache_state(whole_gpu)
            # full: computing and storing the other sequence evicted blocks (the running turn's own blocks
            # count against the 400 while it computes, so eviction starts before its blocks are stored)
            full += fast_gpu.cache.evictions > evictions
            for done in others:
                done.close()
        rollout.grow(output, call=rng.random() < 0.5)
    fast.close()
    whole.close()
    assert full >= 3  # the comparison ran through evictions
    assert cache_state(fast_gpu) == cache_state(whole_gpu)
    assert fast_gpu.cache.blocks_used == 0


async def test_a_turn_hashes_looks_up_and_pins_only_the_new_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per turn, the tokens hashed and the keys pinned, looked up or released do not grow with the context."""
    hashed: list[int] = []
    chain_keys = sampler.gpu.chain_keys

    def counting(tokens: Any, block_size: int, parent: int) -> list[int]:
        hashed.append(len(tokens))
        return chain_keys(tokens, block_size, parent)

    monkeypatch.setattr(sampler.gpu, "chain_keys", counting)
    touched: dict[int, list[int]] = {}
    for context in (1_024, 50_000):  # both on a block boundary: the same tails fall on the same blocks
        gpu, clock = make()
        counted = CountingCache(gpu)
        seq = gpu.open()
        rollout = Rollout(random.Random(context), context, seed=3)
        output = [5] * 30
        await turn(clock, seq, Prompt.of(rollout.log, HEADER), output)
        for k in range(6):
            rollout.grow(output, call=k % 2 == 0)
            hashed.clear()
            counted.keys = 0
            await turn(clock, seq, Prompt.of(rollout.log, HEADER), output)
            assert seq.last_report is not None and seq.last_report.cached_tokens > context - BS
            touched.setdefault(context, []).append(sum(hashed) + counted.keys)
        assert max(hashed, default=0) < 200  # the new tail only, never the context
        seq.close()
    # The same rollout tail costs the same at 50 k tokens as at 1 k.
    assert touched[50_000] == touched[1_024]


async def test_a_rewritten_history_is_hashed_again() -> None:
    gpu, clock = make()
    seq = gpu.open()
    rng = random.Random(11)
    log = TokenLog(rng.randrange(100_000) for _ in range(400))
    await turn(clock, seq, Prompt.of(log, HEADER), [7] * 20)
    log.extend([*HEADER, *[7] * 20, 100265, 9, 9, 9])
    log.rewrite(150, [rng.randrange(100_000) for _ in range(300)])  # history edited from token 150 on
    prompt = Prompt.of(log, HEADER)
    await turn(clock, seq, prompt, [8] * 5)
    flat = [*log.ids, *HEADER]
    assert list(seq._keys) == block_keys([*flat, *[8] * 5], BS)
    # only the kept blocks hit
    assert seq.last_report is not None and seq.last_report.cached_tokens == 150 // BS * BS


async def test_a_prompt_taken_before_a_rewrite_is_not_trusted() -> None:
    gpu, clock = make()
    seq = gpu.open()
    log = TokenLog(range(1000, 1400))
    await turn(clock, seq, Prompt.of(log, HEADER), [7] * 20)
    stale = Prompt.of(log, HEADER)
    log.rewrite(10, range(5000, 5300))  # the prompt's first 400 ids are not what they were
    assert not stale.current
    await turn(clock, seq, Prompt.of(log, HEADER), [1])
    assert list(seq._keys) == block_keys([*log.ids, *HEADER, 1], BS)
    assert seq.last_report is not None and seq.last_report.cached_tokens == 0


async def test_plain_lists_still_hit_the_prefix_cache() -> None:
    gpu, clock = make()
    seq = gpu.open()
    prompt = list(range(100, 300))
    await turn(clock, seq, prompt, [5] * 40)
    await turn(clock, seq, [*prompt, *[5] * 40, 1, 2, 3], [1])
    assert seq.last_report is not None and seq.last_report.cached_tokens == 240 // BS * BS


def test_token_log_and_prompt() -> None:
    log = TokenLog([1, 2, 3])
    prompt = Prompt.of(log, (8, 9))
    log.extend([4, 5])
    assert (
        len(prompt) == 5
        and list(prompt.tokens_from(1)) == [2, 3, 8, 9]
        and list(prompt.tokens_from(4)) == [9]
    )
    assert prompt.current and log.ids.itemsize == 4
    # A Sequence, as an engine in another process reads it (it sends the prompt's ids whole).
    assert list(prompt) == [1, 2, 3, 8, 9] and prompt[0] == 1 and prompt[3] == 8 and prompt[-1] == 9
    assert list(prompt[1:4]) == [2, 3, 8] and list(prompt[::2]) == [1, 3, 9] and 8 in prompt
    with pytest.raises(IndexError):
        prompt[5]
    log.rewrite(2)
    assert not prompt.current and list(log.ids) == [1, 2] and log.rewrites == 1
