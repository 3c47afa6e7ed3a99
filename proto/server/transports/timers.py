"""When a WebSocket connection's limits come due: its age (``--connection-max-age-s``) and its idleness
(``--idle-timeout-s``: no open response and no client frame for that long). ``ConnectionTimers`` is
arithmetic on one clock, no I/O: the session asks ``due_in`` how long it may wait for the next frame, and
after the wait asks ``aged`` / ``idle``. ``deadline`` is the one way the server waits for a limit, on the
server's injected clock (``Pipeline.clock``), so tests run every limit on virtual time.

A response in flight is never idle: a suspended one is governed by ``--tool-timeout-s`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sampler.clock import Clock, FakeClock


@contextlib.asynccontextmanager
async def deadline(clock: Clock, at: float) -> AsyncIterator[None]:
    """``asyncio.timeout_at`` on ``clock``'s time: the block raises ``TimeoutError`` once ``at`` passes.

    On real time the loop's own timer serves (no task, one timer handle); on a ``FakeClock`` a watcher
    task sleeps on the fake clock and then expires the timeout at once."""
    loop = asyncio.get_running_loop()
    if not isinstance(clock, FakeClock):
        async with asyncio.timeout_at(loop.time() + (at - clock.now())):
            yield
        return
    async with asyncio.timeout(None) as timeout:
        watcher = loop.create_task(_expire(clock, at, timeout))
        try:
            yield
        finally:
            watcher.cancel()


async def _expire(clock: Clock, at: float, timeout: asyncio.Timeout) -> None:
    await clock.sleep_until(at)
    timeout.reschedule(asyncio.get_running_loop().time())


# Past the age limit a streaming response is let finish its turn; the session checks back this often.
AGED_POLL_S = 0.05
CLOSE_IDLE = 1000  # a normal closure: the server ends an unused connection on purpose
IDLE_REASON = "idle_timeout"


@dataclass
class ConnectionTimers:
    opened_at: float
    max_age_s: float
    idle_timeout_s: float
    idle_since: float = field(init=False)

    def __post_init__(self) -> None:
        self.idle_since = self.opened_at

    def touch(self, now: float) -> None:
        """A client frame arrived, or the open response ended: the idle clock starts again."""
        self.idle_since = now

    def aged(self, now: float) -> bool:
        return now >= self.opened_at + self.max_age_s

    def idle(self, now: float, busy: bool) -> bool:
        return not busy and now >= self.idle_since + self.idle_timeout_s

    def due_in(self, now: float, busy: bool) -> float:
        """Seconds the session may wait for a frame before it must check these limits."""
        age = self.opened_at + self.max_age_s - now
        if busy:
            if age <= 0:
                return AGED_POLL_S
            # The response's end cannot wake a reader blocked on the socket: check back, so the idle
            # clock closes the connection at most a quarter of the timeout late.
            return min(age, self.idle_timeout_s / 4)
        return max(0.0, min(age, self.idle_since + self.idle_timeout_s - now))
