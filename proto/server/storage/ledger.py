"""The billing stage: a usage ledger, one row per response, written off the hot path, in SQLite (the
embedded default) or PostgreSQL (``postgresql://…``: one ledger for every server), through
``proto.server.storage.database`` — the policies below are the same on both.

The event loop never waits on the database. ``started()``, ``progress()`` and ``record()`` validate their
arguments and append to an in-memory pending buffer (a lock held only for that append, never across SQL
or a sleep); one background thread takes the buffer in FIFO batches and writes each batch in one
transaction (SQLite: WAL, ``synchronous=NORMAL``; PostgreSQL: a pooled connection).

Two tables, three facts per response:
- ``started()`` writes an *open* row (table ``open_responses``) when a response starts;
- ``progress()`` updates that open row with what was delivered so far (several updates of one id still in
  the buffer are coalesced into one, the latest figures win);
- ``record()`` writes the final usage row (table ``usage``) and deletes the open row, in the same
  transaction.
At start-up, before serving, ``reconcile()`` turns every open row left by a dead process into a usage row
with status ``incomplete``, reason ``server_crashed`` (the ``reason`` column, which for every other row holds
the terminal event's ``incomplete_details.reason`` or error code) and the open row's last progress
figures. Who is dead: a ledger whose owner lock is free — on SQLite a ``flock`` on a file named after its
owner id, on PostgreSQL (many servers, many hosts) an advisory lock held by its database session; each is
held for as long as the ledger lives and released by the system when its process dies (see
``proto.server.storage.database``), so a server that starts never bills the responses another one is serving.

Guarantees (one server process per SQLite file, enforced by the server's claim on it; any number of servers
on one PostgreSQL database):
- Never twice: the ``usage`` primary key refuses a second row for an id, whoever writes it, on whichever
  server (a retried batch, a buggy caller, ``reconcile()`` racing another server's).
- A response whose ``record()`` returned is billed exactly once unless the process dies (or ``close()``'s
  deadline passes) before its batch commits: the writer retries a failed batch (exponential backoff from
  ``retry_initial`` doubling to ``retry_max``) until the database takes it, for as long as the server runs.
- Only a crash loses rows still in the buffer (normally milliseconds' worth). A committed transaction
  survives a crash of the process (SIGKILL) in WAL mode; a power loss or an OS crash may roll back the
  last transactions (``synchronous=NORMAL``). On PostgreSQL a commit is as durable as the server's
  ``synchronous_commit`` makes it.
- A response in flight at a crash is billed at most once, and at least the figures of its last durable
  ``progress()`` (zero tokens if none was durable yet), provided its ``started()`` was durable: a
  response whose open row was still in the buffer at the crash leaves no trace and is not billed.
- ``close()`` keeps retrying up to its deadline; what it still could not write is counted in ``failed``
  and logged with its ids (``ledger.close_unwritten``). A response whose open row was durable is then
  billed ``incomplete`` by the next start's ``reconcile()``.

Policies:
- Duplicate ``response_id`` (billing a response twice is a bug): the row is refused by the primary key,
  the first row stays, ``duplicates`` counts it and the id is logged (``duplicate_ids`` keeps the last 100).
  A duplicate is not a write error: it is never retried.
- A database that cannot take writes (read-only, disk full, I/O error, PostgreSQL gone: anything but a lock
  held by another writer) is ``unwritable`` from the writer's first failed attempt to its first success
  (it keeps retrying, so that is within ``retry_max`` of the cause going away); the server refuses new
  responses meanwhile. A lock wait is not: the rows wait in the buffer and are written once it goes.
  ``migrate`` writes at construction, so a database that cannot take writes fails ``UsageLedger()``.
- Pending buffer full (``max_pending`` operations not yet durable: the disk has been failing or slow for a
  long time): the call raises ``LedgerFullError`` at once and ``overflow`` counts it. Nothing waits.
  A ``progress()`` coalesced into an update already pending never overflows.
- A batch that fails for a reason tied to one of its rows (constraint, binding: in practice impossible,
  rows are validated on the caller's stack) is split; the offending operation is dropped, counted in
  ``failed`` and logged (``ledger.row_rejected``) instead of blocking every row behind it forever.

Counters, plain ints readable from the loop: ``rows_written`` (usage rows inserted, reconciled ones
included), ``retries`` (failed write attempts that were retried), ``pending`` (operations accepted and not
yet durable: open rows, progress updates, usage rows), ``failed`` (usage rows given up on), ``overflow``,
``duplicates``, ``reconciled``.

Lifecycle: ``reconcile()`` (or ``async areconcile()``) before serving, ``start()`` (or ``async astart()``)
spawns the writer; ``close()`` / ``async aclose()`` writes everything pending (up to the deadline) before
it returns; ``flush()`` waits for what is pending so far (tests, admin).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
from collections import deque
from dataclasses import astuple, dataclass, fields
from typing import Any, Final

import structlog

from proto.core.caching import billed_input
from proto.core.response import MODES
from proto.server.storage.database import (
    Connection,
    Database,
    DatabaseClosed,
    Migrations,
    open_database,
    redact,
    transaction,
)

log = structlog.get_logger(__name__)

DEFAULT_DB_PATH: Final = "responses-lab.sqlite3"
_MODES_SQL: Final = ", ".join(f"'{mode}'" for mode in MODES)
INCOMPLETE: Final = "incomplete"  # the status reconcile() bills a response that never ended
CRASHED: Final = "server_crashed"  # ... and its reason (the usage row's ``reason`` column)


def _rebuild(table: str, columns: tuple[tuple[str, str], ...], indexes: tuple[str, ...]) -> tuple[str, ...]:
    names = ", ".join(name for name, _ in columns)
    body = ",\n    ".join(f"{name} {kind}" for name, kind in columns)
    return (
        f"CREATE TABLE {table}__rebuilt (\n    {body}{{seq}}\n)",
        f"INSERT INTO {table}__rebuilt ({names}) SELECT {names} FROM {table} ORDER BY created_at, "
        f"response_id",
        f"DROP TABLE {table}",
        f"ALTER TABLE {table}__rebuilt RENAME TO {table}",
        *(f"CREATE INDEX IF NOT EXISTS {index}" for index in indexes),
    )


_MODE_COLUMN: Final = f"TEXT NOT NULL CHECK (mode IN ({_MODES_SQL}))"
_USAGE_COLUMNS: Final = (
    ("response_id", "TEXT PRIMARY KEY"),
    ("api_key_id", "TEXT NOT NULL"),
    ("model", "TEXT NOT NULL"),
    ("mode", _MODE_COLUMN),
    ("status", "TEXT NOT NULL"),
    ("input_tokens", "{int} NOT NULL"),
    ("cached_tokens", "{int} NOT NULL"),
    ("output_tokens", "{int} NOT NULL"),
    ("turns", "{int} NOT NULL"),
    ("created_at", "{real} NOT NULL"),
    ("completed_at", "{real} NOT NULL"),
    ("reason", "TEXT NOT NULL DEFAULT ''"),
)
_OPEN_COLUMNS_DDL: Final = (
    ("response_id", "TEXT PRIMARY KEY"),
    ("api_key_id", "TEXT NOT NULL"),
    ("model", "TEXT NOT NULL"),
    ("mode", _MODE_COLUMN),
    ("created_at", "{real} NOT NULL"),
    ("input_tokens", "{int} NOT NULL DEFAULT 0"),
    ("cached_tokens", "{int} NOT NULL DEFAULT 0"),
    ("output_tokens", "{int} NOT NULL DEFAULT 0"),
    ("turns", "{int} NOT NULL DEFAULT 0"),
    ("progress_at", "{real}"),
    ("owner", "TEXT NOT NULL"),
)

# The schema, in order; spelled per dialect by proto.server.storage.database (``{int}``, ``{real}``,
# ``{seq}``).
MIGRATIONS: Migrations = (
    (
        f"""CREATE TABLE IF NOT EXISTS usage (
    response_id   TEXT PRIMARY KEY,
    api_key_id    TEXT NOT NULL,
    model         TEXT NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ({_MODES_SQL})),
    status        TEXT NOT NULL,
    input_tokens  {{int}} NOT NULL,
    cached_tokens {{int}} NOT NULL,
    output_tokens {{int}} NOT NULL,
    turns         {{int}} NOT NULL,
    created_at    {{real}} NOT NULL,
    completed_at  {{real}} NOT NULL{{seq}}
)""",
        "CREATE INDEX IF NOT EXISTS usage_by_key ON usage (api_key_id, created_at)",
        f"""CREATE TABLE IF NOT EXISTS open_responses (
    response_id   TEXT PRIMARY KEY,
    api_key_id    TEXT NOT NULL,
    model         TEXT NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ({_MODES_SQL})),
    created_at    {{real}} NOT NULL,
    input_tokens  {{int}} NOT NULL DEFAULT 0,
    cached_tokens {{int}} NOT NULL DEFAULT 0,
    output_tokens {{int}} NOT NULL DEFAULT 0,
    turns         {{int}} NOT NULL DEFAULT 0,
    progress_at   {{real}},
    owner         TEXT NOT NULL{{seq}}
)""",
    ),
    # 2: why a row ended other than completed — ``incomplete_details.reason`` or ``error.code``
    # of its terminal event, ``server_crashed`` for the rows reconcile() bills; "" when completed.
    ("ALTER TABLE usage ADD COLUMN reason TEXT NOT NULL DEFAULT ''",),
    # 3: the mode CHECK takes ``MODES`` as they are now (``http-cached``). SQLite cannot alter a
    # constraint, so both tables are rebuilt the way its documentation prescribes for any schema change
    # (create the new table, copy the rows, drop the old one, rename the new one), in the migration's one
    # transaction; the same statements run on PostgreSQL. Rows are copied by name in their creation order
    # (the new table numbers them afresh: ``seq`` on PostgreSQL, the rowid on SQLite).
    _rebuild("usage", _USAGE_COLUMNS, ("usage_by_key ON usage (api_key_id, created_at)",)),
    _rebuild("open_responses", _OPEN_COLUMNS_DDL, ()),
    # 4: prompt tokens written to the prefix cache, billed at their own rate (docs/protocol.md, "Prompt
    # caching"); rows from before it wrote none.
    ("ALTER TABLE usage ADD COLUMN cache_write_tokens {int} NOT NULL DEFAULT 0",),
    # 5: the part of them written for 12 h (``cache_write_tokens_details.ttl_12h_tokens``), which has a
    # rate of its own (``proto.core.caching.WRITE_RATE_BY_TTL``); rows from before it wrote none.
    ("ALTER TABLE usage ADD COLUMN cache_write_12h_tokens {int} NOT NULL DEFAULT 0",),
)


def fingerprint_api_key(api_key: str | None) -> str:
    """The ``api_key_id`` the ledger and the store keep: never the key itself.

    An unsalted hash is enough because API keys are long random strings (no dictionary to try); the open
    server (no keys configured) bills everything to ``"anonymous"``.
    """
    if not api_key:
        return "anonymous"
    return "key_" + hashlib.sha256(api_key.encode()).hexdigest()[:24]


def _check_mode(mode: object) -> None:
    if mode not in MODES:
        raise ValueError(f"ledger mode must be one of {MODES}, not {mode!r}")


def _check_text(**values: object) -> None:
    for name, value in values.items():
        if not isinstance(value, str):
            raise ValueError(f"ledger {name} must be a str, not {type(value).__name__}")


def _check_counts(**values: object) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"ledger {name} must be an int, not {type(value).__name__}")
        if value < 0:
            raise ValueError("ledger token counts and turns must be >= 0")


def _check_times(**values: object) -> None:
    for name, value in values.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"ledger {name} must be unix seconds, not {type(value).__name__}")


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
    # Why it ended other than completed: the terminal event's incomplete_details.reason or error code
    # ("cancelled", "max_output_tokens", "engine_failure", …); "server_crashed" from reconcile(); "" if none.
    reason: str = ""
    cache_write_tokens: int = 0  # input tokens written to the prompt cache (a part of input_tokens)
    cache_write_12h_tokens: int = 0  # of those, the ones written for 12 h

    @property
    def billed_input_tokens(self) -> float:
        """Input at the uncached rate, cached reads apart: writes at their model's and lifetime's rate (1.25
        from GPT-5.6: ``proto.core.caching.billed_input``)."""
        return billed_input(
            self.model,
            self.input_tokens,
            self.cached_tokens,
            self.cache_write_tokens,
            self.cache_write_12h_tokens,
        )

    def __post_init__(self) -> None:
        # Refused at record() time, on the caller's stack, rather than later in the writer thread.
        _check_mode(self.mode)
        _check_text(
            response_id=self.response_id,
            api_key_id=self.api_key_id,
            model=self.model,
            status=self.status,
            reason=self.reason,
        )
        _check_counts(
            input_tokens=self.input_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            turns=self.turns,
            cache_write_tokens=self.cache_write_tokens,
            cache_write_12h_tokens=self.cache_write_12h_tokens,
        )
        _check_times(created_at=self.created_at, completed_at=self.completed_at)


@dataclass(frozen=True)
class OpenResponse:
    """A response that started and is not billed yet, with what was delivered so far (durable rows only)."""

    response_id: str
    api_key_id: str
    model: str
    mode: str
    created_at: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    turns: int
    progress_at: float | None  # unix seconds of the last durable progress(); None: none yet


@dataclass(frozen=True)
class _Start:
    response_id: str
    api_key_id: str
    model: str
    mode: str
    created_at: float


@dataclass
class _Progress:  # mutable: a later progress() of the same id overwrites it while it is still pending
    response_id: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    turns: int
    at: float


_Op = LedgerRow | _Start | _Progress


def _kind(op: _Op) -> str:
    return "usage row" if isinstance(op, LedgerRow) else "open row" if isinstance(op, _Start) else "progress"


_Entry = tuple[int, _Op]  # (sequence number, operation)

_COLUMNS: Final = ", ".join(f.name for f in fields(LedgerRow))
# ON CONFLICT DO NOTHING: the primary key is the idempotency key; a refused row is counted as duplicate.
_INSERT: Final = (
    f"INSERT INTO usage ({_COLUMNS}) VALUES ({', '.join('?' * len(fields(LedgerRow)))})"
    " ON CONFLICT (response_id) DO NOTHING"
)
_OPEN_COLUMNS: Final = ", ".join(f.name for f in fields(OpenResponse))
_INSERT_OPEN: Final = (
    "INSERT INTO open_responses (response_id, api_key_id, model, mode, created_at, owner)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (response_id) DO NOTHING"
)
_UPDATE_PROGRESS: Final = (
    "UPDATE open_responses SET input_tokens = ?, cached_tokens = ?, output_tokens = ?, turns = ?,"
    " progress_at = ? WHERE response_id = ?"
)
_DELETE_OPEN: Final = "DELETE FROM open_responses WHERE response_id = ?"


class LedgerError(RuntimeError):
    """The ledger refused a call: closed, not started, or its database failed where it cannot retry."""


class LedgerFullError(LedgerError):
    """``max_pending`` operations are waiting for the database: the call was refused, nothing was queued."""


class UsageLedger:
    def __init__(
        self,
        path: str = DEFAULT_DB_PATH,
        *,
        max_pending: int = 100_000,
        batch_size: int = 500,
        busy_timeout: float = 10.0,
        retry_initial: float = 0.02,
        retry_max: float = 1.0,
        close_timeout: float = 30.0,
    ) -> None:
        """``path``: a SQLite file, ``":memory:"``, or a ``postgresql://`` URL."""
        if max_pending < 1 or batch_size < 1:
            raise ValueError("max_pending and batch_size must be >= 1")
        self.path = path
        self._busy_timeout = busy_timeout
        self._retry_initial = retry_initial
        self._retry_max = max(retry_max, retry_initial)
        self._close_timeout = close_timeout
        self._max_pending = max_pending
        self._batch_size = batch_size
        self._owner = uuid.uuid4().hex  # marks this process's open rows: reconcile() never bills them
        try:
            # Connections: the writer thread's, one for reconcile(), one for reads (which, on a file or on
            # PostgreSQL, never wait on the writer's lock). A memory database is one connection, shared.
            self._db: Database = open_database(path, "ledger", busy_timeout=busy_timeout, pool_size=3)
        except Exception as exc:
            raise LedgerError(f"usage ledger {redact(path)!r} cannot be opened: {exc}") from exc
        try:
            self._db.migrate("ledger", MIGRATIONS)
            self._db.hold_owner(self._owner)  # alive, for every other server's reconcile(), until close()
        except Exception as exc:
            self._db.close()
            raise LedgerError(
                f"usage ledger {redact(path)!r} cannot be opened: {self._db.describe(exc)}"
            ) from exc
        # The pending buffer. _lock guards it and is only ever held for in-memory work.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the writer waits for work
        self._done = threading.Condition(self._lock)  # flush() waits for durability
        self._buffer: deque[_Entry] = deque()
        self._inflight: list[_Entry] = []  # the batch the writer is writing (or retrying)
        self._progress: dict[str, _Progress] = {}  # pending progress updates still in _buffer, by id
        self._seq = 0  # sequence number of the last accepted operation
        self._done_seq = 0  # every operation up to this one is durable (or given up on)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopping = False
        self._deadline: float | None = None  # monotonic; set by close()
        self._db_closed = False
        self.rows_written = 0
        self.retries = 0
        self.failed = 0
        self.overflow = 0
        self.duplicates = 0
        self.reconciled = 0
        self.duplicate_ids: deque[str] = deque(maxlen=100)
        # Why the database cannot take writes now (read-only, disk full, I/O error, server gone): the
        # writer's last attempt failed other than waiting on a lock; None once one succeeds. The server
        # starts no response meanwhile (``ledger_unavailable``): nothing is served that could not be billed.
        self.unwritable: str | None = None

    @property
    def owner(self) -> str:
        """This process's owner id: what its open rows carry, alive while this ledger is open."""
        return self._owner

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._closed:
                raise LedgerError("ledger is closed")
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="usage-ledger-writer", daemon=True)
        self._thread.start()

    async def astart(self) -> None:
        self.start()

    def close(self, timeout: float | None = None) -> None:
        """Write everything pending, retrying up to ``timeout`` seconds (default ``close_timeout``), stop
        the writer, close the database. What could not be written by then is counted in ``failed`` and its
        ids logged. Blocks: from the loop, use ``aclose()``. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # every call refuses from here on, so the buffer only drains
            self._stopping = True
            self._deadline = time.monotonic() + (self._close_timeout if timeout is None else timeout)
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        else:
            self._run()  # never started: drain on the caller's thread, same retries and deadline
        self._db_closed = True
        self._db.close()

    async def aclose(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.close, timeout)

    def flush(self, timeout: float | None = 30.0) -> None:
        """Return once every operation accepted before this call is durable (or given up on)."""
        with self._lock:
            if self._thread is None or self._closed:
                raise LedgerError("flush() needs a started, open ledger")
            target = self._seq
            if not self._done.wait_for(lambda: self._done_seq >= target, timeout):
                raise LedgerError(f"ledger flush timed out after {timeout}s ({self.pending} pending)")

    async def aflush(self, timeout: float | None = 30.0) -> None:
        await asyncio.to_thread(self.flush, timeout)

    # -- hot path: never touch the database, never wait ------------------------------------------------

    def started(self, response_id: str, api_key_id: str, model: str, mode: str, created_at: float) -> None:
        """A response started: its open row is written soon (see the crash guarantee in the module doc).

        Raises ``ValueError`` on bad arguments, ``LedgerFullError`` past ``max_pending``, ``LedgerError``
        once closed."""
        _check_mode(mode)
        _check_text(response_id=response_id, api_key_id=api_key_id, model=model)
        _check_times(created_at=created_at)
        self._accept(_Start(response_id, api_key_id, model, mode, created_at))

    def progress(
        self, response_id: str, input_tokens: int, cached_tokens: int, output_tokens: int, turns: int
    ) -> None:
        """What a started response has delivered so far (cumulative figures, not increments).

        Coalesced with an update of the same id still pending (the latest figures win). A no-op in the
        database for an id without an open row (never started, or already recorded)."""
        _check_text(response_id=response_id)
        _check_counts(
            input_tokens=input_tokens, cached_tokens=cached_tokens, output_tokens=output_tokens, turns=turns
        )
        now = time.time()
        with self._lock:
            pending = self._progress.get(response_id) if not self._closed else None
            if pending is not None:
                pending.input_tokens, pending.cached_tokens = input_tokens, cached_tokens
                pending.output_tokens, pending.turns, pending.at = output_tokens, turns, now
                return
        self._accept(_Progress(response_id, input_tokens, cached_tokens, output_tokens, turns, now))

    def record(self, row: LedgerRow) -> None:
        """The final usage row of an ended response, written with the removal of its open row in one
        transaction. Returns at once: ``LedgerFullError`` past ``max_pending``, ``LedgerError`` once
        closed; once it returned, the row is written exactly once while the server runs."""
        if not isinstance(row, LedgerRow):
            raise ValueError(f"record() takes a LedgerRow, not {type(row).__name__}")
        self._accept(row)

    def _accept(self, op: _Op) -> None:
        with self._lock:
            if self._closed:
                raise LedgerError("ledger is closed")
            if len(self._buffer) + len(self._inflight) >= self._max_pending:
                self.overflow += 1
                raise LedgerFullError(
                    f"usage ledger has {self._max_pending} operations waiting for the database;"
                    f" {_kind(op)} for {op.response_id!r} refused"
                )
            self._seq += 1
            self._buffer.append((self._seq, op))
            if isinstance(op, _Progress):
                self._progress[op.response_id] = op
            self._wake.notify()

    @property
    def pending(self) -> int:
        """Operations accepted and not yet durable (open rows, progress updates, usage rows)."""
        return len(self._buffer) + len(self._inflight)

    # -- writer thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._buffer and not self._stopping:
                    self._wake.wait()
                if not self._buffer:
                    return
                while self._buffer and len(self._inflight) < self._batch_size:
                    entry = self._buffer.popleft()
                    self._inflight.append(entry)
                    if (
                        isinstance(entry[1], _Progress)
                        and self._progress.get(entry[1].response_id) is entry[1]
                    ):
                        del self._progress[entry[1].response_id]  # sealed: a later update is a new entry
                last_seq = self._inflight[-1][0]
            if not self._write_until_done():
                return  # close() deadline passed: everything left was given up on
            with self._lock:
                self._inflight = []
                self._done_seq = last_seq
                self._done.notify_all()

    def _write_until_done(self) -> bool:
        """Write ``_inflight``, retrying with backoff; False once close()'s deadline passed (all given up)."""
        backoff = self._retry_initial
        attempts = 0
        while True:
            error = self._commit(self._inflight)
            # A plain attribute store: the loop reads it without a lock (the GIL orders it).
            self.unwritable = (
                None if error is None or self._db.is_lock_wait(error) else self._db.describe(error)
            )
            if error is None:
                if attempts:
                    log.warning("ledger.write_recovered", attempts=attempts + 1, pending=self.pending)
                return True
            attempts += 1
            deadline = self._deadline
            if deadline is not None and time.monotonic() >= deadline:
                self._give_up(error)
                return False
            self.retries += 1
            if attempts == 1:
                log.warning(
                    "ledger.write_retrying",
                    error=self._db.describe(error),
                    batch=len(self._inflight),
                    pending=self.pending,
                )
            with self._lock:
                wait = backoff if deadline is None else min(backoff, max(0.0, deadline - time.monotonic()))
                end = time.monotonic() + wait
                # A record() wakes this too: keep backing off. close() sets the deadline: retry at once.
                while self._deadline is deadline and (left := end - time.monotonic()) > 0:
                    self._wake.wait(left)
            backoff = min(backoff * 2, self._retry_max)

    def _commit(self, batch: list[_Entry]) -> Exception | None:
        """Write ``batch`` in one transaction. A row-specific error splits it (the offending operation is
        rejected); on a transient error, return it with ``batch`` cut down to what is still unwritten."""
        try:
            self._write(batch)
            return None
        except Exception as exc:
            if self._db.is_row_error(exc):
                if len(batch) == 1:
                    self._reject(batch[0][1], exc)
                    return None
                for i in range(len(batch)):
                    error = self._commit(batch[i : i + 1])
                    if error is not None:
                        del batch[:i]
                        return error
                return None
            if isinstance(exc, self._db.errors):
                return exc
            # A bug: keep the thread alive and the rows pending, retried and visible.
            log.exception("ledger.write_bug", batch=len(batch))
            return exc

    def _write(self, batch: list[_Entry]) -> None:
        inserted: list[str] = []
        duplicates: list[str] = []
        # Closing: never wait on a lock past the deadline.
        remaining = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        with self._db.connection(write=True) as db, transaction(db, write=True, lock_timeout=remaining):
            for _, op in batch:
                if isinstance(op, LedgerRow):
                    rowcount = db.execute(_INSERT, astuple(op)).rowcount
                    (inserted if rowcount else duplicates).append(op.response_id)
                    db.execute(_DELETE_OPEN, (op.response_id,))
                elif isinstance(op, _Start):
                    db.execute(_INSERT_OPEN, (*astuple(op), self._owner))
                else:
                    db.execute(
                        _UPDATE_PROGRESS,
                        (
                            op.input_tokens,
                            op.cached_tokens,
                            op.output_tokens,
                            op.turns,
                            op.at,
                            op.response_id,
                        ),
                    )
        self.rows_written += len(inserted)
        self.duplicates += len(duplicates)
        for response_id in duplicates:
            self.duplicate_ids.append(response_id)
            log.error("ledger.duplicate_response", response_id=response_id)

    def _reject(self, op: _Op, exc: Exception) -> None:
        if isinstance(op, LedgerRow):
            self.failed += 1
        log.error(
            "ledger.row_rejected", kind=_kind(op), response_id=op.response_id, error=self._db.describe(exc)
        )

    def _give_up(self, error: Exception) -> None:
        with self._lock:
            lost = [op for _, op in (*self._inflight, *self._buffer)]
            self._inflight = []
            self._buffer.clear()
            self._progress.clear()
            self._done_seq = self._seq
            self._done.notify_all()
        usage = [op.response_id for op in lost if isinstance(op, LedgerRow)]
        self.failed += len(usage)
        log.error(
            "ledger.close_unwritten",
            error=self._db.describe(error),
            response_ids=usage,
            open_ids=[op.response_id for op in lost if isinstance(op, _Start)],
            progress_ids=[op.response_id for op in lost if isinstance(op, _Progress)],
        )

    # -- start-up --------------------------------------------------------------------------------------

    def reconcile(self, timeout: float = 30.0) -> int:
        """Bill every open row left by a dead process: one usage row, status ``incomplete`` and reason
        ``server_crashed``, with the open row's last progress figures (``completed_at``: the time of that
        progress, else ``created_at``).
        Open rows that already have a usage row are deleted. Returns how many rows it billed.

        Call it at start-up, before serving (it blocks; from a loop, ``areconcile()``). Dead: only the
        owners whose lock is free (a live ledger's rows, in this process or another, are left alone). One
        reconcile runs at a time on a database, whichever server calls it. Retries a busy database up to
        ``timeout`` seconds, then raises ``LedgerError``."""
        deadline = time.monotonic() + timeout
        backoff = self._retry_initial
        while True:
            try:
                billed = self._reconcile_once()
                break
            except DatabaseClosed as exc:
                raise LedgerError("ledger is closed") from exc
            except self._db.errors as exc:
                if self._db.is_row_error(exc) or time.monotonic() >= deadline:
                    raise LedgerError(f"ledger reconcile failed: {self._db.describe(exc)}") from exc
                self.retries += 1
                time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, self._retry_max)
        self.rows_written += len(billed)
        self.reconciled += len(billed)
        if billed:
            log.warning(
                "ledger.reconciled",
                count=len(billed),
                response_ids=[row.response_id for row in billed],
                output_tokens=sum(row.output_tokens for row in billed),
            )
        return len(billed)

    async def areconcile(self, timeout: float = 30.0) -> int:
        return await asyncio.to_thread(self.reconcile, timeout)

    def _reconcile_once(self) -> list[LedgerRow]:
        if self._db_closed:
            raise LedgerError("ledger is closed")
        with self._db.connection(write=True) as db, transaction(db, write=True, exclusive=True):
            owners = [row[0] for row in db.execute("SELECT DISTINCT owner FROM open_responses").rows]
            dead = self._db.dead_owners(db, owners, self._owner)
            if not dead:
                return []
            marks = ", ".join("?" * len(dead))
            found = db.execute(
                f"SELECT {_OPEN_COLUMNS} FROM open_responses o WHERE owner IN ({marks}) AND NOT EXISTS"
                f" (SELECT 1 FROM usage u WHERE u.response_id = o.response_id) ORDER BY created_at, "
                f"{self._db.order_column}",
                dead,
            ).rows
            billed = [row for row in (_incomplete(OpenResponse(*r)) for r in found) if _insert(db, row)]
            db.execute(f"DELETE FROM open_responses WHERE owner IN ({marks})", dead)
        return billed

    # -- reading back (committed rows only; a file's reads never wait on the writer) -------------------

    def get(self, response_id: str) -> LedgerRow | None:
        rows = self._select(f"SELECT {_COLUMNS} FROM usage WHERE response_id = ?", (response_id,))
        return LedgerRow(*rows[0]) if rows else None

    def rows(
        self, *, api_key_id: str | None = None, mode: str | None = None, limit: int | None = None
    ) -> list[LedgerRow]:
        """Committed rows (not those still pending), oldest first."""
        where, args = [], []
        for column, value in (("api_key_id", api_key_id), ("mode", mode)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = (
            "WHERE " + " AND ".join(where) if where else ""
        ) + f" ORDER BY created_at, {self._db.order_column}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [LedgerRow(*r) for r in self._select(f"SELECT {_COLUMNS} FROM usage {sql}", tuple(args))]

    def open_responses(self) -> list[OpenResponse]:
        """Durable open rows (started, not recorded yet), oldest first."""
        return [
            OpenResponse(*r)
            for r in self._select(
                f"SELECT {_OPEN_COLUMNS} FROM open_responses ORDER BY created_at, {self._db.order_column}", ()
            )
        ]

    def _select(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        if self._db_closed:
            raise LedgerError("ledger is closed")
        try:
            with self._db.connection(write=False) as db:
                return db.execute(sql, args).rows
        except DatabaseClosed as exc:
            raise LedgerError("ledger is closed") from exc
        except self._db.errors as exc:
            raise LedgerError(f"usage ledger read failed: {self._db.describe(exc)}") from exc


def _incomplete(o: OpenResponse) -> LedgerRow:
    """The row ``reconcile()`` bills for a response that never ended: what its open row can prove."""
    return LedgerRow(
        response_id=o.response_id,
        api_key_id=o.api_key_id,
        model=o.model,
        mode=o.mode,
        status=INCOMPLETE,
        input_tokens=o.input_tokens,
        cached_tokens=o.cached_tokens,
        output_tokens=o.output_tokens,
        turns=o.turns,
        created_at=o.created_at,
        completed_at=o.created_at if o.progress_at is None else o.progress_at,
        reason=CRASHED,
    )


def _insert(db: Connection, row: LedgerRow) -> bool:
    """Insert a usage row; False when its id is billed already."""
    return db.execute(_INSERT, astuple(row)).rowcount > 0
