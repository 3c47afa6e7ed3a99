"""A real server on loopback whose limits run on virtual time (idle, age, tool and send timeouts).

The server's ``Pipeline.clock`` is a ``FakeClock``; the mock GPU keeps its real clock, so rollouts stream
as usual while no limit comes due until the test moves time on with ``advance``. Nothing waits on the wall
clock for a limit: a test says "0.3 s pass" and the server sees exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from helpers import SETTINGS

from proto.server.run import ThreadedServer
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
