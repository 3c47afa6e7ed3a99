"""Batch slots: at most ``max_num_seqs`` sequences run; the others wait first-in first-out."""

from __future__ import annotations

import asyncio
from collections import deque

from sampler.engine import EngineOverloaded


class BatchSlots:
    def __init__(self, max_running: int, max_waiting: int) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    async def acquire(self) -> None:
        """Take a slot, waiting in FIFO order. Raises EngineOverloaded past ``max_waiting``.
        The caller must ``release()`` exactly once after this returns."""
        if self.running < self.max_running and not self.waiting:
            self.running += 1
            return
        if self.waiting >= self.max_waiting:
            raise EngineOverloaded(f"{self.waiting} sequences already waiting (max-waiting)")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed to us just as we were cancelled: pass it on
            raise
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def release(self) -> None:
        # Hand the slot straight to the oldest waiter: `running` does not dip, so no newcomer
        # can overtake the queue between this release and the waiter's wake-up.
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1
