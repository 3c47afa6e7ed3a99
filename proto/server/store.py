"""The response store: stored Responses and their input items in SQLite, isolated per API key.

Every call runs on one dedicated worker thread that owns the connection, so the event loop never waits on
the disk and SQLite sees a single writer (no ``database is locked`` between our own calls; the ledger may
share the file, WAL lets its writer and ours take turns under ``busy_timeout``).

Isolation: every lookup is keyed by ``(response_id, api_key_id)``, so another key's response is simply not
found, exactly like a missing one (the server answers 404 for both). ``put`` on an id that another key
owns is refused (``StoreError``); ``put`` on one's own id replaces the payloads (a response stored while
in progress, then again once terminal) and keeps the first ``created_at``.

Work counters (``reads``, ``writes``, ``bytes_read``…) count rows and payload bytes: the http-prev
transport's cost shows up as ``chain()`` reading every earlier response on every turn.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
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
    pass


class ResponseStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self.reads = 0  # rows read
        self.writes = 0  # rows put
        self.deletes = 0
        self.bytes_read = 0  # payload bytes (response + input items) returned
        self.bytes_written = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store")
        self._db: sqlite3.Connection | None = None
        self._executor.submit(self._open).result()  # fail here, not on the first request

    def _open(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        self._db = db

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._db is None:
                raise StoreError("response store is closed")
            return fn(self._db)

        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, job)
        except RuntimeError as exc:  # the executor refuses new work once shut down
            raise StoreError("response store is closed") from exc
        return await future

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
            self.writes += 1
            self.bytes_written += len(response_json) + len(input_items_json)

        await self._call(write)

    async def get(self, response_id: str, api_key_id: str) -> StoredResponse | None:
        return await self._call(lambda db: self._get(db, response_id, api_key_id))

    async def input_items(self, response_id: str, api_key_id: str) -> bytes | None:
        def read(db: sqlite3.Connection) -> bytes | None:
            found = db.execute(
                "SELECT input_items_json FROM responses WHERE response_id = ? AND api_key_id = ?",
                (response_id, api_key_id),
            ).fetchone()
            if found is None:
                return None
            self.reads += 1
            self.bytes_read += len(found[0])
            return bytes(found[0])

        return await self._call(read)

    async def delete(self, response_id: str, api_key_id: str) -> bool:
        def remove(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "DELETE FROM responses WHERE response_id = ? AND api_key_id = ?", (response_id, api_key_id)
            )
            self.deletes += cursor.rowcount
            return cursor.rowcount > 0

        return await self._call(remove)

    async def chain(self, response_id: str, api_key_id: str) -> list[StoredResponse] | None:
        """The conversation ending at ``response_id``, oldest first.

        ``None`` when any link is missing, deleted, another key's, or loops back: a continuation must not
        run on a partial history (the server answers ``previous_response_not_found``).
        """

        def walk(db: sqlite3.Connection) -> list[StoredResponse] | None:
            links: list[StoredResponse] = []
            seen: set[str] = set()
            next_id: str | None = response_id
            while next_id is not None:
                if next_id in seen:
                    return None
                seen.add(next_id)
                found = self._get(db, next_id, api_key_id)
                if found is None:
                    return None
                links.append(found)
                next_id = found.previous_response_id
            links.reverse()
            return links

        return await self._call(walk)

    def close(self) -> None:
        """Finish queued calls, close the database, stop the thread. Idempotent."""

        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        try:
            self._executor.submit(shut).result()
        except RuntimeError:
            return  # already shut down
        self._executor.shutdown(wait=True)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # -- worker-thread helpers -------------------------------------------------------------------------

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
        self.reads += 1
        self.bytes_read += stored.size
        return stored
