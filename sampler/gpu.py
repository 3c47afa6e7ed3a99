"""The mock GPU: an engine-step loop (``sampler.batch.Scheduler``), a prefix KV cache and deadline-paced
tokens behind one engine.

One ``GpuSequence`` per response. A long-lived response keeps its sequence across turns, so its
KV blocks (pinned while it waits for a tool) make the resumed turn's prefill cheap — and count against the
capacity every other sequence needs (docs/mock-gpu.md, "KV cache").

Every turn is a request on the GPU's one step loop: queued FIFO, admitted when a slot, the token budget and
KV allow, prefilled chunk by chunk beside every other request, then decoded one step (or one speculative
burst) at a time. Its tokens fall due at the ends of the steps that emit them, the same instants for the
whole batch, so the clock wakes once per step for all of them (docs/mock-gpu.md, "The step clock").

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

import asyncio
import random
import time
from array import array
from collections.abc import AsyncGenerator, Sequence
from typing import cast

from sampler.batch import DONE, GONE, WAITING, Request, Scheduler
from sampler.clock import Clock, RealClock, Timer
from sampler.engine import Breakpoint, EngineFailure, EngineReport, Pacing
from sampler.kvcache import BlockKey, PrefixCache, Prompt, TokenLog, chain_keys, salt_key, tokens_from
from sampler.models import ModelLimits, ModelSpec, check_prompt
from sampler.timing import Timing

__all__ = ["GpuSequence", "MockGPU"]


class MockGPU:
    def __init__(self, spec: ModelSpec, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock: Clock = clock or RealClock()
        self.timing = Timing(spec)
        self.cache = PrefixCache(spec.kv_cache_size, spec.block_size, self.clock.now)
        self.scheduler = Scheduler(spec, self.cache, self.timing, self._expire_pins)
        # Its own stream, so turning failures on does not change the jitter a seed produces.
        self.fail_rng = random.Random(f"fail:{spec.seed}")
        # Suspended sequences holding pinned blocks, oldest suspension first, with its time.
        self._suspended: dict[GpuSequence, float] = {}

    @property
    def slots(self) -> Scheduler:
        """``running`` / ``max_running`` / ``waiting`` / ``max_waiting``, as the engine process reads them."""
        return self.scheduler

    @property
    def limits(self) -> ModelLimits:
        return self.spec.limits

    def open(self, keep_warm: bool = True, salt: str = "", affinity: str = "") -> GpuSequence:
        """``keep_warm`` is for engines in another process (``sampler.engine``): in process a sequence
        holds its blocks between turns anyway, as ``pin-suspended`` says. ``salt``: the tenant's cache
        scope (docs/mock-gpu.md, "Prefix cache per tenant"). ``affinity``: one GPU, no replicas to route
        between."""
        return GpuSequence(self, salt_key(salt))

    def _expire_pins(self, now: float) -> bool:
        """Under KV pressure: unpin the suspended sequences idle past ``kv-idle-ttl``, oldest first."""
        ttl = self.spec.kv_idle_ttl_s
        expired = [seq for seq, since in self._suspended.items() if now - since >= ttl]
        for seq in expired:
            del self._suspended[seq]
            seq._release_held()
        return bool(expired)

    def _pinned_suspended(self) -> int:
        """Distinct blocks the suspended sequences hold: a prefix two of them share (the same instructions)
        is one block in the cache, pinned once."""
        held: set[BlockKey] = set()
        for seq in self._suspended:
            held.update(seq._keys[: seq._held])
        return len(held)

    def metrics(self) -> dict[str, float]:
        c, sched = self.cache, self.scheduler
        return {
            "running": float(sched.running),
            "waiting": float(sched.waiting),
            "kv_usage": c.usage,
            "kv_blocks_used": float(c.blocks_used),
            "kv_blocks_stored": float(c.blocks_stored),
            "kv_blocks_pinned_suspended": float(self._pinned_suspended()),
            "prefix_cache_hit_rate": c.hit_rate,
            "prefix_cache_queries": float(c.queries),
            "prefix_cache_hits": float(c.hits),
            "preemptions": float(sched.preemptions),
            "steps": float(sched.steps),
            "step_cpu_us": sched.cpu_ns / 1e3 / sched.steps if sched.steps else 0.0,
        }


class GpuSequence:
    def __init__(self, gpu: MockGPU, seed: BlockKey = 0) -> None:
        self._gpu = gpu
        self._seed = seed  # the tenant's salt: the parent of the chain's first block
        self.retention: tuple[Breakpoint, ...] | None = None  # ``EngineSequence.retention``
        # The prompt tokens the turn in progress wrote to the cache (``_store``), by lifetime, and found
        # expired at its lookup (``admitted``).
        self._written = 0
        self._written_by_ttl: dict[str, int] = {}
        self._expired = 0
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
        self._req: Request | None = None  # the turn on the engine
        self._prompt: Sequence[int] = ()
        self._output: Sequence[int] = ()
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
        gpu._suspended.pop(self, None)
        try:
            t_lookup = time.perf_counter()  # real CPU time, whatever clock paces the turn
            self._keys_for(prompt_ids)
            lookup_ms = (time.perf_counter() - t_lookup) * 1e3
            self._prompt, self._output = prompt_ids, output_ids
            n = len(output_ids)
            fail_at = gpu.fail_rng.randrange(n) if n and gpu.fail_rng.random() < spec.fail_rate else -1
            req = Request(self, len(prompt_ids), n if fail_at < 0 else fail_at, fail_at >= 0, clock.now())
            req.lookup_ms = lookup_ms
            sched = gpu.scheduler
            sched.submit(req, clock.now())
            self._req = req
            timer = clock.timer() if paced else None
            pace = _Pace(self, req, n, fail_at, every_s, timer)
            offer = False  # the next wait may be the owner's: after a yielded count, not twice in a row
            while True:
                if self._closed:
                    return  # closed under our feet: the caller wants nothing more
                if pace.sent == fail_at:
                    raise EngineFailure(f"injected engine failure after {pace.sent} of {n} tokens")
                k = pace.release_at(clock.now(), n)
                if k:
                    offer = timer is not None
                    yield k
                    continue
                if req.state == DONE and not req.pending:
                    break
                wake = pace.wake()
                if wake is not None:
                    if offer:
                        offer = False
                        yield pace  # the owner waits, and may release the next tokens from its timer
                    else:
                        await clock.sleep_until(wake)
                elif req.state == WAITING and (sched.queue[0] is not req or sched.next_boundary() is None):
                    # queued behind others: woken when admitted or when it becomes the head
                    req.waiter = asyncio.get_running_loop().create_future()
                    await req.waiter
                else:
                    # prefilling, dispatching or at the head of the queue: something happens for it at the
                    # next boundary at the earliest (every boundary is processed when someone wakes at it)
                    at = sched.next_boundary()
                    if at is None:
                        await asyncio.sleep(0)  # a drop freed the engine: kicked already, look again
                    else:
                        await clock.sleep_until(at)

            assert req.first_at is not None and req.admitted_at is not None
            written, self._written = self._written, 0
            by_ttl, self._written_by_ttl = self._written_by_ttl, {}
            self.last_report = EngineReport(
                prompt_tokens=len(prompt_ids),
                cached_tokens=req.cached,
                prefill_ms=(req.first_at - req.admitted_at) * 1000.0,
                queue_wait_ms=(req.admitted_at - req.arrived_at) * 1000.0,
                decode_ms=(pace.last_due - req.first_at) * 1000.0 if n else 0.0,
                output_tokens=n,
                lookup_ms=req.lookup_ms,
                first_late_ms=pace.first_late_ms,
                written_tokens=written,
                written_by_ttl=by_ttl,
                expired_tokens=self._expired,
                block_size=self._gpu.spec.block_size,
            )
        finally:
            self._end_turn()

    @property
    def limits(self) -> ModelLimits:
        """The model's context window (KV cache included) and max output per call."""
        return self._gpu.spec.limits

    def suspend(self) -> None:
        """Between turns, waiting for a tool. With ``pin-suspended`` the blocks stay pinned, against every
        other sequence's capacity, until the resume or until they have been idle ``kv-idle-ttl`` and the
        cache is under pressure; off, they stay stored but become evictable at once."""
        gpu = self._gpu
        if not gpu.spec.pin_suspended:
            self._release_held()
            gpu.scheduler.room_freed(gpu.clock.now())
        elif self._held and not self._closed:
            gpu._suspended[self] = gpu.clock.now()

    def close(self) -> None:
        """Give everything back. Idempotent; safe while a turn is suspended at a yield."""
        self._closed = True
        self._end_turn()
        self._gpu._suspended.pop(self, None)
        if self._held or self._stale:
            self._release_held()
            self._gpu.scheduler.room_freed(self._gpu.clock.now())

    # ---- the scheduler's side (``sampler.batch.Member``)

    def admitted(self, req: Request, now: float) -> int:
        """Match the prompt's prefix and pin the hits: the cached tokens. The first admission opens the live
        report."""
        gpu = self._gpu
        keys = self._keys
        n_cached = gpu.cache.match(keys, req.prompt_tokens, self._held)
        if req.admitted_at is None:  # a recompute after preemption finds what the turn itself wrote
            self._expired = gpu.cache.last_expired * gpu.spec.block_size
        # The blocks this sequence holds are pinned already: only the cached ones past them are pinned for
        # the turn.
        req.turn_pins = gpu.cache.acquire(keys[self._held : n_cached])
        cached = n_cached * gpu.spec.block_size
        if req.admitted_at is None:
            self.live = EngineReport(req.prompt_tokens, cached, 0.0, (now - req.arrived_at) * 1000.0, 0.0, 0)
        return cached

    def completed(self, req: Request) -> None:
        """The turn's KV is computed: the chain becomes prompt + output."""
        self._written = self._store(self._prompt, self._output)
        self._gpu.cache.release(req.turn_pins)
        req.turn_pins = []

    def evicted(self, req: Request) -> None:
        """Preempted, failed or dropped: the prompt's full blocks it computed stay cached, evictable (a
        recompute hits them while they last); the turn's pins go."""
        cache, bs = self._gpu.cache, self._gpu.spec.block_size
        computed = min(req.computed, req.prompt_tokens) // bs
        if computed > self._held and not self._closed:
            cache.release(cache.acquire(self._keys[self._held : computed]))
        cache.release(req.turn_pins)
        req.turn_pins = []

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
        keys.extend(chain_keys(tokens_from(prompt, reuse * bs), bs, keys[-1] if reuse else self._seed))
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
        """The chain becomes prompt + output; this sequence holds all of it that its ``retention`` covers (as
        far as the cache has room), pinning only the blocks it did not hold yet, each under its lifetime, and
        lets go of what the chain lost. Returns the prompt tokens written: full prompt blocks that were not
        stored before and are held now (``_written_by_ttl``: the same, by lifetime)."""
        bs, cache, keys = self._gpu.spec.block_size, self._gpu.cache, self._keys
        prompt_blocks = len(prompt_ids) // bs
        missing = [i for i in range(self._held, min(prompt_blocks, len(keys))) if keys[i] not in cache]
        rest = tokens_from(prompt_ids, len(keys) * bs)  # the prompt's last, partial block
        rest.extend(output_ids)
        keys.extend(chain_keys(rest, bs, keys[-1] if keys else self._seed))
        if self._anchor is not None:
            self._tail.extend(output_ids)
        # Hold the new blocks before letting go of the stale ones, so shared blocks never hit ref 0.
        lives = _lifetimes(self.retention, len(keys), bs)
        for start, stop, life in lives:
            start = max(start, self._held)
            if start >= stop:
                continue
            if start > self._held:
                break  # a gap below this breakpoint's blocks (none in practice: they start at 0)
            got = len(cache.acquire(keys[start:stop], life.ttl_s if life is not None else None))
            self._held += got
            if life is not None:
                written = sum(1 for i in missing if start <= i < start + got) * bs
                if written:
                    self._written_by_ttl[life.ttl] = self._written_by_ttl.get(life.ttl, 0) + written
            if got < stop - start:
                break  # no room: a prefix cache is useless past a gap
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
        req = self._req
        if req is not None:
            self._req = None
            if req.state not in (DONE, GONE):
                self._gpu.scheduler.drop(req, self._gpu.clock.now())
        self._prompt = self._output = ()
        self._busy = False


class _Pace:
    """One turn's tokens as its consumer takes them: which are out, and when the next fall due (the end of
    the step that emits them). Between the turn's yields it is the owner's ``sampler.engine.Pacing``: what
    the owner releases from the timer counts as sent, and the turn goes on from there when resumed."""

    __slots__ = (
        "_timer",
        "every_s",
        "fail_at",
        "first_late_ms",
        "floor",
        "last_due",
        "n",
        "now",
        "req",
        "sched",
        "sent",
        "seq",
    )

    def __init__(
        self, seq: GpuSequence, req: Request, n: int, fail_at: int, every_s: float, timer: Timer | None
    ) -> None:
        self.seq, self.req, self.n, self.fail_at, self.every_s = seq, req, n, fail_at, every_s
        self.sched = seq._gpu.scheduler
        self._timer = timer  # when the turn is paced (run_paced on a clock with a timer)
        self.now = seq._gpu.clock.now
        self.sent = 0
        self.last_due = 0.0
        self.floor = float("-inf")  # the next wake-up comes no sooner (every_s after the last)
        self.first_late_ms = 0.0

    def wake(self) -> float | None:
        """When the next tokens fall due (not before the coalescing floor); None while that is unknown (the
        turn is queued or prefilling, or was preempted)."""
        req = self.req
        if req.pending:
            due = req.pending[0][0]
        else:
            sched = self.sched
            due_at = sched.step_end
            if req.emit_step != sched.step_id or due_at is None:
                return None
            due = due_at
        return due if due > self.floor else self.floor

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
        return self.wake()

    def release(self, limit: int) -> int:
        """``Pacing.release``: from the owner's timer call."""
        return 0 if self.seq._closed else self.release_at(self.now(), limit)

    def release_at(self, now: float, limit: int) -> int:
        """Release the tokens whose step has ended, up to ``limit`` and an injected failure. The scheduler
        is advanced to ``now`` first, also under the coalescing floor: a preempted turn waiting at the head
        of the queue wakes at a step boundary with its floor still ahead, and must process that boundary."""
        self.sched.advance(now)
        if now < self.floor:
            return 0
        req = self.req
        pending = req.pending
        if not pending or pending[0][0] > now:
            return 0
        sent = self.sent
        cap = sent + limit
        if cap > self.n:
            cap = self.n
        if 0 <= self.fail_at < cap:
            cap = self.fail_at
        to = sent
        while pending and to < cap:
            t, emitted = pending[0]
            if t > now:
                break
            if emitted <= cap:
                pending.popleft()
                to = emitted
            else:
                to = cap  # the rest of that step's tokens stay due
            self.last_due = t
        k = to - sent
        if k:
            if not sent and req.first_at is not None:
                self.first_late_ms = (now - req.first_at) * 1e3
            self.sent = to
            self.floor = now + self.every_s
            live = self.seq.live
            if live is not None:
                if not sent and req.first_at is not None and req.admitted_at is not None:
                    live.prefill_ms = (req.first_at - req.admitted_at) * 1000.0
                if req.first_at is not None:
                    live.output_tokens, live.decode_ms = to, (self.last_due - req.first_at) * 1000.0
        return k


def _lifetimes(
    retention: tuple[Breakpoint, ...] | None, blocks: int, block_size: int
) -> list[tuple[int, int, Breakpoint | None]]:
    """The chain's blocks a sequence keeps, as ``(start, stop, breakpoint)`` runs from block 0: a block lives
    as long as the longest-lived breakpoint that covers it (ends at or past its end). None: every block,
    without a lifetime."""
    if retention is None:
        return [(0, blocks, None)]
    ends = sorted((blocks if b.end is None else min(blocks, b.end // block_size), b) for b in retention)
    runs: list[tuple[int, int, Breakpoint | None]] = []
    start = 0
    for index, (stop, _) in enumerate(ends):
        if stop > start:
            longest = max((b for _, b in ends[index:]), key=lambda b: b.ttl_s)
            runs.append((start, stop, longest))
            start = stop
    return runs


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
