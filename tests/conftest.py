"""Shared fixtures: real servers (uvicorn + wsproto) on loopback, each in its own thread and event loop;
the helpers behind them are in tests/helpers.py.

Three markers sort the suite (pyproject.toml declares them; ``make check`` and ``make test`` use them):

- ``process``: the test starts a server (in a thread or as a child process), a subprocess, PostgreSQL or a
  real client. Tests that use the ``server``, ``make_server``, ``srv`` or ``pg`` fixtures, or a PostgreSQL
  ``backend``, get it here; any other test that starts one says so itself (``pytestmark`` or a decorator).
  ``make check`` runs the others. The guard below keeps the marker true: a test without it that starts a
  server or a process fails, in ``make check`` and ``make test`` alike.
- ``serial``: the test asserts on wall-clock time or pace (latencies, rates, CPU per wall second), so it
  runs alone after the parallel part of ``make test`` (two workers on two cores would distort it).
- ``slow``: the test is several CPU-seconds of pure work (a property search, the fast model over a grid, a
  scan of the import graph). ``make test`` runs it; ``make check`` leaves it out, so that the edit loop's
  tier stays under a minute.

Every event and Response object a test receives from ``/v1/responses`` is checked against the spec's
schemas (tests/conformance.py): a test fails on any that does not conform, unless it is marked
``nonconforming`` with the reason it receives such a thing on purpose.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import socket
import sqlite3
import subprocess
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import conformance
import pytest
from databases import Backend, PostgresServer, PostgresUnavailable, TableLock
from helpers import ServerFactory, running

from proto.server.serve import ThreadedServer

# Fixtures that start a server or PostgreSQL: the tests that use them are ``process`` tests. ``srv`` is
# every module's own server (tests/plain_server.py's, and those modules that define their own).
PROCESS_FIXTURES = frozenset({"server", "make_server", "pg", "srv"})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    sources: dict[Path, str] = {}
    for item in items:
        # The Makefile's serial part collects only the modules whose text names ``mark.serial``: a serial
        # test marked any other way would never run there, so it stops the collection instead.
        if item.get_closest_marker("serial") is not None:
            path = Path(str(item.fspath))
            if "mark.serial" not in sources.setdefault(path, path.read_text(encoding="utf-8")):
                raise pytest.UsageError(f"{item.nodeid} is serial, but its module never names mark.serial")
        params = getattr(item, "callspec", None)
        on_postgres = params is not None and params.params.get("backend") == "postgresql"
        if on_postgres or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.process)


class StartsAProcess(RuntimeError):
    """Raised where a test not marked ``process`` starts a server or a process."""


# What a test may not start unless it is marked ``process``: (owner, attribute, what it starts).
GUARDED: tuple[tuple[Any, str, str], ...] = (
    (ThreadedServer, "__init__", "a server (ThreadedServer)"),
    (subprocess.Popen, "__init__", "a subprocess"),
    (multiprocessing.process.BaseProcess, "start", "a multiprocessing process"),
    (socket.socket, "listen", "a listening socket"),
)


@contextlib.contextmanager
def refusing(item: pytest.Item) -> Iterator[None]:
    """GUARDED raise StartsAProcess while inside, unless ``item`` is marked ``process``."""
    if item.get_closest_marker("process") is not None:
        yield
        return
    # socket.socket inherits listen from _socket.socket: what is not in the class's own __dict__ is deleted
    # after.
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in GUARDED]
    for owner, name, what in GUARDED:

        def refuse(*args: Any, _what: str = what, **kwargs: Any) -> Any:
            raise StartsAProcess(
                f"{item.nodeid} starts {_what} but is not marked `process`: mark it (@pytest.mark.process, "
                f"or "
                "pytestmark in its module) so that `make check` leaves it out (tests/conftest.py)"
            )

        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in saved:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


# Setup (the fixtures it needs, of any scope, start there) and the call; not the teardown, where a session's
# fixtures stop (PostgreSQL's pg_ctl stop) after whichever test happens to run last.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with refusing(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        with refusing(item):
            return (yield)
    finally:
        # What the test received that the spec does not admit, even where a client caught what its read
        # raised (an SDK's reader task): reported whether or not the test failed for it.
        if conformance.violations:
            found = "\n".join(conformance.violations[:5])
            pytest.fail(f"received what the spec does not admit (tests/conformance.py):\n{found}", False)


@pytest.fixture(scope="session", autouse=True)
def _conformance_installed() -> Iterator[None]:
    uninstall = conformance.install()
    yield
    uninstall()


@pytest.fixture(autouse=True)
def _conforming(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with no violations, checking unless it is marked ``nonconforming``."""
    conformance.violations.clear()
    conformance.enabled = request.node.get_closest_marker("nonconforming") is None
    yield
    conformance.violations.clear()
    conformance.enabled = True


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
