"""One plain server per test module that imports these fixtures (``from plain_server import http, srv``):
the default settings of helpers.SETTINGS, and an httpx client on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from helpers import running

from proto.server.serve import ThreadedServer


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


@pytest.fixture
async def http(srv: ThreadedServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as client:
        yield client
