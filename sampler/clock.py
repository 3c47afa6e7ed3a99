"""Time for the mock GPU: a real clock for serving, a virtual one for tests.

The engine paces tokens against absolute deadlines (``sleep_until``), never against "sleep for
the interval": a late wake-up then costs nothing downstream, and long outputs cannot drift.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (the origin means nothing)."""
        ...

    async def sleep_until(self, t: float) -> None:
        """Return at or after ``t``; immediately when ``t`` is already past."""
        ...


class RealClock:
    """``time.perf_counter`` plus ``asyncio.sleep``.

    Limits: the selector rounds its timeout *up* to whole milliseconds (epoll), so a wake-up is
    late by 0..~1 ms and a 250 µs token interval is served as ~4 tokens per wake-up. Throughput
    stays exact because deadlines are absolute. ``spin_s`` > 0 wakes that much early and finishes
    with ``asyncio.sleep(0)`` yields: sub-ms punctuality for the price of a busy core; off by default.
    """

    def __init__(self, spin_s: float = 0.0) -> None:
        self.spin_s = spin_s

    def now(self) -> float:
        return time.perf_counter()

    async def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > self.spin_s:
            await asyncio.sleep(dt - self.spin_s)
        # Only reached when spinning or when the loop woke us early; never re-sleep a few µs
        # (that would be rounded up to a whole millisecond), yield instead.
        while self.now() < t:  # noqa: ASYNC110 - a deadline, not an event, is awaited
            await asyncio.sleep(0)


class FakeClock:
    """Virtual time for deterministic tests: nothing moves until the test advances it.

    ``advance``/``advance_to`` fire timers in deadline order and let the woken tasks run after
    each one (``settle_rounds`` loop iterations), so a chain of sleeps behaves as on a real loop.
    """

    def __init__(self, start: float = 0.0, settle_rounds: int = 8) -> None:
        self._now = start
        self._settle_rounds = settle_rounds
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, t: float) -> None:
        if t <= self._now:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (t, next(self._ids), fut))
        await fut

    @property
    def pending(self) -> int:
        """Timers still waiting (cancelled sleepers excluded)."""
        return sum(1 for _, _, f in self._timers if not f.done())

    def next_deadline(self) -> float | None:
        self._drop_cancelled()
        return self._timers[0][0] if self._timers else None

    async def settle(self) -> None:
        for _ in range(self._settle_rounds):
            await asyncio.sleep(0)

    async def advance_to(self, t: float) -> None:
        await self.settle()
        while (nxt := self.next_deadline()) is not None and nxt <= t:
            self._now = max(self._now, nxt)
            while self._timers and self._timers[0][0] <= self._now:
                _, _, fut = heapq.heappop(self._timers)
                if not fut.done():
                    fut.set_result(None)
            await self.settle()
        self._now = max(self._now, t)
        await self.settle()

    async def advance(self, dt: float) -> None:
        await self.advance_to(self._now + dt)

    async def jump(self, dt: float) -> None:
        """Move time by ``dt`` at once, then wake every sleeper now due: a late wake-up, as a
        busy event loop or a millisecond-granular selector produces."""
        await self.settle()
        self._now += dt
        while self._timers and self._timers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._timers)
            if not fut.done():
                fut.set_result(None)
        await self.settle()

    async def run_until_idle(self) -> None:
        """Advance through every timer until none is left (tasks blocked elsewhere stay blocked)."""
        await self.settle()
        while (nxt := self.next_deadline()) is not None:
            await self.advance_to(nxt)

    def _drop_cancelled(self) -> None:
        while self._timers and self._timers[0][2].done():
            heapq.heappop(self._timers)
