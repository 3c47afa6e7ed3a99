"""Shared fixtures: real servers (uvicorn + wsproto) on loopback, each in its own thread and event loop;
the helpers behind them are in tests/helpers.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from databases import Backend, PostgresServer, PostgresUnavailable, TableLock
from helpers import ServerFactory, running

from proto.server.serve import ThreadedServer


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



@pytest.fixture(scope="session")
def pg() -> Iterator[PostgresServer]:
    """The suite's own PostgreSQL server (tests/databases.py), started on first use, stopped at the end.
    It failing to start fails every test that needs it, with the reason: never a skip."""
    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as exc:
        server.stop()
        pytest.fail(f"PostgreSQL could not be started: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """This test's own database, once a SQLite file and once a PostgreSQL schema."""
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "lab.sqlite3"))
    server: PostgresServer = request.getfixturevalue("pg")
    return Backend("postgresql", server.fresh(), server)


@pytest.fixture
def path(backend: Backend) -> str:
    """The database the store and ledger under test open: a SQLite path or a ``postgresql://`` URL."""
    return backend.url


@pytest.fixture
def lock(backend: Backend) -> Iterator[Callable[[], sqlite3.Connection | TableLock]]:
    """Hold the write lock of this test's database from another session until COMMIT (SQLite: ``BEGIN
    EXCLUSIVE``; PostgreSQL: every table locked ``IN EXCLUSIVE MODE``): ``take()`` takes it, and whatever
    is still held is rolled back at the end."""
    held: list[sqlite3.Connection | TableLock] = []

    def take() -> sqlite3.Connection | TableLock:
        holder = backend.lock()
        held.append(holder)
        return holder

    yield take
    for holder in held:
        if holder.in_transaction:
            holder.rollback()
        holder.close()
