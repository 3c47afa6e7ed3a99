"""The response store under storage faults: every database failure is a typed ``StoreUnavailable``, and a
read never waits behind a write stuck on a lock — on SQLite and on PostgreSQL (``path``, ``lock``,
``backend``: tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from databases import Backend, PostgresServer
from helpers import GUARD

from proto.processes import free_port
from proto.server.storage.store import ResponseStore, StoreError, StoreUnavailable

KEY = "key_alice"


def payload(response_id: str) -> tuple[bytes, bytes]:
    return json.dumps({"id": response_id}).encode(), json.dumps(
        [{"type": "message", "content": "hi"}]
    ).encode()


Lock = Callable[[], Any]


@pytest.fixture
async def store(path: str) -> AsyncIterator[ResponseStore]:
    s = ResponseStore(path, busy_timeout=0.01)
    await s.put("resp_1", KEY, *payload("resp_1"), None, "m")
    yield s
    await s.aclose()


async def test_a_locked_database_fails_writes_typed_and_reads_still_answer(
    store: ResponseStore, backend: Backend, lock: Lock
) -> None:
    holder = lock()
    with pytest.raises(StoreUnavailable) as put_failed:
        await asyncio.wait_for(store.put("resp_2", KEY, *payload("resp_2"), "resp_1", "m"), GUARD)
    assert put_failed.value.operation == "put" and backend.locked_words in str(put_failed.value)
    assert isinstance(put_failed.value.__cause__, sqlite3.OperationalError | psycopg.OperationalError)
    with pytest.raises(StoreUnavailable) as delete_failed:
        await asyncio.wait_for(store.delete("resp_1", KEY), GUARD)
    assert delete_failed.value.operation == "delete"
    # SQLite WAL, PostgreSQL MVCC: readers do not need the write lock.
    assert await store.get("resp_1", KEY) is not None
    assert await store.input_items("resp_1", KEY) is not None
    holder.execute("COMMIT")
    await store.put("resp_2", KEY, *payload("resp_2"), "resp_1", "m")
    chain = await store.chain("resp_2", KEY)
    assert chain is not None and [r.response_id for r in chain] == ["resp_1", "resp_2"]
    assert store.writes == 2


async def test_a_read_does_not_wait_behind_a_write_stuck_on_a_lock(path: str, lock: Lock) -> None:
    store = ResponseStore(path, busy_timeout=GUARD)  # the stuck write waits until the lock goes
    await store.put("resp_1", KEY, *payload("resp_1"), None, "m")
    stuck = threading.Event()
    # The writer waits for the lock at its transaction's start (every store write runs in one).
    store._db.trace = lambda sql: stuck.set() if sql == "BEGIN IMMEDIATE" or "INSERT" in sql else None
    holder = lock()
    put = asyncio.create_task(store.put("resp_2", KEY, *payload("resp_2"), "resp_1", "m"))
    assert await asyncio.to_thread(stuck.wait, GUARD)  # the writer is at its INSERT, waiting on the lock
    got = await asyncio.wait_for(store.get("resp_1", KEY), GUARD)
    chain = await asyncio.wait_for(store.chain("resp_1", KEY), GUARD)
    assert got is not None and chain is not None and await store.get("resp_2", KEY) is None
    assert not put.done()  # the reads answered while the write still waited
    holder.execute("COMMIT")
    await asyncio.wait_for(put, GUARD)
    assert await store.get("resp_2", KEY) is not None
    await store.aclose()


async def test_every_call_turns_a_storage_fault_into_store_unavailable(
    store: ResponseStore, backend: Backend
) -> None:
    backend.query("DROP TABLE responses")
    calls = {
        "put": store.put("resp_3", KEY, *payload("resp_3"), None, "m"),
        "get": store.get("resp_1", KEY),
        "input_items": store.input_items("resp_1", KEY),
        "chain": store.chain("resp_1", KEY),
        "delete": store.delete("resp_1", KEY),
    }
    for operation, call in calls.items():
        with pytest.raises(StoreUnavailable) as failed:
            await call
        assert failed.value.operation == operation and backend.missing_table_words in str(failed.value)


async def test_refusals_stay_store_errors(store: ResponseStore) -> None:
    with pytest.raises(StoreError):
        await store.put("resp_1", "key_mallory", b"{}", b"[]", None, "m")  # another key's id
    await store.aclose()
    with pytest.raises(StoreError):
        await store.get("resp_1", KEY)


def test_a_database_that_cannot_be_opened_is_typed_at_construction(
    tmp_path: Path, pg: PostgresServer
) -> None:
    with pytest.raises(StoreUnavailable) as failed:
        ResponseStore(str(tmp_path / "no-such-dir" / "store.sqlite3"))
    assert failed.value.operation == "open"
    nobody = f"postgresql://lab:secret@127.0.0.1:{free_port()}/lab"  # nothing listens there
    with pytest.raises(StoreUnavailable) as refused:
        ResponseStore(nobody, busy_timeout=2.0)
    assert refused.value.operation == "open" and "refused" in str(refused.value)
    assert "secret" not in str(refused.value)  # the password never reaches a message


async def test_sessions_the_server_ended_cost_no_call(pg: PostgresServer) -> None:
    """The pool checks a connection before lending it: sessions the server ended are replaced, unseen."""
    store = ResponseStore(pg.fresh())
    await store.put("resp_1", KEY, *payload("resp_1"), None, "m")
    await asyncio.gather(*(store.get("resp_1", KEY) for _ in range(8)))  # several pooled sessions in use
    with pg.connect() as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE %s",
            ("responses-lab store pid %",),
        ).fetchone()
    assert ended is not None and ended[0] >= 1
    assert [await store.get("resp_1", KEY) is not None for _ in range(8)] == [True] * 8
    await store.put("resp_2", KEY, *payload("resp_2"), "resp_1", "m")
    chain = await store.chain("resp_2", KEY)
    assert chain is not None and len(chain) == 2
    await store.aclose()
