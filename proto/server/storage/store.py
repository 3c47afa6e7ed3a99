"""The response store: stored Responses and their input items, isolated per API key, in SQLite (the embedded
default) or PostgreSQL (``postgresql://…``, shared by every server), through
``proto.server.storage.database``.

The event loop never waits on the database: every call runs on the store's own threads, and reads do not
queue behind writes. ``put`` and ``delete`` run on ``writers`` threads (SQLite: one, with its
connection, as SQLite wants: writes then run in the order they were called; PostgreSQL: ``writers``, each
lent a pooled connection — calls one caller awaits in turn still run in turn), ``get``, ``input_items``
and ``chain`` on a pool of ``readers`` threads. On SQLite in WAL mode a reader never waits on a writer's
lock, ours or another process's (the ledger may share the file); on PostgreSQL readers never wait on
writers (MVCC). So a write stuck on a lock holds up only the writes behind it. A SQLite memory database
(``":memory:"``) exists in one connection only: it keeps one thread for everything (nothing else can
lock it, so nothing waits long there).

Storage faults are typed: any database error (a lock held longer than ``busy_timeout`` seconds, a disk
error, a missing table, a server that went away…) raises ``StoreUnavailable`` with a message, never a raw
driver error (that is its ``__cause__``), so the caller can end the response with a typed error.
``busy_timeout`` bounds the whole wait of one write call, from the moment it is made: its time queued
behind other writes counts, and its transaction waits for the lock only what is left (SQLite's busy
timeout, PostgreSQL's ``lock_timeout``, set per transaction); a write that reaches the database past
its deadline waits for no lock (it succeeds only if none is held). Every write runs in one transaction.

Isolation: every lookup is keyed by ``(response_id, api_key_id)``, so another key's response is simply not
found, exactly like a missing one (the server answers 404 for both). ``put`` on an id that another key
owns is refused (``StoreError``); ``put`` on one's own id replaces the payloads (a response stored while
in progress, then again once terminal) and keeps the first ``created_at``. Servers sharing PostgreSQL see
one another's responses (a client that reconnects elsewhere continues its chain) under the same rule.

Work counters (``reads``, ``writes``, ``bytes_read``…) count rows and payload bytes: the http-prev
transport's cost shows up as ``chain()`` reading every earlier response on every turn.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from proto.server.storage.database import (
    Connection,
    Database,
    DatabaseClosed,
    Migrations,
    open_database,
    redact,
    transaction,
)

T = TypeVar("T")

# The schema, in order; spelled per dialect by proto.server.storage.database (``{blob}``: BLOB / BYTEA).
MIGRATIONS: Migrations = (
    (
        """CREATE TABLE IF NOT EXISTS responses (
    response_id          TEXT PRIMARY KEY,
    api_key_id           TEXT NOT NULL,
    previous_response_id TEXT,
    model                TEXT NOT NULL,
    created_at           {real} NOT NULL,
    response_json        {blob} NOT NULL,
    input_items_json     {blob} NOT NULL
)""",
    ),
    # 2: every item of a stored response (its inputs and its output), by id: what an ``item_reference``
    # names. Items stored before it have no rows: a reference to one is ``item_not_found``.
    (
        """CREATE TABLE IF NOT EXISTS items (
    api_key_id  TEXT NOT NULL,
    item_id     TEXT NOT NULL,
    response_id TEXT NOT NULL,
    item_json   {blob} NOT NULL,
    PRIMARY KEY (api_key_id, item_id)
)""",
        "CREATE INDEX IF NOT EXISTS items_by_response ON items (response_id)",
    ),
)
_PUT_ITEM = (
    "INSERT INTO items (api_key_id, item_id, response_id, item_json) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (api_key_id, item_id) DO UPDATE SET response_id = excluded.response_id, item_json = "
    "excluded.item_json"
)
_FIELDS = "response_id, api_key_id, response_json, input_items_json, previous_response_id, created_at, model"
_PUT = (
    "INSERT INTO responses (response_id, api_key_id, previous_response_id, model, created_at,"
    " response_json, input_items_json) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (response_id) DO UPDATE SET previous_response_id = excluded.previous_response_id,"
    " model = excluded.model, response_json = excluded.response_json,"
    " input_items_json = excluded.input_items_json WHERE responses.api_key_id = excluded.api_key_id"
)
# The whole chain in one statement (one snapshot, one round trip): the links' ids first, then their rows.
# UNION (not UNION ALL) drops a row already produced, so a chain that loops back ends the recursion.
_CHAIN = (
    "WITH RECURSIVE links(response_id, previous_response_id) AS ("
    " SELECT response_id, previous_response_id FROM responses WHERE response_id = ? AND api_key_id = ?"
    " UNION SELECT r.response_id, r.previous_response_id FROM responses r"
    " JOIN links l ON r.response_id = l.previous_response_id WHERE r.api_key_id = ?)"
    f" SELECT {_FIELDS} FROM responses WHERE api_key_id = ? AND response_id IN (SELECT response_id FROM "
    f"links)"
)


@dataclass(frozen=True)
class StoredResponse:
    response_id: str
    api_key_id: str
    response_json: bytes
    input_items_json: bytes  # a JSON array
    previous_response_id: str | None
    created_at: float  # unix seconds of the first put
    model: str

    @property
    def size(self) -> int:
        return len(self.response_json) + len(self.input_items_json)

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> StoredResponse:
        return cls(row[0], row[1], bytes(row[2]), bytes(row[3]), row[4], float(row[5]), row[6])


class StoreError(RuntimeError):
    """The store refused the call: the id belongs to another API key, or the store is closed."""


class StoreUnavailable(Exception):
    """The database failed the call (locked past ``busy_timeout``, disk error, server gone…): nothing was
    read or written. ``operation`` names the call; the driver's error is the ``__cause__``."""

    def __init__(self, operation: str, message: str) -> None:
        super().__init__(f"response store {operation} failed: {message}")
        self.operation = operation


class ResponseStore:
    def __init__(self, path: str, *, busy_timeout: float = 10.0, readers: int = 4, writers: int = 4) -> None:
        """``path``: a SQLite file, ``":memory:"``, or a ``postgresql://`` URL. ``writers`` applies to
        PostgreSQL only (SQLite has one writer)."""
        if readers < 1 or writers < 1:
            raise ValueError("readers and writers must be >= 1")
        self.path = path
        self.busy_timeout = busy_timeout
        self.reads = 0  # rows read
        self.writes = 0  # rows put
        self.deletes = 0
        self.bytes_read = 0  # payload bytes (response + input items) returned
        self.bytes_written = 0
        self._counts = threading.Lock()  # the counters: readers run on several threads
        self._closed = False
        self._closing = threading.Lock()
        try:  # a database that cannot be reached fails here, not on the first request
            self._db: Database = open_database(
                path, "store", busy_timeout=busy_timeout, pool_size=readers + writers
            )
        except Exception as exc:
            raise StoreUnavailable("open", f"{redact(path)}: {exc}") from exc
        try:
            self._db.migrate("store", MIGRATIONS)  # the schema is in place before the first request
        except Exception as exc:
            self._db.close()
            raise StoreUnavailable("open", f"{redact(path)}: {self._db.describe(exc)}") from exc
        memory = getattr(self._db, "memory", False)
        single = self._db.kind == "sqlite"
        self._writer = ThreadPoolExecutor(
            max_workers=1 if single else writers, thread_name_prefix="response-store-writer"
        )
        self._readers = (
            self._writer
            if memory
            else ThreadPoolExecutor(max_workers=readers, thread_name_prefix="response-store-reader")
        )

    # -- threads and connections -----------------------------------------------------------------------

    async def _call(self, operation: str, fn: Callable[[Connection], T], *, write: bool) -> T:
        errors = self._db.errors
        # A write's deadline runs from the call, not from when the writer reaches it: behind a held lock
        # each queued write would otherwise wait a whole busy timeout of its own after the ones before it
        # (the k-th of k writes failing at k x the timeout). Reads never wait on a writer (WAL, MVCC).
        deadline = time.monotonic() + self.busy_timeout if write else None

        def job() -> T:
            try:
                with self._db.connection(write) as conn:
                    if deadline is None:
                        return fn(conn)
                    # Past the deadline it still tries once, without waiting: a free database takes it.
                    left = max(0.0, deadline - time.monotonic())
                    with transaction(conn, write=True, lock_timeout=left):
                        return fn(conn)
            except DatabaseClosed as exc:
                raise StoreError("response store is closed") from exc
            except errors as exc:
                raise StoreUnavailable(operation, self._db.describe(exc)) from exc

        try:
            future = asyncio.get_running_loop().run_in_executor(self._writer if write else self._readers, job)
        except RuntimeError as exc:  # the executor refuses new work once shut down
            raise StoreError("response store is closed") from exc
        return await future

    async def run(self, operation: str, fn: Callable[[Connection], T], *, write: bool) -> T:
        """``fn`` with a connection on the store's threads (a writer when ``write``), faults typed as the
        store's own calls: for tables another module keeps in this database (the conversations')."""
        return await self._call(operation, fn, write=write)

    def migrate(self, component: str, migrations: Migrations) -> None:
        """Another module's tables in this database, as the store's own: ``StoreUnavailable`` if not."""
        try:
            self._db.migrate(component, migrations)
        except Exception as exc:
            raise StoreUnavailable("open", f"{redact(self.path)}: {self._db.describe(exc)}") from exc

    @property
    def database(self) -> Database:
        """For a component that keeps its own tables here (proto/server/storage/background.py): its
        ``dead_owners`` and its reconciling connection at start-up; every statement through ``run``."""
        return self._db

    async def _write(self, operation: str, fn: Callable[[Connection], T]) -> T:
        return await self._call(operation, fn, write=True)

    async def _read(self, operation: str, fn: Callable[[Connection], T]) -> T:
        return await self._call(operation, fn, write=False)

    # -- API -------------------------------------------------------------------------------------------

    async def put(
        self,
        response_id: str,
        api_key_id: str,
        response_json: bytes,
        input_items_json: bytes,
        previous_response_id: str | None,
        model: str,
        *,
        created_at: float | None = None,
        items: list[tuple[str, bytes]] | None = None,
        also: Callable[[Connection], None] | None = None,
    ) -> None:
        """``items``: (item id, item JSON) of every item the response holds, for ``find_items``; written
        in the same transaction as the response, as is whatever ``also`` writes (a background response's
        row)."""
        if not input_items_json.lstrip().startswith(b"["):
            raise ValueError("input_items_json must be a JSON array")
        row = (
            response_id,
            api_key_id,
            previous_response_id,
            model,
            time.time() if created_at is None else created_at,
            bytes(response_json),
            bytes(input_items_json),
        )

        def put_row(db: Connection) -> None:
            if db.execute(_PUT, row).rowcount == 0:
                raise StoreError(f"response id {response_id!r} belongs to another API key")

        def write(db: Connection) -> None:
            if items or also:  # the response and its items in one transaction
                with transaction(db, write=True):
                    put_row(db)
                    if items:
                        db.executemany(
                            _PUT_ITEM,
                            [(api_key_id, item_id, response_id, bytes(item)) for item_id, item in items],
                        )
                    if also is not None:
                        also(db)
            else:
                put_row(db)
            with self._counts:
                self.writes += 1
                self.bytes_written += len(response_json) + len(input_items_json)

        await self._write("put", write)

    async def get(self, response_id: str, api_key_id: str) -> StoredResponse | None:
        def read(db: Connection) -> StoredResponse | None:
            found = db.execute(
                f"SELECT {_FIELDS} FROM responses WHERE response_id = ? AND api_key_id = ?",
                (response_id, api_key_id),
            ).one()
            return None if found is None else self._counted([StoredResponse.from_row(found)])[0]

        return await self._read("get", read)

    async def input_items(self, response_id: str, api_key_id: str) -> bytes | None:
        def read(db: Connection) -> bytes | None:
            found = db.execute(
                "SELECT input_items_json FROM responses WHERE response_id = ? AND api_key_id = ?",
                (response_id, api_key_id),
            ).one()
            if found is None:
                return None
            with self._counts:
                self.reads += 1
                self.bytes_read += len(found[0])
            return bytes(found[0])

        return await self._read("input_items", read)

    async def delete(self, response_id: str, api_key_id: str) -> bool:
        def remove(db: Connection) -> bool:
            with transaction(db, write=True):
                rowcount = db.execute(
                    "DELETE FROM responses WHERE response_id = ? AND api_key_id = ?",
                    (response_id, api_key_id),
                ).rowcount
                db.execute(
                    "DELETE FROM items WHERE response_id = ? AND api_key_id = ?", (response_id, api_key_id)
                )
            with self._counts:
                self.deletes += rowcount
            return rowcount > 0

        return await self._write("delete", remove)

    async def chain(self, response_id: str, api_key_id: str) -> list[StoredResponse] | None:
        """The conversation ending at ``response_id``, oldest first, read from one snapshot (one statement).

        ``None`` when any link is missing, deleted, another key's, or loops back: a continuation must not
        run on a partial history (the server answers ``previous_response_not_found``).
        """

        def walk(db: Connection) -> list[StoredResponse] | None:
            rows = db.execute(_CHAIN, (response_id, api_key_id, api_key_id, api_key_id)).rows
            by_id = {
                stored.response_id: stored
                for stored in self._counted([StoredResponse.from_row(r) for r in rows])
            }
            links: list[StoredResponse] = []
            next_id: str | None = response_id
            while next_id is not None:
                found = by_id.pop(next_id, None)  # popped: a link met twice is a loop
                if found is None:
                    return None
                links.append(found)
                next_id = found.previous_response_id
            links.reverse()
            return links

        return await self._read("chain", walk)

    async def find_items(self, item_ids: list[str], api_key_id: str) -> dict[str, bytes]:
        """The stored items with these ids (this key's only), by id; a missing id is simply absent."""

        def read(db: Connection) -> dict[str, bytes]:
            found: dict[str, bytes] = {}
            for item_id in dict.fromkeys(item_ids):
                row = db.execute(
                    "SELECT item_json FROM items WHERE api_key_id = ? AND item_id = ?", (api_key_id, item_id)
                ).one()
                if row is not None:
                    found[item_id] = bytes(row[0])
            with self._counts:
                self.reads += len(found)
                self.bytes_read += sum(map(len, found.values()))
            return found

        return await self._read("find_items", read)

    def close(self) -> None:
        """Finish queued calls, close the database, stop the threads. Idempotent; blocks (from the loop,
        ``aclose()``)."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        self._readers.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        self._db.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # -- store-thread helpers --------------------------------------------------------------------------

    def _counted(self, found: list[StoredResponse]) -> list[StoredResponse]:
        with self._counts:
            self.reads += len(found)
            self.bytes_read += sum(stored.size for stored in found)
        return found
