"""The mock GPU: batch slots, a prefix KV cache and deadline-paced decoding behind one engine.

One ``GpuSequence`` per response. A long-lived response keeps its sequence across turns, so its
KV blocks (pinned while it waits for a tool) make the resumed turn's prefill cheap.

Decoding runs on the batch's step clock (``MockGPU.next_step``), as a GPU's decode step serves every
running sequence at once: a sequence's first token is due when its prefill ends, each later one at a step
of the batch's, and the steps are the model's inter-token intervals at the batch's size. A sequence alone
decodes exactly as ``t_first + Σ ITL``; sequences decoding together release their tokens at the same
instants, so the clock wakes once per step for the whole batch, not once per sequence per token.

A turn costs the server O(new tokens), not O(context), when its prompt is a ``Prompt`` over the
conversation's append-only ``TokenLog`` (as the sampling loop passes it): the sequence keeps its chain's
block keys and the few tokens past the log's part of it, so the next prompt is compared, hashed, looked
up and pinned from where the history could have changed on — the blocks it already holds are neither
rehashed nor looked up nor re-counted. A plain token list (or a rewritten log) is hashed from scratch;
the keys are the same either way (``tests/test_gpu_hashing.py``).

A turn run with ``run_paced`` (``sampler.engine.PacedSequence``) does not sleep between its wake-ups itself:
after each yielded count it yields its pace (``_Pace``, the turn's ``Pacing``), so that its owner waits on
the clock's timer and releases the next tokens from there, with no task woken per token.
"""

from __future__ import annotations

import bisect
import random
import time
from array import array
from collections.abc import AsyncGenerator, Sequence
from typing import cast

from sampler.batch import BatchSlots
from sampler.clock import Clock, RealClock, Timer
from sampler.engine import EngineFailure, EngineReport, Pacing
from sampler.kvcache import BlockKey, PrefixCache, Prompt, TokenLog, chain_keys, tokens_from
from sampler.models import ModelLimits, ModelSpec, check_prompt
from sampler.timing import Timing

__all__ = ["GpuSequence", "MockGPU"]


class MockGPU:
    def __init__(self, spec: ModelSpec, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock: Clock = clock or RealClock()
        self.timing = Timing(spec)
        self.cache = PrefixCache(spec.kv_cache_size, spec.block_size)
        self.slots = BatchSlots(spec.max_num_seqs, spec.max_waiting)
        # Its own stream, so turning failures on does not change the jitter a seed produces.
        self.fail_rng = random.Random(f"fail:{spec.seed}")
        # The batch's decode steps (``next_step``): the latest ones, ascending (they restart after a quiet
        # spell).
        self._steps: list[float] = []

    def next_step(self, due: float) -> float:
        """When the token after one due at ``due`` is due. On the batch's steps: a sequence at the front
        (a sequence alone always is) draws the next step, one behind it takes the step after its own, and
        one that joins between steps (its first token came at the end of its prefill) the first step at
        least half a mean interval on, so that it waits one interval on average. Each step is drawn when
        the batch reaches it, at the batch's size then. Steps far behind a sequence (the batch went
        quiet) restart at it; a sequence far behind the steps kept (a reader that stopped reading) runs
        on its own intervals until it is back among them."""
        steps = self._steps
        if steps:
            last = steps[-1]
            if last == due:
                nxt = due + self.timing.itl_s(self.slots.running)
                steps.append(nxt)
                if len(steps) > 256:
                    del steps[:128]
                return nxt
            if steps[0] <= due < last:  # the common case first: on a step behind the front (as below)
                i = bisect.bisect_right(steps, due)
                if steps[i - 1] == due:
                    return steps[i]
        half = self.timing.itl_mean_s(self.slots.running) / 2.0
        if not steps or due - steps[-1] > 8 * half:
            steps[:] = [due]
            return self.next_step(due)
        if due < steps[0]:
            return due + self.timing.itl_s(self.slots.running)
        i = bisect.bisect_right(steps, due)
        if steps[i - 1] == due:  # on a step, behind the front: the step after it
            return steps[i]
        at = due + half
        while steps[-1] < at:
            steps.append(steps[-1] + self.timing.itl_s(self.slots.running))
        return steps[bisect.bisect_left(steps, at)]

    def open(self, keep_warm: bool = True, salt: int = 0) -> GpuSequence:
        """``keep_warm`` is for engines in another process (``sampler.engine``): in process a sequence
        holds its blocks between turns anyway, as ``pin-suspended`` says. ``salt`` seeds its block keys."""
        return GpuSequence(self, salt)

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
    def __init__(self, gpu: MockGPU, salt: int = 0) -> None:
        self._gpu = gpu
        self._salt = salt  # the parent key of the chain's first block (``chain_keys``)
        self.write_limit: int | None = None  # ``EngineSequence.write_limit``
        self.last_report: EngineReport | None = None
        # The turn in progress once its prefill started (prompt, cached, prefill, queue wait; decode and
        # output so far): what a turn cut short still bills. Reset when the next turn starts.
        self.live: EngineReport | None = None
        # The chain: the token sequence this sequence last computed on (its prompt during a turn, prompt +
        # output after it), as the keys of its full blocks (8 bytes each, one per block_size tokens) and,
        # when it came from a TokenLog, that log's first `_anchor_length` ids followed by `_tail`.
        self._keys: array[int] = array("q")
        self._anchor: TokenLog | None = None
        self._anchor_length = 0
        self._anchor_rewrites = 0
        self._tail: array[int] = array("I")
        self._held = 0  # the first `_held` chain keys are pinned by this sequence between turns
        self._stale: list[
            BlockKey
        ] = []  # pinned keys the chain no longer starts with: released at the next store
        self._turn_pins: list[BlockKey] = []  # cached blocks pinned while a turn computes on them
        self._has_slot = False
        self._busy = False
        self._closed = False

    def run_turn(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], every_s: float = 0.0
    ) -> AsyncGenerator[int, None]:
        """Yield how many output tokens became due at each wake-up (each ≥ 1, summing to
        ``len(output_ids)``); ``last_report`` is set when the turn completes. Iterate it under
        ``contextlib.aclosing`` so an abandoned turn gives its slot back at once.

        ``prompt_ids``: a ``Prompt`` over the conversation's log (the cost is O(new tokens)) or any
        sequence of ids (hashed whole). ``every_s`` > 0: after a wake-up the next one comes no sooner than
        ``every_s`` later, so the tokens that fall due meanwhile are released together (the server's
        ``--coalesce-ms``); the first token is not delayed and the deadlines themselves do not move.

        Raises ContextLengthExceeded (the prompt can never fit) and EngineOverloaded (queue full) before
        anything is yielded, EngineFailure (injected fault) at any point.
        """
        # it yields no Pacing
        return cast(AsyncGenerator[int, None], self._turn(prompt_ids, output_ids, every_s, paced=False))

    def run_paced(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int]
    ) -> AsyncGenerator[int | Pacing, None]:
        """``run_turn`` (no coalescing) that, after each yielded count, yields its ``_Pace`` instead of
        sleeping until the next tokens are due (``sampler.engine.PacedSequence``); on a clock without a
        timer it sleeps as ``run_turn`` does."""
        return self._turn(prompt_ids, output_ids, 0.0, paced=True)

    async def _turn(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], every_s: float, paced: bool
    ) -> AsyncGenerator[int | Pacing, None]:
        if self._closed or self._busy:
            raise RuntimeError("sequence closed" if self._closed else "a turn is already running")
        gpu, clock, spec = self._gpu, self._gpu.clock, self._gpu.spec
        self.live = None
        # the loop checked already: this is the engine's own admission
        check_prompt(spec.limits, len(prompt_ids))
        self._busy = True
        try:
            t_arrive = clock.now()
            await gpu.slots.acquire()
            self._has_slot = True
            t_start = clock.now()
            t_lookup = time.perf_counter()  # real CPU time, whatever clock paces the turn
            keys = self._keys_for(prompt_ids)
            n_cached = gpu.cache.match(keys, len(prompt_ids), self._held)
            # The blocks this sequence holds are pinned already: only the cached ones past them are pinned for
            # the turn.
            self._turn_pins = gpu.cache.acquire(keys[self._held : n_cached])
            lookup_ms = (time.perf_counter() - t_lookup) * 1e3
            cached = n_cached * spec.block_size
            prefill_ms = gpu.timing.prefill_ms(len(prompt_ids) - cached, gpu.slots.running)
            t_first = t_start + prefill_ms / 1000.0
            live = self.live = EngineReport(
                len(prompt_ids), cached, prefill_ms, (t_start - t_arrive) * 1000.0, 0.0, 0
            )

            n = len(output_ids)
            fail_at = gpu.fail_rng.randrange(n) if n and gpu.fail_rng.random() < spec.fail_rate else -1
            timer = clock.timer() if paced else None
            pace = _Pace(self, n, fail_at, t_first, every_s, live, timer)
            offer = False  # the next wait may be the owner's: after a yielded count, not twice in a row
            if n == 0:
                await clock.sleep_until(t_first)
            while pace.sent < n:
                if self._closed:
                    return  # closed under our feet: the caller wants nothing more
                if pace.sent == fail_at:
                    raise EngineFailure(f"injected engine failure after {pace.sent} of {n} tokens")
                now = clock.now()
                wake = pace.wake()
                if wake <= now:
                    k = pace.release_at(now, n)
                    if k:
                        offer = timer is not None
                        yield k
                        if self._closed:
                            return  # closed under our feet: the caller wants nothing more
                elif offer:
                    offer = False
                    yield pace  # the owner waits, and may release the next tokens from its timer meanwhile
                else:
                    await clock.sleep_until(wake)

            written = self._store(prompt_ids, output_ids)
            self.last_report = EngineReport(
                prompt_tokens=len(prompt_ids),
                cached_tokens=cached,
                prefill_ms=prefill_ms,
                queue_wait_ms=(t_start - t_arrive) * 1000.0,
                decode_ms=(pace.last_due - t_first) * 1000.0,
                output_tokens=n,
                lookup_ms=lookup_ms,
                first_late_ms=pace.first_late_ms,
                written_tokens=written,
                block_size=spec.block_size,
            )
        finally:
            self._end_turn()

    @property
    def limits(self) -> ModelLimits:
        """The model's context window (KV cache included) and max output per call."""
        return self._gpu.spec.limits

    def suspend(self) -> None:
        """Between turns, waiting for a tool. With ``pin-suspended`` off the blocks stay stored
        but become evictable: pressure from other sequences may take them before the resume."""
        if not self._gpu.spec.pin_suspended:
            self._release_held()

    def close(self) -> None:
        """Give everything back. Idempotent; safe while a turn is suspended at a yield."""
        self._closed = True
        self._end_turn()
        self._release_held()

    def _keys_for(self, prompt: Sequence[int]) -> array[int]:
        """The prompt's block keys (the chain's keys from now on), reusing the chain's for the blocks the
        prompt still starts with. Keys the chain loses that this sequence holds become ``_stale``."""
        bs = self._gpu.spec.block_size
        reuse = 0
        if (
            isinstance(prompt, Prompt)
            and prompt.current
            and prompt.log is self._anchor
            and self._anchor_rewrites == prompt.rewrites
            and prompt.length >= self._anchor_length
        ):
            # The log's first `_anchor_length` ids are unchanged (append-only, no rewrite since): compare
            # only what follows them with the chain's tail (the last turn's opening tokens and output).
            same = _common_prefix(prompt.tokens_from(self._anchor_length), self._tail)
            reuse = min(len(self._keys), (self._anchor_length + same) // bs)
        keys = self._keys
        if self._held > reuse:
            self._stale.extend(keys[reuse : self._held])
            self._held = reuse
        del keys[reuse:]
        keys.extend(chain_keys(tokens_from(prompt, reuse * bs), bs, keys[-1] if reuse else self._salt))
        if isinstance(prompt, Prompt):
            self._anchor, self._anchor_length, self._anchor_rewrites = (
                prompt.log,
                prompt.length,
                prompt.rewrites,
            )
            self._tail = array("I", prompt.suffix)
        else:
            self._anchor, self._anchor_length, self._tail = None, 0, array("I")
        return keys

    def _store(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> int:
        """The chain becomes prompt + output; this sequence holds all of it (as far as the cache has room),
        pinning only the blocks it did not hold yet, and lets go of what the chain lost. Returns the prompt
        tokens written: full prompt blocks that were not stored before and are held now."""
        bs, cache, keys = self._gpu.spec.block_size, self._gpu.cache, self._keys
        prompt_blocks = len(prompt_ids) // bs
        missing = [i for i in range(self._held, min(prompt_blocks, len(keys))) if keys[i] not in cache]
        rest = tokens_from(prompt_ids, len(keys) * bs)  # the prompt's last, partial block
        rest.extend(output_ids)
        keys.extend(chain_keys(rest, bs, keys[-1] if keys else self._salt))
        if self._anchor is not None:
            self._tail.extend(output_ids)
        # Hold the new blocks before letting go of the stale ones, so shared blocks never hit ref 0. Under a
        # write limit, only the blocks it covers (and those held already).
        end = len(keys) if self.write_limit is None else max(self._held, self.write_limit // bs)
        self._held += len(cache.acquire(keys[self._held : end]))
        cache.release(self._stale)
        self._stale = []
        return sum(1 for i in missing if i < self._held) * bs

    def _release_held(self) -> None:
        cache = self._gpu.cache
        cache.release(self._stale)
        cache.release(self._keys[: self._held])
        self._stale = []
        self._held = 0

    def _end_turn(self) -> None:
        self._gpu.cache.release(self._turn_pins)
        self._turn_pins = []
        if self._has_slot:
            self._has_slot = False
            self._gpu.slots.release()
        self._busy = False


class _Pace:
    """One turn's decode: which tokens are out, when the next is due (on the batch's steps). Between the
    turn's yields it is the owner's ``sampler.engine.Pacing``: what the owner releases from the timer
    counts as sent, and the turn goes on from there when resumed."""

    __slots__ = (
        "_timer",
        "due",
        "every_s",
        "fail_at",
        "first_late_ms",
        "floor",
        "gpu",
        "last_due",
        "live",
        "n",
        "now",
        "sent",
        "seq",
        "t_first",
    )

    def __init__(
        self,
        seq: GpuSequence,
        n: int,
        fail_at: int,
        t_first: float,
        every_s: float,
        live: EngineReport,
        timer: Timer | None,
    ) -> None:
        self.seq, self.gpu, self.n, self.fail_at, self.t_first, self.every_s, self.live = (
            seq,
            seq._gpu,
            n,
            fail_at,
            t_first,
            every_s,
            live,
        )
        self._timer = timer  # when the turn is paced (run_paced on a clock with a timer)
        self.now = seq._gpu.clock.now
        self.sent = 0
        self.due = self.last_due = self.floor = (
            t_first  # floor: the next wake-up comes no sooner (every_s after the last)
        )
        self.first_late_ms = 0.0

    def wake(self) -> float:
        return self.due if self.due > self.floor else self.floor

    @property
    def timer(self) -> Timer:
        """``Pacing.timer``: a paced turn's own clock's."""
        assert self._timer is not None, "only a paced turn is a Pacing"
        return self._timer

    def next_due(self) -> float | None:
        """``Pacing.next_due``."""
        sent = self.sent
        if sent >= self.n or sent == self.fail_at or self.seq._closed:
            return None
        return self.due if self.due > self.floor else self.floor

    def release(self, limit: int) -> int:
        """``Pacing.release``: from the owner's timer call."""
        return 0 if self.seq._closed else self.release_at(self.now(), limit)

    def release_at(self, now: float, limit: int) -> int:
        """Release the tokens whose deadline has passed, up to ``limit`` and an injected failure; the next
        interval is drawn with the load factor of the moment, so a batch that fills up slows decoding down."""
        sent, fail_at, due = self.sent, self.fail_at, self.due
        n = min(self.n, sent + limit)
        k = 0
        while sent + k < n and due <= now and sent + k != fail_at:
            k += 1
            self.last_due = due
            if sent + k < self.n:
                due = self.gpu.next_step(due)
        if k:
            if not sent:
                self.first_late_ms = (now - self.t_first) * 1e3
            self.sent = sent = sent + k
            self.due = due
            self.floor = now + self.every_s
            self.live.output_tokens, self.live.decode_ms = sent, (self.last_due - self.t_first) * 1000.0
        return k


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share; O(that many), and one C-level compare when ``b`` is a
    prefix of ``a`` (a final message: the chain ran on into what the log now holds)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n  # pragma: no cover - the slices differed
