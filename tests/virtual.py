"""A real server on loopback whose limits run on virtual time (idle, age, tool and send timeouts).

The server's ``Pipeline.clock`` is a ``FakeClock``; the mock GPU keeps its real clock, so rollouts stream
as usual while no limit comes due until the test moves time on with ``advance``. Nothing waits on the wall
clock for a limit: a test says "0.3 s pass" and the server sees exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from helpers import SETTINGS

from proto.server.serve import ThreadedServer
from sampler.clock import FakeClock


@dataclass
class VirtualServer:
    server: ThreadedServer
    clock: FakeClock

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def http_url(self) -> str:
        return self.server.http_url

    async def advance(self, seconds: float) -> None:
        """Move the server's limit clock on by ``seconds``, firing every timer due meanwhile in order (on
        the server's own loop: the clock is not thread-safe)."""
        assert self.server.loop is not None
        future = asyncio.run_coroutine_threadsafe(self.clock.advance(seconds), self.server.loop)
        await asyncio.wrap_future(future)

    async def advance_until(
        self, seconds: float, condition: Callable[[], bool], what: str, rounds: int = 50
    ) -> None:
        """``advance(seconds)`` until ``condition`` holds, a few polls after each (bounded). For a limit that
        may be armed only after an earlier advance: a send queue can look full while its writer is still
        making progress on a loaded machine, and the writer's deadline is armed at its next write."""
        for _ in range(rounds):
            await self.advance(seconds)
            for _ in range(20):
                if condition():
                    return
                await asyncio.sleep(0.01)
        raise AssertionError(f"never happened: {what}")


@contextlib.asynccontextmanager
async def virtual(**overrides: object) -> AsyncIterator[VirtualServer]:
    # Enough loop iterations between timers for a woken session to re-arm its next wait.
    clock = FakeClock(settle_rounds=64)
    server = ThreadedServer(replace(SETTINGS, **overrides), clock)  # type: ignore[arg-type]
    await asyncio.to_thread(server.start)
    try:
        yield VirtualServer(server, clock)
    finally:
        await asyncio.to_thread(server.stop)
