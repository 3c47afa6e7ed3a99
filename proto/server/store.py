"""The response store: stored Responses and their input items in SQLite, isolated per API key.

The event loop never waits on the disk: every call runs on the store's own threads, and reads do not
queue behind writes. A file database gets ``writers`` writer threads, each with its connection (``put``,
``delete``), a response id always on the same one (``crc32(id) % writers``: the writes of one response run
in the order they were called), and a pool of ``readers`` threads, each with its own connection (``get``,
``input_items``, ``chain``). In WAL mode a reader never waits on a writer's lock, ours or another
process's (the ledger may share the file). SQLite still commits one writer at a time, but a write stuck on
another process's lock holds up only the writes of its own thread: the others wait for that lock side by
side, each up to its own ``busy_timeout``, instead of one after another (issue 13: behind one writer
thread, every terminal event on the server waited up to 19.75 s). A memory database (``":memory:"``)
exists in one connection only: it keeps one thread for everything (nothing else can lock it).

Storage faults are typed: any SQLite error (a lock held longer than ``busy_timeout`` seconds, a disk
error, a missing table…) raises ``StoreUnavailable`` with a message, never a raw ``sqlite3`` error, so the
caller can end the response with a typed error. ``busy_timeout`` is each connection's SQLite busy timeout:
how long one statement waits for a lock before it fails.

Isolation: every lookup is keyed by ``(response_id, api_key_id)``, so another key's response is simply not
found, exactly like a missing one (the server answers 404 for both). ``put`` on an id that another key
owns is refused (``StoreError``); ``put`` on one's own id replaces the payloads (a response stored while
in progress, then again once terminal) and keeps the first ``created_at``.

Work counters (``reads``, ``writes``, ``bytes_read``…) count rows and payload bytes: the http-prev
transport's cost shows up as ``chain()`` reading every earlier response on every turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    response_id          TEXT PRIMARY KEY,
    api_key_id           TEXT NOT NULL,
    previous_response_id TEXT,
    model                TEXT NOT NULL,
    created_at           REAL NOT NULL,
    response_json        BLOB NOT NULL,
    input_items_json     BLOB NOT NULL
);
"""
_FIELDS = "response_id, api_key_id, response_json, input_items_json, previous_response_id, created_at, model"


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


class StoreError(RuntimeError):
    """The store refused the call: the id belongs to another API key, or the store is closed."""


class StoreUnavailable(Exception):
    """The database failed the call (locked past ``busy_timeout``, disk error, …): nothing was read or
    written. ``operation`` names the call; the ``sqlite3`` error is the ``__cause__``."""

    def __init__(self, operation: str, message: str) -> None:
        super().__init__(f"response store {operation} failed: {message}")
        self.operation = operation


class ResponseStore:
    def __init__(self, path: str, *, busy_timeout: float = 10.0, readers: int = 4, writers: int = 4) -> None:
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
        self._memory = path in (":memory:", "")
        self._local = threading.local()  # each store thread's connection
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._closed = False
        self._writers = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"response-store-writer-{n}")
            for n in range(1 if self._memory else writers)
        ]
        self._readers = (
            self._writers[0]
            if self._memory
            else ThreadPoolExecutor(max_workers=readers, thread_name_prefix="response-store-reader")
        )
        try:
            for writer in self._writers:
                writer.submit(self._open_writer).result()  # fail here, not on the first request
        except sqlite3.Error as exc:
            self._shutdown()
            raise StoreUnavailable("open", str(exc)) from exc

    # -- threads and connections -----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout, check_same_thread=False)
        with self._connections_lock:
            self._connections.append(db)
        self._local.db = db
        return db

    def _open_writer(self) -> None:
        db = self._connect()
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:  # a reader thread's first call
            db = self._connect()
            db.execute("PRAGMA query_only=1")
        return db

    async def _call(self, operation: str, fn: Callable[[sqlite3.Connection], T], executor: ThreadPoolExecutor) -> T:
        def job() -> T:
            try:
                return fn(self._db())
            except sqlite3.Error as exc:
                raise StoreUnavailable(operation, str(exc)) from exc

        try:
            future = asyncio.get_running_loop().run_in_executor(executor, job)
        except RuntimeError as exc:  # the executor refuses new work once shut down
            raise StoreError("response store is closed") from exc
        return await future

    async def _write(self, operation: str, fn: Callable[[sqlite3.Connection], T], key: str = "") -> T:
        """On the writer thread of ``key`` (a response id): one response's writes stay in order."""
        return await self._call(operation, fn, self._writers[zlib.crc32(key.encode()) % len(self._writers)])

    async def _read(self, operation: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._call(operation, fn, self._readers)

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
    ) -> None:
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

        def write(db: sqlite3.Connection) -> None:
            cursor = db.execute(
                "INSERT INTO responses (response_id, api_key_id, previous_response_id, model, created_at,"
                " response_json, input_items_json) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (response_id) DO UPDATE SET previous_response_id = excluded.previous_response_id,"
                " model = excluded.model, response_json = excluded.response_json,"
                " input_items_json = excluded.input_items_json WHERE api_key_id = excluded.api_key_id",
                row,
            )
            if cursor.rowcount == 0:
                raise StoreError(f"response id {response_id!r} belongs to another API key")
            with self._counts:
                self.writes += 1
                self.bytes_written += len(response_json) + len(input_items_json)

        await self._write("put", write, response_id)

    async def get(self, response_id: str, api_key_id: str) -> StoredResponse | None:
        return await self._read("get", lambda db: self._get(db, response_id, api_key_id))

    async def input_items(self, response_id: str, api_key_id: str) -> bytes | None:
        def read(db: sqlite3.Connection) -> bytes | None:
            found = db.execute(
                "SELECT input_items_json FROM responses WHERE response_id = ? AND api_key_id = ?",
                (response_id, api_key_id),
            ).fetchone()
            if found is None:
                return None
            with self._counts:
                self.reads += 1
                self.bytes_read += len(found[0])
            return bytes(found[0])

        return await self._read("input_items", read)

    async def delete(self, response_id: str, api_key_id: str) -> bool:
        def remove(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "DELETE FROM responses WHERE response_id = ? AND api_key_id = ?", (response_id, api_key_id)
            )
            with self._counts:
                self.deletes += cursor.rowcount
            return cursor.rowcount > 0

        return await self._write("delete", remove, response_id)

    async def chain(self, response_id: str, api_key_id: str) -> list[StoredResponse] | None:
        """The conversation ending at ``response_id``, oldest first, read from one snapshot.

        ``None`` when any link is missing, deleted, another key's, or loops back: a continuation must not
        run on a partial history (the server answers ``previous_response_not_found``).
        """

        def walk(db: sqlite3.Connection) -> list[StoredResponse] | None:
            links: list[StoredResponse] = []
            seen: set[str] = set()
            next_id: str | None = response_id
            db.execute("BEGIN")  # one read transaction: a concurrent delete cannot tear the chain
            try:
                while next_id is not None:
                    if next_id in seen:
                        return None
                    seen.add(next_id)
                    found = self._get(db, next_id, api_key_id)
                    if found is None:
                        return None
                    links.append(found)
                    next_id = found.previous_response_id
            finally:
                if db.in_transaction:  # read-only: ending it either way is the same
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
            links.reverse()
            return links

        return await self._read("chain", walk)

    def close(self) -> None:
        """Finish queued calls, close the database, stop the threads. Idempotent; blocks (from the loop,
        ``aclose()``)."""
        with self._connections_lock:
            if self._closed:
                return
            self._closed = True
        self._shutdown()

    def _shutdown(self) -> None:
        self._readers.shutdown(wait=True)
        for writer in self._writers:
            writer.shutdown(wait=True)
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for db in connections:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # -- store-thread helpers --------------------------------------------------------------------------

    def _get(self, db: sqlite3.Connection, response_id: str, api_key_id: str) -> StoredResponse | None:
        found = db.execute(
            f"SELECT {_FIELDS} FROM responses WHERE response_id = ? AND api_key_id = ?",
            (response_id, api_key_id),
        ).fetchone()
        if found is None:
            return None
        stored = StoredResponse(
            found[0], found[1], bytes(found[2]), bytes(found[3]), found[4], float(found[5]), found[6]
        )
        with self._counts:
            self.reads += 1
            self.bytes_read += stored.size
        return stored
