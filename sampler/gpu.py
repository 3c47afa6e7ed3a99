"""The mock GPU: batch slots, a prefix KV cache and deadline-paced decoding behind one engine.

One ``GpuSequence`` per response. A long-lived response keeps its sequence across turns, so its
KV blocks (pinned while it waits for a tool) make the resumed turn's prefill cheap.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Sequence
from dataclasses import asdict, dataclass, field

from sampler.batch import BatchSlots, EngineOverloaded
from sampler.clock import Clock, RealClock
from sampler.kvcache import BlockKey, PrefixCache, block_keys
from sampler.models import ContextLengthExceeded, Limits, ModelSpec, check_prompt
from sampler.timing import Timing

__all__ = ["ContextLengthExceeded", "EngineFailure", "EngineOverloaded", "EngineReport", "GpuSequence", "MockGPU", "check_prompt"]


class EngineFailure(Exception):
    """An injected engine fault (``fail-rate``): the turn dies mid-stream, as a crashed worker would."""


@dataclass
class EngineReport:
    prompt_tokens: int
    cached_tokens: int
    prefill_ms: float  # modelled, load factor and jitter included: TTFT minus this is API overhead
    queue_wait_ms: float  # waiting for a batch slot
    decode_ms: float  # modelled: first token's deadline to the last one's
    output_tokens: int
    # Spans the API side measured around the engine call (``engine_hop`` for an engine in another
    # process); empty in process. They join the turn's phase breakdown.
    phases_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, float | int]:
        """The engine's own figures (the API side's spans are not the engine's to report)."""
        return {k: v for k, v in asdict(self).items() if k != "phases_ms"}


class MockGPU:
    def __init__(self, spec: ModelSpec, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock: Clock = clock or RealClock()
        self.timing = Timing(spec)
        self.cache = PrefixCache(spec.kv_cache_size, spec.block_size)
        self.slots = BatchSlots(spec.max_num_seqs, spec.max_waiting)
        # Its own stream, so turning failures on does not change the jitter a seed produces.
        self.fail_rng = random.Random(f"fail:{spec.seed}")

    def open(self, keep_warm: bool = True) -> GpuSequence:
        """``keep_warm`` is for engines in another process (``sampler.engine``): in process a sequence
        holds its blocks between turns anyway, as ``pin-suspended`` says."""
        return GpuSequence(self)

    def metrics(self) -> dict[str, float]:
        c = self.cache
        return {
            "running": float(self.slots.running),
            "waiting": float(self.slots.waiting),
            "kv_usage": c.usage,
            "kv_blocks_used": float(c.blocks_used),
            "kv_blocks_stored": float(c.blocks_stored),
            "prefix_cache_hit_rate": c.hit_rate,
            "prefix_cache_queries": float(c.queries),
            "prefix_cache_hits": float(c.hits),
        }


class GpuSequence:
    def __init__(self, gpu: MockGPU) -> None:
        self._gpu = gpu
        self.last_report: EngineReport | None = None
        # The turn in progress once its prefill started (prompt, cached, prefill, queue wait; decode and
        # output so far): what a turn cut short still bills. Reset when the next turn starts.
        self.live: EngineReport | None = None
        self._held: list[BlockKey] = []  # blocks pinned between turns
        self._turn_pins: list[BlockKey] = []  # cached blocks pinned while a turn computes on them
        self._has_slot = False
        self._busy = False
        self._closed = False
        # The last hashed token chain: the next prompt extends it, so only new blocks are hashed.
        self._chain_tokens: list[int] = []
        self._chain_keys: list[BlockKey] = []

    async def run_turn(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> AsyncGenerator[int, None]:
        """Yield how many output tokens became due at each wake-up (each ≥ 1, summing to
        ``len(output_ids)``); ``last_report`` is set when the turn completes. Iterate it under
        ``contextlib.aclosing`` so an abandoned turn gives its slot back at once.

        Raises ContextLengthExceeded (the prompt can never fit) and EngineOverloaded (queue full) before
        anything is yielded, EngineFailure (injected fault) at any point.
        """
        if self._closed or self._busy:
            raise RuntimeError("sequence closed" if self._closed else "a turn is already running")
        gpu, clock, spec = self._gpu, self._gpu.clock, self._gpu.spec
        self.live = None
        check_prompt(spec.limits, len(prompt_ids))  # the loop checked already: this is the engine's own admission
        self._busy = True
        try:
            t_arrive = clock.now()
            await gpu.slots.acquire()
            self._has_slot = True
            t_start = clock.now()
            keys = self._keys_for(prompt_ids)
            n_cached = gpu.cache.match(keys, len(prompt_ids))
            self._turn_pins = gpu.cache.acquire(keys[:n_cached])
            cached = n_cached * spec.block_size
            prefill_ms = gpu.timing.prefill_ms(len(prompt_ids) - cached, gpu.slots.running)
            t_first = t_start + prefill_ms / 1000.0
            live = self.live = EngineReport(len(prompt_ids), cached, prefill_ms, (t_start - t_arrive) * 1000.0, 0.0, 0)

            n = len(output_ids)
            fail_at = gpu.fail_rng.randrange(n) if n and gpu.fail_rng.random() < spec.fail_rate else -1
            sent, due, last_due = 0, t_first, t_first
            if n == 0:
                await clock.sleep_until(t_first)
            while sent < n:
                if sent == fail_at:
                    raise EngineFailure(f"injected engine failure after {sent} of {n} tokens")
                now = clock.now()
                if due > now:
                    await clock.sleep_until(due)
                    continue
                k = 0
                # Release every token whose deadline has passed; the next interval is drawn with
                # the load factor of the moment, so a batch that fills up slows decoding down.
                while sent + k < n and due <= now and sent + k != fail_at:
                    k += 1
                    last_due = due
                    if sent + k < n:
                        due += gpu.timing.itl_s(gpu.slots.running)
                if k:
                    sent += k
                    live.output_tokens, live.decode_ms = sent, (last_due - t_first) * 1000.0
                    yield k
                    if self._closed:
                        return  # closed under our feet: the caller wants nothing more

            self._store(prompt_ids, output_ids)
            self.last_report = EngineReport(
                prompt_tokens=len(prompt_ids),
                cached_tokens=cached,
                prefill_ms=prefill_ms,
                queue_wait_ms=(t_start - t_arrive) * 1000.0,
                decode_ms=(last_due - t_first) * 1000.0,
                output_tokens=n,
            )
        finally:
            self._end_turn()

    @property
    def limits(self) -> Limits:
        """The model's context window (KV cache included) and max output per call."""
        return self._gpu.spec.limits

    def suspend(self) -> None:
        """Between turns, waiting for a tool. With ``pin-suspended`` off the blocks stay stored
        but become evictable: pressure from other sequences may take them before the resume."""
        if not self._gpu.spec.pin_suspended:
            self._gpu.cache.release(self._held)
            self._held = []

    def close(self) -> None:
        """Give everything back. Idempotent; safe while a turn is suspended at a yield."""
        self._closed = True
        self._end_turn()
        self._gpu.cache.release(self._held)
        self._held = []

    def _keys_for(self, tokens: Sequence[int]) -> list[BlockKey]:
        bs = self._gpu.spec.block_size
        reuse = len(self._chain_keys)
        if list(tokens[: reuse * bs]) != self._chain_tokens[: reuse * bs]:
            reuse = 0  # the history was rewritten (truncation, edits): hash from scratch
        keys = block_keys(tokens, bs, self._chain_keys[:reuse])
        self._chain_tokens, self._chain_keys = list(tokens), keys
        return keys

    def _store(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        # Hold the new chain before letting go of the old one, so shared blocks never hit ref 0.
        held = self._gpu.cache.acquire(self._keys_for([*prompt_ids, *output_ids]))
        self._gpu.cache.release(self._held)
        self._held = held

    def _end_turn(self) -> None:
        self._gpu.cache.release(self._turn_pins)
        self._turn_pins = []
        if self._has_slot:
            self._has_slot = False
            self._gpu.slots.release()
        self._busy = False
