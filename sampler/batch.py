"""The engine-step loop: one ``Scheduler`` per mock GPU builds every step's batch as vLLM's V1 scheduler does
(vllm/v1/core/sched/scheduler.py, ``Scheduler.schedule``) and times it with the model's ``StepCost``.

At each step boundary:

1. the running requests, in admission order: a decoding one gets its next token(s) (1, or 1 + accepted
   drafts), a prefilling one the next chunk of its uncached tokens, while the token budget
   (``max-num-batched-tokens``) lasts. Each allocates the KV blocks its new tokens need; when the cache has
   no room (after LRU eviction and the suspended pins idle past ``kv-idle-ttl``) the most recently
   admitted request is preempted (recompute: its blocks are freed, the full ones it computed stay cached,
   and it goes back to the front of the queue), down to the request itself;
2. if nobody was preempted, the queue in FIFO order while there is a free slot (``max-num-seqs``), budget
   and KV for the first chunk.

The step lasts ``step-overhead`` + ``StepCost.step_ms(chunks with their prefix, decode contexts)``, jittered.
At its end every chunk is computed; a request whose prefill (or recompute) completes emits a token, every
decoding one its token(s), all due at that instant. Time moves only when someone asks (``advance(now)``):
every boundary up to ``now`` is processed in order, each with the state it had then, so the schedule does
not depend on who wakes when, and a late wake-up finds every token at its own deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from sampler.engine import EngineOverloaded
from sampler.kvcache import PrefixCache
from sampler.models import ModelSpec
from sampler.timing import Timing

__all__ = ["DONE", "GONE", "RUNNING", "WAITING", "Member", "Request", "Scheduler"]

WAITING, RUNNING, DONE, GONE = range(4)


class Member(Protocol):
    """The sequence a request belongs to: it owns the prefix-cache side of admission and completion."""

    def admitted(self, req: Request, now: float) -> int:
        """Match the prompt's prefix, pin the hits; the cached tokens."""
        ...

    def completed(self, req: Request) -> None:
        """The turn's KV is done: store prompt + output, release the turn's pins."""
        ...

    def evicted(self, req: Request) -> None:
        """Preempted or dropped: leave the full blocks it computed cached (evictable), release its pins."""
        ...


class Request:
    """One turn on the engine: what it computes and what it has emitted (``pending``: (due, emitted so far)
    per step that emitted for it, not yet taken by its consumer)."""

    __slots__ = (
        "admitted_at",
        "arrived_at",
        "cached",
        "cached_blocks",
        "chunk",
        "computed",
        "emit_step",
        "emitted",
        "failing",
        "first_at",
        "lookup_ms",
        "member",
        "n_gen",
        "pending",
        "private",
        "prompt_tokens",
        "ready_at",
        "state",
        "step_tokens",
        "target",
        "turn_pins",
        "waiter",
    )

    def __init__(self, member: Member, prompt_tokens: int, n_gen: int, failing: bool, now: float) -> None:
        self.member = member
        self.prompt_tokens = prompt_tokens
        self.n_gen = n_gen  # tokens generated before the turn ends (an injected failure's point)
        self.failing = failing
        self.arrived_at = now
        self.admitted_at: float | None = None
        self.first_at: float | None = None  # the end of the step that finished its (first) prefill
        self.ready_at = now  # dispatch done: its chunks may be scheduled
        self.state = WAITING
        self.cached = 0  # tokens found in the prefix cache at the first admission
        self.cached_blocks = 0  # blocks pinned from the cache at the latest admission
        self.computed = 0  # tokens in KV
        self.target = prompt_tokens  # tokens to have in KV before the next emission (recompute adds output)
        self.private = 0  # KV blocks allocated to this request beyond the pinned cache hits
        self.emitted = 0
        self.emit_step = -1  # the step that will emit for it (the current one when it equals step_id)
        self.chunk = 0  # this step's prefill chunk
        self.step_tokens = 0  # this step's decode tokens
        self.pending: deque[tuple[float, int]] = deque()
        self.turn_pins: list[int] = []
        self.waiter: asyncio.Future[None] | None = None  # a queued consumer waiting for admission
        self.lookup_ms = 0.0


class Scheduler:
    """One GPU's batch: ``running`` requests (admitted: prefilling or decoding) and the FIFO ``queue``."""

    def __init__(
        self,
        spec: ModelSpec,
        cache: PrefixCache,
        timing: Timing,
        expire_pins: Callable[[float], bool],
    ) -> None:
        self.max_running = spec.max_num_seqs
        self.max_waiting = spec.max_waiting
        self.budget = spec.max_num_batched_tokens
        self.block_size = spec.block_size
        self.cache = cache
        self.timing = timing
        self._expire_pins = expire_pins  # frees suspended pins idle past the TTL; True when it freed any
        self.batch: list[Request] = []
        self.queue: deque[Request] = deque()
        self.step_end: float | None = None  # the step in flight ends then; None: no step in flight
        self.step_id = 0
        self._began = float("-inf")  # when the latest step was formed
        self._prefill: list[Request] = []
        self._decode: list[Request] = []
        # What the loop costs: steps run, preemptions, and the CPU time (this thread's) spent forming and
        # ending them.
        self.steps = 0
        self.preemptions = 0
        self.cpu_ns = 0

    @property
    def running(self) -> int:
        return len(self.batch)

    @property
    def waiting(self) -> int:
        return len(self.queue)

    # ---- the consumers' side

    def submit(self, req: Request, now: float) -> None:
        """Queue a turn (EngineOverloaded past ``max-waiting``); a free engine schedules it at once."""
        self.advance(now)
        # A free slot takes it at the next boundary: only what waits for a slot counts against max-waiting.
        if len(self.batch) + len(self.queue) >= self.max_running + self.max_waiting:
            raise EngineOverloaded(f"{len(self.queue)} sequences already waiting (max-waiting)")
        self.queue.append(req)
        self.kick(now)

    def drop(self, req: Request, now: float) -> None:
        """The consumer is gone (closed, cancelled, broke out): free what the request holds."""
        if req.state in (DONE, GONE):
            return
        self.advance(now)
        if req.state == RUNNING:
            self.batch.remove(req)
            self._free(req)
        elif req.state == WAITING:
            self.queue.remove(req)
        req.state = GONE
        self.kick(now)
        self._wake_head()  # it may have been the one that woke at the boundaries

    def kick(self, now: float) -> None:
        """Something changed while no step is in flight: form one now."""
        if self.step_end is None and (self.queue or self.batch):
            t0 = time.thread_time_ns()
            self._begin(now)
            self.cpu_ns += time.thread_time_ns() - t0
            self.advance(now)  # a step of zero length (nothing to compute) ends at once

    def room_freed(self, now: float) -> None:
        """KV was freed outside a step (a sequence closed or unpinned): what waits for it may fit now."""
        if self.queue:
            self.advance(now)
            self.kick(now)
            self._wake_head()

    def next_boundary(self) -> float | None:
        """When the scheduler next runs: the end of the step in flight, or the first dispatch to finish."""
        if self.step_end is not None:
            return self.step_end
        began = self._began
        ready = [r.ready_at for r in self.batch if r.ready_at > began]
        return min(ready) if ready else None

    def advance(self, now: float) -> None:
        """Process every step boundary up to ``now``, in order."""
        end = self.step_end
        if end is not None and end > now:
            return
        t0 = time.thread_time_ns()
        while True:
            end = self.step_end
            if end is not None:
                if end > now:
                    break
                self._end(end)
                self._begin(end)
                continue
            t = self.next_boundary()
            if t is None or t > now:
                break
            self._begin(t)
        self.cpu_ns += time.thread_time_ns() - t0

    # ---- the loop

    def _begin(self, t: float) -> None:
        self._began = t
        budget = self.budget
        prefill: list[Request] = []
        decode: list[Request] = []
        chunks: list[tuple[int, int]] = []
        contexts: list[int] = []
        batch = self.batch
        step = self.step_id + 1
        preemptions = self.preemptions
        bs = self.block_size
        draw = self.timing.decode_tokens
        speculative = self.timing.speculative
        i = 0
        while i < len(batch):
            r = batch[i]
            computed = r.computed
            if computed >= r.target:  # decoding
                if budget <= 0:
                    i += 1
                    continue
                m = draw() if speculative else 1
                left = r.n_gen - r.emitted
                if m > left:
                    m = left
                if m > budget:
                    m = budget
                # (the common case, room in its last block, without a call)
                if computed + m > (r.cached_blocks + r.private) * bs and not self._grow(
                    r, computed + m, bool(prefill or decode)
                ):
                    continue  # r itself went back to the queue: it was the batch's last
                contexts.append(computed)
                r.step_tokens = m
                r.emit_step = step
                decode.append(r)
                budget -= m
            elif r.ready_at <= t and budget > 0:
                chunk = min(r.target - computed, budget)
                if not self._grow(r, computed + chunk, bool(prefill or decode)):
                    continue
                chunks.append((chunk, computed))
                r.chunk = chunk
                if r.computed + chunk >= r.target and r.emitted < r.n_gen:
                    r.emit_step = step
                prefill.append(r)
                budget -= chunk
            i += 1
        if self.preemptions == preemptions:  # vLLM admits nothing in a step that preempted
            self._admit(t, budget, prefill, chunks, bool(decode), step)
        self._prefill, self._decode = prefill, decode
        self._wake_head()
        if prefill or decode:
            self.step_id = step
            self.step_end = t + self.timing.step_ms(chunks, contexts) / 1000.0
        else:
            self.step_end = None

    def _admit(
        self,
        t: float,
        budget: int,
        prefill: list[Request],
        chunks: list[tuple[int, int]],
        decoding: bool,
        step: int,
    ) -> None:
        queue, batch, bs = self.queue, self.batch, self.block_size
        while queue and len(batch) < self.max_running:
            r = queue[0]
            first = r.admitted_at is None
            ready = t + self.timing.dispatch_ms() / 1000.0 if first else t
            if ready <= t and budget <= 0:
                break
            t_lookup = time.perf_counter()
            cached = r.member.admitted(r, t)
            r.lookup_ms += (time.perf_counter() - t_lookup) * 1e3
            r.cached_blocks = cached // bs
            r.computed = cached
            chunk = min(r.target - cached, budget) if ready <= t else min(r.target - cached, self.budget)
            need = -(-(cached + chunk) // bs) - r.cached_blocks
            alone = not (batch or prefill or decoding)
            if need > 0 and not self._reserve(need, t, alone):
                r.member.evicted(r)  # gives the pins back: it stays first in the queue
                r.computed = 0
                break
            r.private = max(need, 0)
            queue.popleft()
            r.state = RUNNING
            r.ready_at = ready
            batch.append(r)
            if first:
                r.admitted_at = t
                r.cached = cached
            if r.waiter is not None and not r.waiter.done():
                r.waiter.set_result(None)
            if ready <= t:
                chunks.append((chunk, r.computed))
                r.chunk = chunk
                if r.computed + chunk >= r.target and r.emitted < r.n_gen:
                    r.emit_step = step
                prefill.append(r)
                budget -= chunk

    def _wake_head(self) -> None:
        """The queue's head wakes at every boundary (the others wait for admission without waking): wake
        a new head that is waiting for its admission."""
        if self.queue:
            waiter = self.queue[0].waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _end(self, t: float) -> None:
        self.step_end = None
        self.steps += 1
        finished = False
        for r in self._prefill:
            if r.state != RUNNING:
                continue  # dropped during the step
            r.computed += r.chunk
            if r.computed < r.target:
                continue
            if r.first_at is None:
                r.first_at = t
            if r.emitted < r.n_gen:
                r.emitted += 1
                r.pending.append((t, r.emitted))
            if r.emitted >= r.n_gen:
                finished = self._finish(r)
        for r in self._decode:
            if r.state != RUNNING:
                continue
            m = r.step_tokens
            r.target = r.computed = r.computed + m
            emitted = r.emitted = r.emitted + m
            r.pending.append((t, emitted))
            if emitted >= r.n_gen:
                finished = self._finish(r)
        self._prefill = self._decode = []
        if finished:
            self.batch = [r for r in self.batch if r.state == RUNNING]

    def _finish(self, r: Request) -> bool:
        r.state = DONE
        self.cache.unreserve(r.private)
        r.private = 0
        if r.failing:
            r.member.evicted(r)
        else:
            r.member.completed(r)
        return True

    def _free(self, r: Request) -> None:
        self.cache.unreserve(r.private)
        r.private = 0
        r.member.evicted(r)

    def _grow(self, r: Request, tokens: int, scheduled: bool) -> bool:
        """KV for ``r`` up to ``tokens``; preempting from the back of the batch when the cache is full. False
        when ``r`` itself was preempted (it is out of the batch)."""
        need = -(-tokens // self.block_size) - r.cached_blocks - r.private
        if need <= 0:
            return True
        batch = self.batch
        while not self._reserve(need, self._began, False):
            victim = batch[-1]
            if victim is r and not scheduled:
                self._reserve(need, self._began, True)  # alone in this step: it runs over capacity
                break
            self._preempt(victim)
            if victim is r:
                return False
        r.private += need
        return True

    def _reserve(self, blocks: int, now: float, force: bool) -> bool:
        cache = self.cache
        if cache.reserve(blocks):
            return True
        if self._expire_pins(now) and cache.reserve(blocks):
            return True
        # Nothing running could make room (a cache smaller than one turn, or all of it pinned by suspended
        # sequences): a request alone still runs, over capacity, rather than never.
        return force and cache.reserve(blocks, force=True)

    def _preempt(self, r: Request) -> None:
        self.batch.pop()
        self.preemptions += 1
        self._free(r)
        r.state = WAITING
        r.computed = 0
        r.target = r.prompt_tokens + r.emitted  # recompute: the prompt and what it generated so far
        r.emit_step = -1
        self.queue.appendleft(r)
