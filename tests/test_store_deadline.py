"""Behind a held lock, a store write fails typed within its own deadline (docs/operations.md, "Databases"):
``--db-busy-timeout-s`` bounds the whole wait a call sees from the moment it is made, its time queued
behind other writes included. Before, the single writer waited the busy timeout once per queued write, so
the k-th of six concurrent writes failed at k x the timeout.

The bound is checked with a margin of one more timeout for a loaded machine's scheduling (the old code
is 2 to 6 timeouts late for the second to sixth write)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from proto.server.storage.store import ResponseStore, StoreUnavailable

BUSY_S = 1.0  # the margin (one more timeout) is a loaded machine's scheduling
WRITES = 6


async def timed_put(store: ResponseStore, n: int) -> tuple[float, BaseException | None]:
    start = time.monotonic()
    try:
        await store.put(f"resp_{n}", "key_a", b"{}", b"[]", None, "mock-4000tps")
    except StoreUnavailable as exc:
        return time.monotonic() - start, exc
    return time.monotonic() - start, None


@pytest.mark.process  # a second connection holds the file's lock, as another process would
async def test_concurrent_writes_behind_a_held_lock_each_fail_within_one_deadline(tmp_path: Path) -> None:
    db = tmp_path / "lab.db"
    store = ResponseStore(str(db), busy_timeout=BUSY_S)
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        results = await asyncio.gather(*(timed_put(store, n) for n in range(WRITES)))
        for elapsed, error in results:
            assert isinstance(error, StoreUnavailable), results
            assert elapsed < 2 * BUSY_S, [round(e, 2) for e, _ in results]
        holder.rollback()
        # The lock is gone: the next write goes through, and none of the failed ones was written.
        assert (await timed_put(store, WRITES))[1] is None
        assert store.writes == 1
    finally:
        holder.close()
        await store.aclose()
