"""The two databases the store and ledger tests run on: a SQLite file, and a throwaway PostgreSQL server.

PostgreSQL: Debian's PostgreSQL 15 (``make test`` installs the
``postgresql-15`` package when it is missing), initdb into a temporary directory, a free loopback port, the
unix socket in that directory, stopped and deleted at the end. Run as the ``postgres`` user when the suite
runs as root (PostgreSQL refuses to run as root).

If it cannot be started the suite fails with the reason (``PostgresUnavailable``): the store and ledger
tests on PostgreSQL are never skipped.

Each test gets its own schema (``fresh()``: a ``search_path`` in the URL), so tests share one server and
none sees another's tables. The server runs with ``fsync=off``: it is thrown away at the end, and the
machine is shared (durability across a PostgreSQL crash is not what these tests test; the API servers'
crashes are).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from proto.processes import free_port

GUARD = 30.0  # seconds for PostgreSQL to start or stop: a guard against hangs, not a timing assertion


class PostgresUnavailable(RuntimeError):
    """The throwaway server could not be started; the message says why and what to install."""


def bindir() -> Path:
    """The directory of ``initdb``/``pg_ctl``: ``PG_BINDIR``, else Debian's newest, else ``$PATH``."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise PostgresUnavailable(
        "PostgreSQL's initdb was not found (looked in /usr/lib/postgresql/*/bin and $PATH): "
        "`make test` installs it (apt-get install postgresql-15); or set PG_BINDIR"
    )


class PostgresServer:
    """``durable=False`` (the tests'): ``fsync=off``. ``durable=True`` (figures): PostgreSQL's defaults."""

    def __init__(self, durable: bool = False) -> None:
        self.durable = durable
        self.bin = bindir()
        self.root = Path(tempfile.mkdtemp(prefix="responses-lab-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = "lab"
        self._as: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL will not run as root: hand the directory to its own user
            try:
                account = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable(
                    "running as root and there is no `postgres` user to run PostgreSQL as"
                ) from exc
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def _run(self, *command: str) -> None:
        result = subprocess.run(
            [*self._as, *command], capture_output=True, text=True, timeout=GUARD, check=False
        )
        if result.returncode != 0:
            log = self.root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise PostgresUnavailable(
                f"`{' '.join(command)}` exited {result.returncode}: {result.stderr.strip()[-2000:]}\n{tail}"
            )

    def start(self) -> PostgresServer:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            self.user,
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.root}",
                "-c listen_addresses=127.0.0.1",
                "-c max_connections=300",
                *([] if self.durable else ["-c fsync=off", "-c full_page_writes=off"]),
            ]
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            str(int(GUARD)),
            "start",
        )
        self.started = True
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE lab")
        return self

    def stop(self) -> None:
        if self.started:
            with contextlib.suppress(PostgresUnavailable, subprocess.TimeoutExpired):
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)

    # -- URLs ------------------------------------------------------------------------------------------
    @property
    def admin_url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    @property
    def url(self) -> str:
        """The ``lab`` database over TCP on loopback (what a fleet's servers use)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/lab"

    def fresh(self) -> str:
        """A URL whose tables live in a new, empty schema of their own."""
        schema = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        return f"{self.url}?options=-csearch_path%3D{schema}"

    def connect(self, url: str | None = None) -> psycopg.Connection[Any]:
        return psycopg.connect(url or self.url, autocommit=True)

    @property
    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def wait_sessions_gone(self, pid: int) -> None:
        """Until PostgreSQL has ended every session of server process ``pid`` (after its death: a few ms)."""
        self._wait_none(f"responses-lab % pid {pid}", f"the sessions of dead process {pid}")

    def wait_owner_gone(self, owner: str) -> None:
        """Until the session holding ledger ``owner``'s liveness lock has ended."""
        self._wait_none(f"responses-lab owner {owner} %", f"the session of ledger owner {owner}")

    def _wait_none(self, application_name: str, what: str) -> None:
        deadline = time.monotonic() + GUARD
        with self.connect() as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"
            while conn.execute(query, (application_name,)).fetchone() != (0,):
                if time.monotonic() > deadline:
                    raise AssertionError(f"PostgreSQL kept {what}")
                time.sleep(0.01)


@contextlib.contextmanager
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


class TableLock:
    """Another session's ``LOCK TABLE … IN EXCLUSIVE MODE`` on every table of ``url``'s schema, held until
    ``execute("COMMIT")``: writes wait on it, reads do not (as a SQLite write lock under WAL)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        tables = [
            r[0]
            for r in self.conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        ]
        self.conn.execute("BEGIN")
        self.conn.execute(f"LOCK TABLE {', '.join(tables)} IN EXCLUSIVE MODE")

    def execute(self, sql: str) -> None:
        self.conn.execute(sql)

    @property
    def in_transaction(self) -> bool:
        return self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def rollback(self) -> None:
        self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()


@dataclass
class Backend:
    """One test's database: ``url`` (a SQLite file or a PostgreSQL schema of its own), another session's
    write lock on it, SQL from outside the code under test, and what each database says on a fault."""

    name: str  # "sqlite" | "postgresql"
    url: str
    server: PostgresServer | None = None

    @property
    def locked_words(self) -> str:
        return "locked" if self.name == "sqlite" else "lock timeout"

    @property
    def missing_table_words(self) -> str:
        return "no such table" if self.name == "sqlite" else "does not exist"

    def transient_error(self, message: str) -> Exception:
        """The driver's own error class for a failure worth retrying (a fault injected at a statement)."""
        return (
            sqlite3.OperationalError(message) if self.name == "sqlite" else psycopg.OperationalError(message)
        )

    def lock(self) -> sqlite3.Connection | TableLock:
        """Another session's write lock on every table, held until ``execute("COMMIT")``."""
        if self.name == "sqlite":
            holder = sqlite3.connect(self.url, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN EXCLUSIVE")
            return holder
        return TableLock(self.url)

    def query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` (``?`` placeholders) on a connection of its own, committed."""
        if self.name == "sqlite":
            with contextlib.closing(sqlite3.connect(self.url, isolation_level=None)) as db:
                return db.execute(sql, args).fetchall()
        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), args or None)
            return cursor.fetchall() if cursor.description is not None else []
