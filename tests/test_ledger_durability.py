"""The usage ledger under faults: a locked database never blocks the caller and loses no row, the pending
buffer is bounded, and a response in flight at a crash is billed from its last durable progress — each on
SQLite and on PostgreSQL (``path``/``lock``/``backend``: tests/conftest.py), where reconciliation also
leaves a live server's responses alone."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from databases import Backend
from helpers import GUARD
from structlog.testing import capture_logs

from proto.core.work import WorkCounters
from proto.server.storage.database import open_database
from proto.server.storage.ledger import (
    CRASHED,
    INCOMPLETE,
    MIGRATIONS,
    LedgerError,
    LedgerFullError,
    LedgerRow,
    UsageLedger,
)

ROOT = Path(__file__).resolve().parents[1]


def row(n: int, *, output: int = 10, status: str = "completed") -> LedgerRow:
    return LedgerRow(
        f"resp_{n:06d}", "key_a", "mock-1000tps", "ws", status, 100 + n, n, output, 3, 1e9 + n, 1e9 + n + 1
    )


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.001)


def fast(path: str, **options: Any) -> UsageLedger:
    """A ledger whose lock waits and retries take milliseconds."""
    settings: dict[str, Any] = {
        "busy_timeout": 0.005,
        "retry_initial": 0.001,
        "retry_max": 0.005,
        "close_timeout": 5.0,
    }
    return UsageLedger(path, **(settings | options))


Lock = Callable[[], Any]


def usage_ids(backend: Backend) -> list[str]:
    return [r[0] for r in backend.query("SELECT response_id FROM usage ORDER BY response_id")]


def test_locked_database_record_never_blocks_and_every_row_lands_once(
    path: str, backend: Backend, lock: Lock
) -> None:
    led = fast(path)
    sql_threads: set[int] = set()
    led._db.trace = lambda _sql: sql_threads.add(threading.get_ident())
    led.start()
    holder = lock()
    # This thread holds the lock: a record() that waited on the database would hang (or raise) right here.
    for n in range(50):
        led.record(row(n))
    led.record(row(7, output=99))  # a duplicate, in the same batch as its first row
    assert led.pending == 51 and led.rows_written == 0
    wait_until(lambda: led.retries >= 3)
    assert led.rows_written == 0 and led.pending == 51 and led.failed == 0
    holder.execute("COMMIT")
    led.flush(timeout=GUARD)
    assert (led.rows_written, led.duplicates, led.pending, led.failed) == (50, 1, 0, 0)
    assert threading.get_ident() not in sql_threads  # record() never ran SQL on the caller's thread
    assert usage_ids(backend) == [f"resp_{n:06d}" for n in range(50)]
    assert led.get("resp_000007") == row(7)  # the first row of the id stands
    led.close()


def test_a_read_does_not_wait_on_the_writers_lock(path: str, lock: Lock) -> None:
    led = fast(path, busy_timeout=GUARD)  # the writer waits on the lock for the whole test
    led.start()
    led.record(row(1))
    led.flush()
    holder = lock()
    led.record(row(2))
    assert led.get("resp_000001") == row(1) and led.get("resp_000002") is None
    holder.execute("COMMIT")
    led.flush(timeout=GUARD)
    assert led.get("resp_000002") == row(2)
    led.close()


def test_close_retries_until_its_deadline_then_counts_and_logs_what_it_lost(
    path: str, backend: Backend, lock: Lock
) -> None:
    led = fast(path)
    led.start()
    led.started("resp_000001", "key_a", "mock-1000tps", "ws", 1e9)
    led.flush()  # the open row is durable
    holder = lock()
    led.progress("resp_000001", 5, 0, 1, 1)
    led.record(row(1))
    led.record(row(2))
    wait_until(lambda: led.retries >= 1)
    with capture_logs() as logs:
        led.close(timeout=0.02)
    assert (led.failed, led.pending, led.rows_written) == (2, 0, 0)
    [lost] = [e for e in logs if e["event"] == "ledger.close_unwritten"]
    assert lost["response_ids"] == ["resp_000001", "resp_000002"] and lost["progress_ids"] == ["resp_000001"]
    with pytest.raises(LedgerError):
        led.record(row(3))
    holder.execute("COMMIT")
    assert usage_ids(backend) == []
    # The next start bills the response whose open row was durable, from what it can prove.
    after = fast(path)
    assert after.reconcile() == 1
    [billed] = after.rows()
    assert (billed.response_id, billed.status, billed.output_tokens) == ("resp_000001", INCOMPLETE, 0)
    after.close()


def test_a_failing_write_is_retried_not_dropped(path: str, backend: Backend) -> None:
    led = fast(path)
    failures = iter(range(3))

    def flaky(sql: str) -> None:  # the writer's first three transactions fail as the driver fails them
        if sql.startswith("BEGIN") and next(failures, None) is not None:
            raise backend.transient_error("disk I/O error")

    led._db.trace = flaky
    led.start()
    with capture_logs() as logs:
        led.record(row(1))
        led.flush(timeout=GUARD)
        # flush() returns once the row is durable; the writer logs its recovery just after.
        give_up = time.monotonic() + GUARD
        while len(logs) < 2 and time.monotonic() < give_up:
            time.sleep(0.001)
    assert (led.rows_written, led.retries, led.failed) == (1, 3, 0)
    assert [e["event"] for e in logs] == ["ledger.write_retrying", "ledger.write_recovered"]
    led.close()
    assert usage_ids(backend) == ["resp_000001"]


def test_full_buffer_refuses_at_once_typed_and_counted(path: str) -> None:
    led = fast(path, max_pending=3)  # writer not started: the buffer only fills
    led.started("resp_a", "key_a", "m", "longlived", 1e9)
    led.progress("resp_a", 10, 0, 1, 1)
    led.record(row(1))
    with pytest.raises(LedgerFullError):
        led.record(row(2))
    with pytest.raises(LedgerFullError):
        led.started("resp_b", "key_a", "m", "longlived", 1e9)
    led.progress("resp_a", 20, 5, 4, 2)  # coalesced into the pending update: takes no room
    assert (led.overflow, led.pending) == (2, 3)
    led.close()
    assert (led.rows_written, led.failed) == (1, 0)
    reopened = UsageLedger(path)
    [open_row] = reopened.open_responses()
    assert (open_row.input_tokens, open_row.cached_tokens, open_row.output_tokens, open_row.turns) == (
        20,
        5,
        4,
        2,
    )
    assert [r.response_id for r in reopened.rows()] == ["resp_000001"]
    reopened.close()


def test_progress_of_one_id_coalesces_while_pending_and_record_removes_the_open_row(path: str) -> None:
    led = fast(path)
    led.started("resp_000001", "key_a", "mock-1000tps", "ws", 1e9)
    for n in range(1, 6):
        led.progress("resp_000001", 100, 0, n, 1)
    assert led.pending == 2  # one open row, one progress update
    led.start()
    led.flush()
    [open_row] = led.open_responses()
    assert (open_row.output_tokens, open_row.turns) == (5, 1) and open_row.progress_at is not None
    led.progress("resp_000001", 100, 0, 10, 2)
    led.record(row(1))
    led.progress("resp_000001", 100, 0, 11, 2)  # after the end: no open row to update any more
    led.flush()
    assert led.open_responses() == [] and led.get("resp_000001") == row(1)
    assert led.reconcile() == 0
    led.close()


def test_reconcile_bills_abandoned_open_rows_incomplete_with_their_last_progress(
    path: str, backend: Backend
) -> None:
    crashed = fast(path)
    crashed.start()
    crashed.started("resp_a", "key_a", "mock-65tps", "longlived", 1e9)
    crashed.progress("resp_a", 100, 20, 7, 2)
    crashed.started("resp_b", "key_a", "mock-65tps", "http", 1e9 + 1)
    crashed.record(
        LedgerRow("resp_b", "key_a", "mock-65tps", "http", "completed", 5, 0, 3, 1, 1e9 + 1, 1e9 + 2)
    )
    crashed.started("resp_c", "key_b", "mock-65tps", "ws", 1e9 + 2)
    crashed.flush()
    progress_at = crashed.open_responses()[0].progress_at
    # The crash: `crashed` is abandoned, never closed. The next process opens the same database.
    restarted = fast(path)
    restarted.started("resp_mine", "key_a", "m", "ws", 1e9 + 3)  # this ledger's own open row is never billed
    restarted.start()
    restarted.flush()
    # While `crashed` lives (it holds its owner lock), its responses are another server's in flight and
    # stay open; the lock's release is its death.
    assert restarted.reconcile() == 0 and len(restarted.open_responses()) == 3
    if backend.server is not None:  # PostgreSQL: its session ends
        with backend.server.connect() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
                (f"responses-lab owner {crashed._owner} %",),
            )
        backend.server.wait_owner_gone(crashed._owner)
    else:  # SQLite: its file lock goes, as the kernel drops it when a process dies
        fcntl.flock(crashed._db._owner_held[1], fcntl.LOCK_UN)  # type: ignore[attr-defined]
    with capture_logs() as logs:
        assert restarted.reconcile() == 2
    assert restarted.reconciled == 2 and restarted.rows_written == 2
    a, c = restarted.get("resp_a"), restarted.get("resp_c")
    assert a == LedgerRow(
        "resp_a",
        "key_a",
        "mock-65tps",
        "longlived",
        INCOMPLETE,
        100,
        20,
        7,
        2,
        1e9,
        cast(float, progress_at),
        CRASHED,
    )
    assert c == LedgerRow(
        "resp_c", "key_b", "mock-65tps", "ws", INCOMPLETE, 0, 0, 0, 0, 1e9 + 2, 1e9 + 2, CRASHED
    )
    b = restarted.get("resp_b")
    assert b is not None and b.status == "completed"
    assert [o.response_id for o in restarted.open_responses()] == ["resp_mine"]
    [event] = [e for e in logs if e["event"] == "ledger.reconciled"]
    assert event["response_ids"] == ["resp_a", "resp_c"]
    assert restarted.reconcile() == 0  # at most once
    crashed.close()
    restarted.close()


_CHILD = textwrap.dedent(
    """
    import sys, time
    from proto.server.storage.ledger import UsageLedger
    led = UsageLedger(sys.argv[1])
    led.start()
    led.started("resp_killed", "key_a", "mock-65tps", "longlived", 1e9)
    led.progress("resp_killed", 50, 10, 30, 2)
    led.flush()
    led.progress("resp_killed", 60, 10, 40, 3)
    led.flush()
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.process
def test_sigkill_mid_response_then_reconcile(path: str, backend: Backend) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, env=env, text=True
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            child.send_signal(signal.SIGKILL)
            assert child.wait(GUARD) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
    if backend.server is not None:
        backend.server.wait_sessions_gone(child.pid)  # PostgreSQL notices the dead client within ms
    led = UsageLedger(path)
    assert led.reconcile() == 1
    [billed] = led.rows()
    assert (billed.response_id, billed.status, billed.mode) == ("resp_killed", INCOMPLETE, "longlived")
    assert (billed.input_tokens, billed.cached_tokens, billed.output_tokens, billed.turns) == (60, 10, 40, 3)
    assert led.open_responses() == []
    led.close()


def test_a_row_the_database_can_never_take_is_rejected_not_retried_forever(
    path: str, backend: Backend
) -> None:
    poison = row(2)
    object.__setattr__(poison, "input_tokens", [1])  # past validation: no integer column takes a list
    led = fast(path)
    for r in (row(1), poison, row(3)):
        led.record(r)
    with capture_logs() as logs:
        led.close()
    assert (led.rows_written, led.failed) == (2, 1)
    assert [e["response_id"] for e in logs if e["event"] == "ledger.row_rejected"] == ["resp_000002"]
    assert usage_ids(backend) == ["resp_000001", "resp_000003"]


def test_bad_started_and_progress_are_refused_on_the_callers_stack() -> None:
    led = UsageLedger(":memory:")
    with pytest.raises(ValueError):
        led.started("resp_x", "k", "m", "grpc", 0.0)
    with pytest.raises(ValueError):
        led.progress("resp_x", -1, 0, 0, 0)
    with pytest.raises(ValueError):
        LedgerRow("resp_x", "k", None, "ws", "completed", 1, 0, 0, 1, 0.0, 0.0)  # type: ignore[arg-type]
    assert led.pending == 0
    led.close()


async def test_metrics_export_the_ledger_counters(path: str) -> None:
    from proto.server.app import ServerCollector

    led = fast(path, max_pending=1)
    led.record(row(1))
    with pytest.raises(LedgerFullError):
        led.record(row(2))
    pipeline = SimpleNamespace(
        engines=SimpleNamespace(gpus={}, remote=None), totals=WorkCounters(), ledger=led
    )
    server = SimpleNamespace(pipeline=pipeline, connections=[])
    values = {
        m.name: m.samples[0].value
        for m in ServerCollector(server).collect()
        if m.name.startswith("responses_lab_ledger")
    }  # type: ignore[arg-type]
    assert values == {
        "responses_lab_ledger_unwritable": 0,
        "responses_lab_ledger_rows_written": 0,
        "responses_lab_ledger_rows_retried": 0,
        "responses_lab_ledger_pending": 1,
        "responses_lab_ledger_failed": 0,
        "responses_lab_ledger_overflow": 1,
        "responses_lab_ledger_duplicates": 0,
        "responses_lab_ledger_reconciled": 0,
    }
    led.close()


def test_a_database_from_before_the_reason_column_is_migrated_and_keeps_its_rows(
    path: str, backend: Backend
) -> None:
    old = open_database(path, "ledger", busy_timeout=1.0)
    old.migrate("ledger", MIGRATIONS[:1])  # the schema as it was (version 1), with a row in it
    old.close()
    backend.query(
        "INSERT INTO usage VALUES ('resp_old', 'key_a', 'm', 'ws', 'completed', 1, 0, 2, 1, 1000000000.0, "
        "1000000000.0)"
    )
    led = fast(path)  # version 2: the reason column
    led.start()
    led.record(replace(row(1, status="incomplete"), reason="max_output_tokens"))
    led.flush()
    assert led.get("resp_old") == LedgerRow(
        "resp_old", "key_a", "m", "ws", "completed", 1, 0, 2, 1, 1e9, 1e9, ""
    )
    found = led.get("resp_000001")
    assert found is not None and found.reason == "max_output_tokens"
    led.close()
