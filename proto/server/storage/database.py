"""The one interface the response store and the usage ledger run on: SQLite (a file, the embedded default)
or PostgreSQL (``--db postgresql://…``: one database shared by every worker and every host).

The store and the ledger keep their policies (threads, batching, retries with backoff, idempotency) and
write their SQL once, with ``?`` placeholders and the subset both dialects share (``ON CONFLICT``,
recursive CTEs); what differs per database is here and only here:

- connections: SQLite gives each calling thread its own connection (WAL readers never wait on a writer;
  a memory database is one connection, serialised); PostgreSQL lends one from a ``psycopg_pool`` pool for
  each call and takes it back (a broken one is checked and replaced on the next loan, so a restarted
  server costs one failed call, not a wedged process);
- transactions: ``transaction(conn, write=True)`` takes SQLite's write lock up front (``BEGIN
  IMMEDIATE``); ``exclusive=True`` also serialises against every other process on PostgreSQL (a
  transaction-scoped advisory lock), for migrations and reconciliation;
- lock waits: ``busy_timeout`` is SQLite's busy timeout and PostgreSQL's ``lock_timeout``;
- errors: ``errors`` (any database failure, as the driver raises it: callers keep it as ``__cause__``) and
  ``is_row_error`` (deterministic for a statement's arguments: retrying cannot help);
- schema: one migration list per component, ``{int}``/``{real}``/``{blob}``/``{seq}`` spelled per
  dialect, applied in order and recorded in ``schema_version`` (the same table on both);
- liveness: who else is alive, for the ledger's ``reconcile()`` (below).

Liveness: a ledger marks its open rows with an owner id, and holds a lock named after it for as long as
it lives; an owner is dead exactly when another can take that lock, which the system releases the moment
its holder ends, SIGKILL included. On PostgreSQL the lock is a session-level advisory lock on a dedicated
connection; on SQLite an exclusive ``flock`` on the file ``<db>.owners/<owner id>`` (a file no live
ledger holds, or none at all, is a dead owner's: rows written before owners had files, too). So a server
starting while another serves never bills the other's responses in flight, whatever the database.

One server per SQLite file (``claim_file``): the process that serves a SQLite file — the only one that
reconciles it: the server, or the supervisor of ``--workers N`` — holds an exclusive ``flock`` on
``<db>.lock`` for its whole life; a second one is refused with the first one's pid. The kernel releases
it when the holder dies, so a crashed server never blocks the next. PostgreSQL is shared by design: no
claim.

Driver: psycopg 3 (with psycopg_pool) rather than asyncpg. The storage policies run on the store's and the
ledger's own threads — SQLite needs them anyway, and one set of policies over one interface is the point —
so what is wanted is a driver whose blocking API is first-class and thread-safe, with a pool to match;
psycopg offers the same API blocking and async, uses libpq (every ``postgresql://`` URI option, unix
sockets, TLS), ships binary wheels, and is the adapter PostgreSQL's own ecosystem maintains. asyncpg is
async-only: it would need a second implementation of every policy on the event loop (or an event loop per
thread), the duplication this module exists to avoid. Nothing here runs on the server's event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")

Migrations = tuple[tuple[str, ...], ...]  # migration k (1-based) is a tuple of statements


def is_postgres(url: str) -> bool:
    return url.startswith(POSTGRES_SCHEMES)


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    if not is_postgres(url):
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class DatabaseClosed(RuntimeError):
    """The database object was closed: no connection is lent any more."""


class DatabaseInUse(RuntimeError):
    """Another live server holds this SQLite file (or its lock cannot be taken): this one must not serve."""


class FileClaim:
    """The claim of one server on one SQLite file: an exclusive ``flock`` on ``<db>.lock``, taken without
    waiting, held until ``release()`` or the process's end (the kernel drops it then, SIGKILL included).
    The file is never unlinked: a claimant racing an unlink could lock a name no longer on disk."""

    def __init__(self, url: str) -> None:
        self.path = url + ".lock"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DatabaseInUse(f"cannot take {self.path!r}, the lock of one server per file: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DatabaseInUse(
                f"{url!r} is served by another live process (pid {holder}, holding {self.path!r}): one "
                "server per SQLite file. Stop it first, or share a PostgreSQL database (--db "
                "postgresql://…) between servers"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def claim_file(url: str) -> FileClaim | None:
    """The claim of a SQLite file for this server; None where there is nothing to claim (a memory
    database, PostgreSQL: shared by design)."""
    if is_postgres(url) or url in ("", ":memory:"):
        return None
    return FileClaim(url)


class Rows:
    """What a statement returned: ``rowcount`` (rows changed) and the rows it selected."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rowcount: int, rows: list[tuple[Any, ...]]) -> None:
        self.rowcount = rowcount
        self.rows = rows

    def one(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


class Connection:
    """One connection, as the store and the ledger use it: ``?`` placeholders, explicit transactions."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def _trace(self, sql: str) -> None:
        hook = self.database.trace
        if hook is not None:
            hook(sql)

    def execute(self, sql: str, args: Sequence[object] = ()) -> Rows:
        raise NotImplementedError

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        raise NotImplementedError

    @property
    def in_transaction(self) -> bool:
        raise NotImplementedError

    def begin(self, write: bool, lock_timeout: float | None) -> None:
        raise NotImplementedError

    def end(self, commit: bool) -> None:
        self.execute("COMMIT" if commit else "ROLLBACK")


class Database:
    """One database (a SQLite path or a PostgreSQL URL) for one component (``store`` or ``ledger``)."""

    kind = ""
    errors: tuple[type[Exception], ...] = ()
    shared = False  # several processes write it at once: liveness matters
    order_column = "rowid"  # insertion order, to break ties (SQLite's implicit rowid; PostgreSQL: seq)

    def __init__(self, url: str, busy_timeout: float) -> None:
        self.url = url
        self.busy_timeout = busy_timeout
        # Tests set this to see each statement (and the thread that runs it), or to inject a fault.
        self.trace: Callable[[str], None] | None = None

    # -- connections -----------------------------------------------------------------------------------
    def connection(self, write: bool) -> contextlib.AbstractContextManager[Connection]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- dialect ---------------------------------------------------------------------------------------
    def spell(self, ddl: str) -> str:
        raise NotImplementedError

    def is_row_error(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def is_lock_wait(self, exc: BaseException) -> bool:
        """``exc`` is a lock held by another writer past the wait allowed (SQLite ``SQLITE_BUSY`` /
        ``SQLITE_LOCKED``, PostgreSQL ``lock_not_available``): the database itself can write, later.
        Anything else (read-only, disk full, I/O error, server gone) means it cannot write now."""
        raise NotImplementedError

    def exclusive(self, conn: Connection) -> None:
        """Inside ``conn``'s write transaction: wait for every other exclusive one to end."""
        raise NotImplementedError

    def describe(self, exc: BaseException) -> str:
        return str(exc).strip() or type(exc).__name__

    # -- liveness --------------------------------------------------------------------------------------
    def hold_owner(self, owner: str) -> None:
        """Mark ``owner`` alive for as long as this object is open."""

    def dead_owners(self, conn: Connection, owners: Sequence[str], me: str) -> list[str]:
        """Of ``owners``, those no live process holds (inside ``conn``'s exclusive transaction)."""
        return [owner for owner in owners if owner != me]

    # -- schema ----------------------------------------------------------------------------------------
    def migrate(self, component: str, migrations: Migrations) -> int:
        """Apply ``component``'s migrations past its recorded version, in one exclusive transaction;
        returns the version now. Creating over an existing schema of the same version is a no-op."""
        with self.connection(write=True) as conn, transaction(conn, write=True, exclusive=True):
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (component TEXT PRIMARY KEY, version INTEGER NOT "
                "NULL)"
            )
            found = conn.execute("SELECT version FROM schema_version WHERE component = ?", (component,)).one()
            version = 0 if found is None else int(found[0])
            if version > len(migrations):
                raise RuntimeError(
                    f"{component} schema version {version} is newer than this code's {len(migrations)}"
                )
            for statements in migrations[version:]:
                for statement in statements:
                    conn.execute(self.spell(statement))
            # Written every time, not only when a migration ran: the proof that the database takes writes
            # before anything is served (a read-only SQLite file opens, reads and begins a write
            # transaction without complaint; only a write fails). docs/operations.md, "Databases".
            conn.execute(
                "INSERT INTO schema_version (component, version) VALUES (?, ?)"
                " ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                (component, len(migrations)),
            )
            return len(migrations)


@contextlib.contextmanager
def transaction(
    conn: Connection, *, write: bool, exclusive: bool = False, lock_timeout: float | None = None
) -> Iterator[None]:
    """Commit on success, roll back on any exception (the exception propagates).

    ``write``: take the write lock first (SQLite ``BEGIN IMMEDIATE``: a busy database fails here, before
    any work). ``exclusive``: and hold off every other exclusive transaction on the database, whichever
    process runs it. ``lock_timeout``: wait at most this long (seconds) for any lock in this transaction.
    Inside a transaction already open on ``conn`` it joins that one (the outer one commits or rolls back):
    the store runs every write in a transaction of its own, around calls that open theirs."""
    if conn.in_transaction:
        yield
        return
    conn.begin(write, lock_timeout)
    if exclusive:
        conn.database.exclusive(conn)
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(*conn.database.errors):
                conn.end(commit=False)
        raise
    conn.end(commit=True)


def open_database(url: str, component: str, *, busy_timeout: float, pool_size: int = 4) -> Database:
    """A SQLite file (or ``":memory:"``) or a PostgreSQL server, for ``component`` (store, ledger)."""
    if is_postgres(url):
        from proto.server.storage.postgres import PostgresDatabase

        return PostgresDatabase(url, busy_timeout, component=component, pool_size=pool_size)
    return SQLiteDatabase(url, busy_timeout)


# ------------------------------------------------------------------------------------------------ SQLite
_SQLITE_TYPES: Final = {"int": "INTEGER", "real": "REAL", "blob": "BLOB", "seq": ""}  # the rowid is the seq


class _SQLiteConnection(Connection):
    def __init__(self, database: Database, raw: sqlite3.Connection) -> None:
        super().__init__(database)
        self.raw = raw
        self.query_only = False
        self.timeout_ms = int(database.busy_timeout * 1000)

    def execute(self, sql: str, args: Sequence[object] = ()) -> Rows:
        self._trace(sql)
        cursor = self.raw.execute(sql, args)
        return Rows(cursor.rowcount, cursor.fetchall())

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._trace(sql)
        self.raw.executemany(sql, rows)

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction

    def begin(self, write: bool, lock_timeout: float | None) -> None:
        wanted = (
            self.timeout_ms
            if lock_timeout is None
            else int(min(lock_timeout, self.database.busy_timeout) * 1000)
        )
        if wanted != self.timeout_ms:  # restored by the next transaction that does not ask for less
            self.execute(f"PRAGMA busy_timeout = {wanted}")
            self.timeout_ms = wanted
        self.execute("BEGIN IMMEDIATE" if write else "BEGIN")


class SQLiteDatabase(Database):
    """Each calling thread gets its own connection (opened on its first call, closed by ``close()``), in WAL
    mode with ``synchronous=NORMAL``; ``write=False`` connections are ``query_only``. A memory database
    exists in one connection only: every thread shares it, one at a time."""

    kind = "sqlite"
    errors = (sqlite3.Error,)

    def __init__(self, url: str, busy_timeout: float) -> None:
        super().__init__(url, busy_timeout)
        self.memory = url in (":memory:", "")
        self._local = threading.local()
        self._all: list[_SQLiteConnection] = []
        self._lock = threading.RLock()  # _all, _closed; and the one memory connection while lent
        self._closed = False
        self._owner_held: tuple[str, int] | None = None  # hold_owner's file and its flock'ed descriptor
        first = self._open()  # fail here, at construction, not on the first call
        first.execute("PRAGMA journal_mode=WAL")
        if self.memory:
            self._shared = first
        else:
            self._local.conn = first

    def _open(self) -> _SQLiteConnection:
        with self._lock:
            if self._closed:
                raise DatabaseClosed(f"database {self.url!r} is closed")
            raw = sqlite3.connect(
                self.url, isolation_level=None, timeout=self.busy_timeout, check_same_thread=False
            )
            conn = _SQLiteConnection(self, raw)
            raw.execute("PRAGMA synchronous=NORMAL")
            self._all.append(conn)
            return conn

    @contextlib.contextmanager
    def connection(self, write: bool) -> Iterator[Connection]:
        if self.memory:
            with self._lock:
                if self._closed:
                    raise DatabaseClosed(f"database {self.url!r} is closed")
                yield self._shared
            return
        if self._closed:
            raise DatabaseClosed(f"database {self.url!r} is closed")
        conn: _SQLiteConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._open()
        if conn.query_only == write:  # a reader refuses writes even by mistake; switched only when asked
            conn.execute(f"PRAGMA query_only = {0 if write else 1}")
            conn.query_only = not write
        yield conn

    def exclusive(self, conn: Connection) -> None:
        pass  # BEGIN IMMEDIATE already excludes every other writer of the file

    # -- liveness: one flock'ed file per live owner (module doc) ---------------------------------------
    def _owner_path(self, owner: str) -> str | None:
        # Owner ids are uuid4 hex; anything else read from a row names no file (and so no live owner).
        return f"{self.url}.owners/{owner}" if owner.isalnum() else None

    def hold_owner(self, owner: str) -> None:
        path = self._owner_path(owner)
        if self.memory or path is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh uuid: nobody else can hold it
        except OSError:
            os.close(fd)
            raise
        self._owner_held = (path, fd)

    def dead_owners(self, conn: Connection, owners: Sequence[str], me: str) -> list[str]:
        if self.memory:  # one connection, one process: every other owner is gone
            return [owner for owner in owners if owner != me]
        return [owner for owner in owners if owner != me and not self._alive(owner)]

    def _alive(self, owner: str) -> bool:
        path = self._owner_path(owner)
        if path is None:
            return False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # never held here, or released by a ledger that closed
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # its ledger's process holds it: alive, its rows are in flight
        finally:
            os.close(fd)  # and with it the lock just taken, if it was taken
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # its holder is dead: nobody will take this name again
        return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._all = self._all, []
            held, self._owner_held = self._owner_held, None
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):
                conn.raw.close()
        if held is not None:  # a clean end: its rows are written or given up on; the name is free
            path, fd = held
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)

    def spell(self, ddl: str) -> str:
        return ddl.format(**_SQLITE_TYPES)

    def is_row_error(self, exc: BaseException) -> bool:
        return isinstance(
            exc,
            sqlite3.IntegrityError | sqlite3.InterfaceError | sqlite3.DataError | sqlite3.ProgrammingError,
        )

    def is_lock_wait(self, exc: BaseException) -> bool:
        # The primary result code is the low byte of an extended one (SQLITE_BUSY_SNAPSHOT is 517).
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF in (5, 6)
