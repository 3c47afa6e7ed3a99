"""The response store: roundtrips, per-key isolation, chains, and persistence — on SQLite and on
PostgreSQL (``path``, ``backend``: tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator

import pytest
from databases import Backend

from proto.server.storage.ledger import MIGRATIONS as LEDGER_MIGRATIONS
from proto.server.storage.ledger import LedgerRow, UsageLedger
from proto.server.storage.store import ResponseStore, StoreError

KEY, OTHER = "key_alice", "key_mallory"


def payload(response_id: str, text: str = "hi") -> tuple[bytes, bytes]:
    response = {"id": response_id, "object": "response", "status": "completed", "output_text": text}
    items = [{"type": "message", "role": "user", "content": text}]
    return json.dumps(response).encode(), json.dumps(items).encode()


async def put_chain(store: ResponseStore, n: int, key: str = KEY, prefix: str = "resp_") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    for i, rid in enumerate(ids):
        body, items = payload(rid, f"turn {i}")
        await store.put(rid, key, body, items, ids[i - 1] if i else None, "mock-1000tps")
    return ids


@pytest.fixture
async def store(path: str) -> AsyncIterator[ResponseStore]:
    s = ResponseStore(path)
    yield s
    await s.aclose()


async def test_put_get_roundtrip(store: ResponseStore) -> None:
    body, items = payload("resp_1")
    await store.put("resp_1", KEY, body, items, None, "mock-65tps", created_at=1234.5)
    got = await store.get("resp_1", KEY)
    assert got is not None
    assert (got.response_id, got.api_key_id, got.model, got.previous_response_id) == (
        "resp_1",
        KEY,
        "mock-65tps",
        None,
    )
    assert (got.response_json, got.input_items_json, got.created_at) == (body, items, 1234.5)
    assert await store.input_items("resp_1", KEY) == items
    assert await store.get("resp_missing", KEY) is None
    assert store.writes == 1 and store.reads == 2
    assert store.bytes_read == len(body) + 2 * len(items)


async def test_put_again_replaces_payload_and_keeps_created_at(store: ResponseStore) -> None:
    await store.put("resp_1", KEY, b'{"status":"in_progress"}', b"[]", None, "m", created_at=10.0)
    await store.put("resp_1", KEY, b'{"status":"completed"}', b'[{"a":1}]', None, "m", created_at=99.0)
    got = await store.get("resp_1", KEY)
    assert got is not None
    assert got.response_json == b'{"status":"completed"}' and got.input_items_json == b'[{"a":1}]'
    assert got.created_at == 10.0


async def test_other_key_sees_nothing_and_cannot_overwrite(store: ResponseStore) -> None:
    ids = await put_chain(store, 3)
    assert await store.get(ids[0], OTHER) is None
    assert await store.input_items(ids[0], OTHER) is None
    assert await store.chain(ids[-1], OTHER) is None
    assert await store.delete(ids[0], OTHER) is False
    with pytest.raises(StoreError):
        await store.put(ids[0], OTHER, b"{}", b"[]", None, "m")
    assert await store.get(ids[0], KEY) is not None  # untouched by the other key


async def test_chain_links_must_all_belong_to_the_key(store: ResponseStore) -> None:
    await store.put("resp_a", OTHER, *payload("resp_a"), None, "m")
    await store.put("resp_b", KEY, *payload("resp_b"), "resp_a", "m")
    assert await store.chain("resp_b", KEY) is None


async def test_delete(store: ResponseStore) -> None:
    await store.put("resp_1", KEY, *payload("resp_1"), None, "m")
    assert await store.delete("resp_1", KEY) is True
    assert await store.delete("resp_1", KEY) is False
    assert await store.get("resp_1", KEY) is None
    assert await store.input_items("resp_1", KEY) is None
    assert store.deletes == 1


async def test_chain_of_ten_oldest_first_reads_every_link(store: ResponseStore) -> None:
    ids = await put_chain(store, 10)
    before = store.reads
    chain = await store.chain(ids[-1], KEY)
    assert chain is not None
    assert [r.response_id for r in chain] == ids
    assert json.loads(chain[3].response_json)["output_text"] == "turn 3"
    assert store.reads - before == 10
    middle = await store.chain(ids[4], KEY)
    assert middle is not None and [r.response_id for r in middle] == ids[:5]


async def test_broken_or_cyclic_chain_is_none(store: ResponseStore) -> None:
    ids = await put_chain(store, 5)
    assert await store.delete(ids[2], KEY)
    assert await store.chain(ids[4], KEY) is None
    assert await store.chain(ids[1], KEY) is not None
    assert await store.chain("resp_nope", KEY) is None
    await store.put("resp_x", KEY, *payload("resp_x"), "resp_y", "m")
    await store.put("resp_y", KEY, *payload("resp_y"), "resp_x", "m")
    assert await store.chain("resp_x", KEY) is None
    await store.put("resp_self", KEY, *payload("resp_self"), "resp_self", "m")
    assert await store.chain("resp_self", KEY) is None


async def test_concurrent_puts_and_reads(store: ResponseStore) -> None:
    async def session(s: int) -> None:
        await put_chain(store, 8, prefix=f"resp_{s}_")
        chain = await store.chain(f"resp_{s}_7", KEY)
        assert chain is not None and len(chain) == 8

    await asyncio.gather(*(session(s) for s in range(25)))
    assert store.writes == 200


async def test_sql_runs_off_the_event_loop_thread(store: ResponseStore) -> None:
    sql_threads: set[str] = set()
    store._db.trace = lambda _sql: sql_threads.add(threading.current_thread().name)
    await store.put("resp_1", KEY, *payload("resp_1"), None, "m")
    await store.chain("resp_1", KEY)
    assert len(sql_threads) == 2 and threading.current_thread().name not in sql_threads


async def test_a_memory_store_runs_on_one_thread() -> None:
    store = ResponseStore(":memory:")  # a memory database lives in one connection: one thread does everything
    sql_threads: set[int] = set()
    store._db.trace = lambda _sql: sql_threads.add(threading.get_ident())
    await store.put("resp_1", KEY, *payload("resp_1"), None, "m")
    assert await store.chain("resp_1", KEY) is not None
    assert len(sql_threads) == 1 and threading.get_ident() not in sql_threads
    await store.aclose()


async def test_writes_run_on_the_writer_threads_and_reads_on_a_pool(path: str, backend: Backend) -> None:
    store = ResponseStore(path, readers=2, writers=3)
    name = lambda _db: threading.current_thread().name  # noqa: E731
    writers = set(await asyncio.gather(*(store._write("name", name) for _ in range(20))))
    readers = set(await asyncio.gather(*(store._read("name", name) for _ in range(20))))
    # SQLite has one writer; PostgreSQL takes concurrent writes (up to ``writers`` threads).
    assert 1 <= len(writers) <= (1 if backend.name == "sqlite" else 3)
    assert all(w.startswith("response-store-writer") for w in writers)
    assert 1 <= len(readers) <= 2 and all(r.startswith("response-store-reader") for r in readers)
    await store.put("resp_1", KEY, *payload("resp_1"), None, "m")
    assert await store.get("resp_1", KEY) is not None  # a reader connection sees the writer's commit
    await store.aclose()


async def test_persistence_across_reopen(path: str) -> None:
    first = ResponseStore(path)
    ids = await put_chain(first, 4)
    first.close()
    first.close()  # idempotent
    with pytest.raises(StoreError):
        await first.get(ids[0], KEY)
    second = ResponseStore(path)
    chain = await second.chain(ids[-1], KEY)
    assert chain is not None and [r.response_id for r in chain] == ids
    await second.aclose()


async def test_input_items_must_be_a_json_array(store: ResponseStore) -> None:
    with pytest.raises(ValueError):
        await store.put("resp_1", KEY, b"{}", b'{"not": "an array"}', None, "m")


async def test_store_and_ledger_can_share_one_database(path: str, backend: Backend) -> None:
    store, ledger = ResponseStore(path), UsageLedger(path)
    ledger.start()
    for i in range(50):
        await store.put(f"resp_{i}", KEY, *payload(f"resp_{i}"), None, "m")
        ledger.record(LedgerRow(f"resp_{i}", KEY, "m", "http", "completed", 5, 0, 1, 1, 0.0, 0.0))
    await ledger.aclose()
    await store.aclose()
    reopened = ResponseStore(path)
    assert await reopened.get("resp_49", KEY) is not None
    await reopened.aclose()
    assert ledger.rows_written == 50
    # One version table, one row per component: the same migrations on both databases.
    # (the store's 2: the items table an item_reference reads)
    assert sorted(backend.query("SELECT component, version FROM schema_version")) == [
        ("ledger", len(LEDGER_MIGRATIONS)),
        ("store", 2),
    ]


async def test_two_stores_on_one_database_share_chains_and_isolation(path: str) -> None:
    """Two servers' stores: a chain written through one is read whole through the other, per key."""
    a, b = ResponseStore(path), ResponseStore(path)
    ids = await put_chain(a, 6)
    chain = await b.chain(ids[-1], KEY)
    assert chain is not None and [r.response_id for r in chain] == ids
    assert await b.chain(ids[-1], OTHER) is None
    with pytest.raises(StoreError):
        await b.put(ids[0], OTHER, b"{}", b"[]", None, "m")  # another key's id, through the other server
    assert await b.delete(ids[2], KEY)
    assert await a.chain(ids[-1], KEY) is None  # a deleted link breaks the chain for every server
    await a.aclose()
    await b.aclose()
