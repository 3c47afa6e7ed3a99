"""The billing stage: a usage ledger in SQLite, one row per response, written off the hot path.

``record()`` only validates the row and puts it on a bounded queue; one background thread takes rows off
in batches and inserts each batch in one transaction (WAL, ``synchronous=NORMAL``: a crash may lose the
last transactions, a clean ``close()`` loses nothing).

Policies:
- Duplicate ``response_id`` (billing a response twice is a bug): the row is refused by the primary key,
  the first row stays, ``duplicates`` counts it and the id is logged (``duplicate_ids`` keeps the last 100).
- Queue full (the disk cannot keep up): ``record()`` blocks the caller up to ``put_timeout`` seconds, then
  raises ``LedgerFullError``. Rows are never dropped silently; ``queue_full_waits`` counts the stalls.
- A failed batch (disk error) is rolled back, counted in ``failed`` and logged with its ids.

Lifecycle: ``start()`` (or ``async astart()``) spawns the writer; ``close()`` / ``async aclose()`` writes
everything queued before it returns; ``flush()`` waits for what is queued so far (tests, admin).
"""

from __future__ import annotations

import asyncio
import hashlib
import queue
import sqlite3
import threading
from collections import deque
from dataclasses import astuple, dataclass, fields
from typing import Final

import structlog

log = structlog.get_logger(__name__)

DEFAULT_DB_PATH: Final = "responses-lab.sqlite3"
MODES: Final = ("http", "http-prev", "ws", "longlived")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    response_id   TEXT PRIMARY KEY,
    api_key_id    TEXT NOT NULL,
    model         TEXT NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ('http', 'http-prev', 'ws', 'longlived')),
    status        TEXT NOT NULL,
    input_tokens  INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    turns         INTEGER NOT NULL,
    created_at    REAL NOT NULL,
    completed_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_by_key ON usage (api_key_id, created_at);
"""


def fingerprint_api_key(api_key: str | None) -> str:
    """The ``api_key_id`` the ledger and the store keep: never the key itself.

    An unsalted hash is enough because API keys are long random strings (no dictionary to try); the open
    server (no keys configured) bills everything to ``"anonymous"``.
    """
    if not api_key:
        return "anonymous"
    return "key_" + hashlib.sha256(api_key.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class LedgerRow:
    response_id: str
    api_key_id: str
    model: str
    mode: str  # one of MODES
    status: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    turns: int
    created_at: float  # unix seconds
    completed_at: float

    def __post_init__(self) -> None:
        # Refused at record() time, on the caller's stack, rather than later in the writer thread.
        if self.mode not in MODES:
            raise ValueError(f"ledger mode must be one of {MODES}, not {self.mode!r}")
        if min(self.input_tokens, self.cached_tokens, self.output_tokens, self.turns) < 0:
            raise ValueError("ledger token counts and turns must be >= 0")


_COLUMNS: Final = ", ".join(f.name for f in fields(LedgerRow))
_INSERT: Final = (
    f"INSERT OR IGNORE INTO usage ({_COLUMNS}) VALUES ({', '.join('?' * len(fields(LedgerRow)))})"
)


class LedgerError(RuntimeError):
    pass


class LedgerFullError(LedgerError):
    """The writer fell ``put_timeout`` seconds behind a full queue: the row was not accepted."""


class _Stop:
    pass


_STOP: Final = _Stop()
_Item = LedgerRow | threading.Event | _Stop


class UsageLedger:
    def __init__(
        self,
        path: str = DEFAULT_DB_PATH,
        *,
        queue_size: int = 10_000,
        batch_size: int = 500,
        put_timeout: float = 5.0,
    ) -> None:
        # One connection shared by the writer and readers under a lock: it is the only way ":memory:"
        # shows the same database to both, and readers are rare (tests, admin).
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db_lock = threading.Lock()
        with self._db_lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=queue_size)
        self._batch_size = batch_size
        self._put_timeout = put_timeout
        self._thread: threading.Thread | None = None
        self._closed = False
        self._db_closed = False
        self.path = path
        self.rows_written = 0
        self.duplicates = 0
        self.failed = 0
        self.queue_full_waits = 0
        self.duplicate_ids: deque[str] = deque(maxlen=100)

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        if self._closed:
            raise LedgerError("ledger is closed")
        self._thread = threading.Thread(target=self._run, name="usage-ledger-writer", daemon=True)
        self._thread.start()

    async def astart(self) -> None:
        self.start()

    def close(self) -> None:
        """Write everything queued, stop the writer, close the database. Idempotent."""
        if self._closed:
            return
        self._closed = True  # record() refuses from here on, so the queue only drains
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
        self._drain()  # never started, or rows that raced past the _closed check
        with self._db_lock:
            self._db.close()
            self._db_closed = True

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def flush(self, timeout: float | None = 30.0) -> None:
        """Return once every row queued before this call is committed."""
        if self._thread is None or self._closed:
            raise LedgerError("flush() needs a started, open ledger")
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(timeout):
            raise LedgerError(f"ledger flush timed out after {timeout}s")

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)

    # -- hot path --------------------------------------------------------------------------------------

    def record(self, row: LedgerRow) -> None:
        """Queue ``row`` for the writer; returns at once unless the queue is full (see module policy)."""
        if self._closed:
            raise LedgerError("ledger is closed")
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            self.queue_full_waits += 1
            try:
                self._queue.put(row, timeout=self._put_timeout)
            except queue.Full:
                raise LedgerFullError(f"usage ledger queue full for {self._put_timeout}s") from None

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    # -- writer thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < self._batch_size:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._handle(items):
                return

    def _handle(self, items: list[_Item]) -> bool:
        """Write rows in queue order; flush markers are set once the rows before them are committed."""
        rows: list[LedgerRow] = []
        for item in items:
            if isinstance(item, LedgerRow):
                rows.append(item)
                continue
            self._write(rows)
            rows = []
            if isinstance(item, _Stop):
                return True
            item.set()
        self._write(rows)
        return False

    def _drain(self) -> None:
        items: list[_Item] = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._handle(items)

    def _write(self, rows: list[LedgerRow]) -> None:
        if not rows:
            return
        duplicates: list[str] = []
        with self._db_lock:
            try:
                self._db.execute("BEGIN")
                for row in rows:
                    if self._db.execute(_INSERT, astuple(row)).rowcount == 0:
                        duplicates.append(row.response_id)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self.failed += len(rows)
                log.error("ledger.write_failed", error=str(exc), response_ids=[r.response_id for r in rows])
                return
        self.rows_written += len(rows) - len(duplicates)
        self.duplicates += len(duplicates)
        for response_id in duplicates:
            self.duplicate_ids.append(response_id)
            log.error("ledger.duplicate_response", response_id=response_id)

    # -- reading back ----------------------------------------------------------------------------------

    def get(self, response_id: str) -> LedgerRow | None:
        rows = self._select("WHERE response_id = ?", (response_id,))
        return rows[0] if rows else None

    def rows(
        self, *, api_key_id: str | None = None, mode: str | None = None, limit: int | None = None
    ) -> list[LedgerRow]:
        """Committed rows (not those still queued), oldest first."""
        where, args = [], []
        for column, value in (("api_key_id", api_key_id), ("mode", mode)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = ("WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at, rowid"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._select(sql, tuple(args))

    def _select(self, tail: str, args: tuple[object, ...]) -> list[LedgerRow]:
        with self._db_lock:
            if self._db_closed:
                raise LedgerError("ledger is closed")
            cursor = self._db.execute(f"SELECT {_COLUMNS} FROM usage {tail}", args)
            return [LedgerRow(*r) for r in cursor.fetchall()]
