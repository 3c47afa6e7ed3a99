"""PostgreSQL behind ``proto.server.storage.database``: psycopg 3 and its pool (why this driver: that module).

Connections are lent by a ``psycopg_pool.ConnectionPool`` (checked on each loan: one round trip, so a
server restart or a dropped TCP connection costs nothing but that check), in autocommit mode, each one
configured with ``lock_timeout`` = ``busy_timeout`` (SQLite's busy timeout, the same meaning: how long one
statement waits for a lock before it fails) and an ``application_name`` naming the component. Results come
back in binary format (payloads are ``bytea``: no hex round trip). ``?`` placeholders become ``%s``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg_pool import ConnectionPool

from proto.server.storage.database import Connection, Database, DatabaseClosed, Rows, redact

_TYPES: Final = {
    "int": "BIGINT",
    "real": "DOUBLE PRECISION",
    "blob": "BYTEA",
    # SQLite's implicit rowid, made explicit: the insertion order that breaks created_at ties.
    "seq": ",\n    seq BIGINT GENERATED ALWAYS AS IDENTITY",
}
# SQLSTATE classes of errors tied to a statement's arguments (retrying the same rows cannot succeed):
# 22 data exception, 23 integrity constraint violation, 42804 datatype mismatch.
_ROW_SQLSTATES: Final = ("22", "23", "42804")


def advisory_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``name``."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


_EXCLUSIVE_KEY: Final = advisory_key("responses-lab:exclusive")


@functools.lru_cache(maxsize=256)
def _pg(sql: str) -> str:
    return sql.replace("?", "%s")  # our statements hold no literal '?' or '%'


class _PgConnection(Connection):
    def __init__(self, database: Database, raw: psycopg.Connection[Any]) -> None:
        super().__init__(database)
        self.raw = raw

    def execute(self, sql: str, args: Sequence[object] = ()) -> Rows:
        self._trace(sql)
        cursor = self.raw.execute(_pg(sql), args or None, binary=True)
        rows = cursor.fetchall() if cursor.description is not None else []
        return Rows(cursor.rowcount, rows)

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._trace(sql)
        if rows:
            with self.raw.cursor() as cursor:
                cursor.executemany(_pg(sql), rows)

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != pq.TransactionStatus.IDLE

    def begin(self, write: bool, lock_timeout: float | None) -> None:
        self.execute("BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if lock_timeout is not None:
            # 0 would mean "no limit" to PostgreSQL: a deadline that has passed waits 1 ms.
            self.execute(f"SET LOCAL lock_timeout = {max(1, int(lock_timeout * 1000))}")


class PostgresDatabase(Database):
    kind = "postgresql"
    errors = (psycopg.Error,)
    shared = True
    order_column = "seq"

    def __init__(self, url: str, busy_timeout: float, *, component: str, pool_size: int = 4) -> None:
        super().__init__(url, busy_timeout)
        self.component = component
        self._closed = False
        self._owner: psycopg.Connection[Any] | None = None
        connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            # Operators (and tests) see which server process holds which sessions: pg_stat_activity.
            "application_name": f"responses-lab {component} pid {os.getpid()}",
        }
        if "connect_timeout" not in url:
            connect_kwargs["connect_timeout"] = max(2, math.ceil(busy_timeout))  # libpq: whole seconds, >= 2
        self._kwargs = connect_kwargs
        # The first connection is made here, directly: a server that cannot be reached fails construction
        # with libpq's own reason (the pool would only report a timeout).
        first = psycopg.connect(url, **connect_kwargs)
        first.close()
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs=connect_kwargs,
            configure=self._configure,
            check=ConnectionPool.check_connection,
            timeout=max(busy_timeout, 1.0),
            name=f"responses-lab-{component}",
            open=False,
        )
        self._pool.open(wait=True, timeout=max(busy_timeout, 1.0))

    def _configure(self, raw: psycopg.Connection[Any]) -> None:
        raw.execute(f"SET lock_timeout = {max(1, int(self.busy_timeout * 1000))}")

    @contextlib.contextmanager
    def connection(self, write: bool) -> Iterator[Connection]:
        if self._closed:
            raise DatabaseClosed(f"database {redact(self.url)!r} is closed")
        with self._pool.connection() as raw:
            yield _PgConnection(self, raw)

    def exclusive(self, conn: Connection) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(?)", (_EXCLUSIVE_KEY,))

    def close(self) -> None:
        self._closed = True
        self._pool.close()
        if self._owner is not None:
            with contextlib.suppress(psycopg.Error):
                self._owner.close()

    def spell(self, ddl: str) -> str:
        return ddl.format(**_TYPES)

    def is_row_error(self, exc: BaseException) -> bool:
        if not isinstance(exc, psycopg.Error):
            return False
        if exc.sqlstate is None:  # refused by the driver before it reached the server: binding, adaptation
            return isinstance(exc, psycopg.ProgrammingError | psycopg.DataError)
        return exc.sqlstate.startswith(_ROW_SQLSTATES)

    def is_lock_wait(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.Error) and exc.sqlstate == "55P03"  # lock_not_available

    # -- liveness --------------------------------------------------------------------------------------
    def hold_owner(self, owner: str) -> None:
        """A dedicated session holds ``owner``'s advisory lock until ``close()`` (or the process dies)."""
        name = f"responses-lab owner {owner} pid {os.getpid()}"
        session = psycopg.connect(self.url, **{**self._kwargs, "application_name": name})
        # A host that vanishes (power, network) leaves no FIN: the server's keepalives end its session,
        # and so free its lock, after ~10 + 3 x 5 s of silence (TCP only; a unix socket cannot vanish so).
        session.execute("SET tcp_keepalives_idle = 10")
        session.execute("SET tcp_keepalives_interval = 5")
        session.execute("SET tcp_keepalives_count = 3")
        session.execute("SELECT pg_advisory_lock(%s)", (advisory_key(owner),))
        self._owner = session

    def dead_owners(self, conn: Connection, owners: Sequence[str], me: str) -> list[str]:
        # Taking a live owner's lock fails at once; a dead owner's succeeds and is held until commit.
        dead = []
        for owner in owners:
            if owner == me:
                continue
            got = conn.execute("SELECT pg_try_advisory_xact_lock(?)", (advisory_key(owner),)).one()
            if got is not None and got[0]:
                dead.append(owner)
        return dead
