"""Shared fixtures: real servers (uvicorn + wsproto) on loopback, each in its own thread and event loop;
the helpers behind them are in tests/helpers.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator

import pytest
from helpers import ServerFactory, running

from proto.server.run import ThreadedServer


@pytest.fixture(scope="session")
def server() -> Iterator[ThreadedServer]:
    """One open (no API key) fast server for the whole session; tests must not depend on its history."""
    with running() as srv:
        yield srv


@pytest.fixture
def make_server() -> ServerFactory:
    """``with make_server(tool_timeout_s=0.3) as srv:`` — a fresh server with these settings over the fast
    defaults, for tests that need their own settings or a server nobody else has touched."""
    return running



@pytest.fixture
def lock(path: str) -> Iterator[Callable[[], sqlite3.Connection]]:
    """Hold the write lock of the module's ``path`` database file from a second connection (``BEGIN
    EXCLUSIVE``) until COMMIT: ``take()`` takes it, and whatever is still held is rolled back at the end."""
    held: list[sqlite3.Connection] = []

    def take() -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        held.append(db)
        return db

    yield take
    for db in held:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()
