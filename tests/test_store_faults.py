"""The response store under storage faults: every SQLite failure is a typed ``StoreUnavailable``, and a
read never waits behind a write stuck on a lock."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from helpers import GUARD

from proto.server.store import ResponseStore, StoreError, StoreUnavailable

KEY = "key_alice"


def payload(response_id: str) -> tuple[bytes, bytes]:
    return json.dumps({"id": response_id}).encode(), json.dumps([{"type": "message", "content": "hi"}]).encode()


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "store.sqlite3")


@pytest.fixture
async def store(path: str) -> AsyncIterator[ResponseStore]:
    s = ResponseStore(path, busy_timeout=0.01)
    await s.put("resp_1", KEY, *payload("resp_1"), None, "m")
    yield s
    await s.aclose()


async def test_a_locked_database_fails_writes_typed_and_reads_still_answer(
    store: ResponseStore, lock: Callable[[], sqlite3.Connection]
) -> None:
    holder = lock()
    with pytest.raises(StoreUnavailable) as put_failed:
        await asyncio.wait_for(store.put("resp_2", KEY, *payload("resp_2"), "resp_1", "m"), GUARD)
    assert put_failed.value.operation == "put" and "locked" in str(put_failed.value)
    assert isinstance(put_failed.value.__cause__, sqlite3.OperationalError)
    with pytest.raises(StoreUnavailable) as delete_failed:
        await asyncio.wait_for(store.delete("resp_1", KEY), GUARD)
    assert delete_failed.value.operation == "delete"
    # WAL: readers do not need the write lock.
    assert await store.get("resp_1", KEY) is not None
    assert await store.input_items("resp_1", KEY) is not None
    holder.execute("COMMIT")
    await store.put("resp_2", KEY, *payload("resp_2"), "resp_1", "m")
    chain = await store.chain("resp_2", KEY)
    assert chain is not None and [r.response_id for r in chain] == ["resp_1", "resp_2"]
    assert store.writes == 2


async def test_a_read_does_not_wait_behind_a_write_stuck_on_a_lock(path: str, lock: Callable[[], sqlite3.Connection]) -> None:
    store = ResponseStore(path, busy_timeout=GUARD)  # the stuck write waits until the lock goes
    await store.put("resp_1", KEY, *payload("resp_1"), None, "m")
    stuck = threading.Event()
    await store._write("trace", lambda db: db.set_trace_callback(lambda sql: stuck.set() if "INSERT" in sql else None), "resp_2")
    holder = lock()
    put = asyncio.create_task(store.put("resp_2", KEY, *payload("resp_2"), "resp_1", "m"))
    assert await asyncio.to_thread(stuck.wait, GUARD)  # the writer is inside SQLite, waiting on the lock
    got = await asyncio.wait_for(store.get("resp_1", KEY), GUARD)
    chain = await asyncio.wait_for(store.chain("resp_1", KEY), GUARD)
    assert got is not None and chain is not None and await store.get("resp_2", KEY) is None
    assert not put.done()  # the reads answered while the write still waited
    holder.execute("COMMIT")
    await asyncio.wait_for(put, GUARD)
    assert await store.get("resp_2", KEY) is not None
    await store.aclose()


async def test_every_call_turns_a_storage_fault_into_store_unavailable(store: ResponseStore, path: str) -> None:
    with sqlite3.connect(path) as other:
        other.execute("DROP TABLE responses")
    other.close()
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
        assert failed.value.operation == operation and "no such table" in str(failed.value)


async def test_refusals_stay_store_errors(store: ResponseStore) -> None:
    with pytest.raises(StoreError):
        await store.put("resp_1", "key_mallory", b"{}", b"[]", None, "m")  # another key's id
    await store.aclose()
    with pytest.raises(StoreError):
        await store.get("resp_1", KEY)


def test_a_database_that_cannot_be_opened_is_typed_at_construction(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable) as failed:
        ResponseStore(str(tmp_path / "no-such-dir" / "store.sqlite3"))
    assert failed.value.operation == "open"


async def test_writes_of_two_responses_wait_for_a_lock_side_by_side_not_one_after_the_other(path: str, lock: Callable[[], sqlite3.Connection]) -> None:
    store = ResponseStore(path, busy_timeout=GUARD, writers=2)  # both writes wait until the lock goes
    first, second = "resp_a", next(f"resp_{n}" for n in range(100) if zlib.crc32(f"resp_{n}".encode()) % 2 != zlib.crc32(b"resp_a") % 2)
    inside = {first: threading.Event(), second: threading.Event()}
    for response_id, event in inside.items():
        await store._write("trace", lambda db, e=event: db.set_trace_callback(lambda sql: e.set() if "INSERT" in sql else None), response_id)
    holder = lock()
    puts = [asyncio.create_task(store.put(r, KEY, *payload(r), None, "m")) for r in (first, second)]
    # Both are inside SQLite at once, waiting for the lock: behind one writer thread, the second would not
    # start before the first had given up (10 s by default, for every terminal event on the server).
    assert await asyncio.to_thread(inside[first].wait, GUARD) and await asyncio.to_thread(inside[second].wait, GUARD)
    assert not any(p.done() for p in puts)
    holder.execute("COMMIT")
    await asyncio.wait_for(asyncio.gather(*puts), GUARD)
    assert store.writes == 2
    await store.aclose()
