"""The usage ledger: every row written exactly once, off the caller's thread, and nothing lost on close —
on SQLite and on PostgreSQL (``path``, ``backend``: tests/conftest.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from databases import Backend
from structlog.testing import capture_logs

from proto.server.storage.ledger import (
    MIGRATIONS,
    LedgerError,
    LedgerRow,
    UsageLedger,
    fingerprint_api_key,
)


def row(n: int, *, mode: str = "ws", key: str = "key_a", output: int = 10) -> LedgerRow:
    return LedgerRow(
        response_id=f"resp_{n:06d}",
        api_key_id=key,
        model="mock-1000tps",
        mode=mode,
        status="completed",
        input_tokens=100 + n,
        cached_tokens=n,
        output_tokens=output,
        turns=3,
        created_at=1_700_000_000.0 + n,
        completed_at=1_700_000_001.0 + n,
    )


@pytest.fixture
def ledger(path: str) -> Iterator[UsageLedger]:
    led = UsageLedger(path)
    led.start()
    yield led
    led.close()


def test_rows_are_written_once_and_read_back(ledger: UsageLedger) -> None:
    for n in range(250):
        ledger.record(row(n))
    ledger.flush()
    assert ledger.rows_written == 250 and ledger.duplicates == 0 and ledger.pending == 0
    got = ledger.rows()
    assert [r.response_id for r in got] == [f"resp_{n:06d}" for n in range(250)]
    assert ledger.get("resp_000042") == row(42)
    assert ledger.get("resp_missing") is None


def test_rows_filter_by_key_and_mode(ledger: UsageLedger) -> None:
    ledger.record(row(1, mode="http", key="key_a"))
    ledger.record(row(2, mode="longlived", key="key_a"))
    ledger.record(row(3, mode="http", key="key_b"))
    ledger.flush()
    assert [r.response_id for r in ledger.rows(mode="http")] == ["resp_000001", "resp_000003"]
    assert [r.response_id for r in ledger.rows(api_key_id="key_a", mode="http")] == ["resp_000001"]
    assert len(ledger.rows(limit=2)) == 2


def test_duplicate_response_id_is_refused_and_counted(ledger: UsageLedger) -> None:
    with capture_logs() as logs:
        ledger.record(row(7, output=10))
        ledger.flush()
        ledger.record(row(7, output=99))  # in a later batch: refused by the primary key
        ledger.record(row(8))
        ledger.record(row(8, output=99))  # in the same batch
        ledger.flush()
    assert ledger.rows_written == 2 and ledger.duplicates == 2
    assert list(ledger.duplicate_ids) == ["resp_000007", "resp_000008"]
    assert ledger.get("resp_000007") == row(7, output=10)  # the first write stands
    assert ledger.get("resp_000008") == row(8)
    assert [e["response_id"] for e in logs if e["event"] == "ledger.duplicate_response"] == [
        "resp_000007",
        "resp_000008",
    ]


def test_close_writes_everything_queued_and_survives_reopen(path: str, backend: Backend) -> None:
    first = UsageLedger(path)
    first.start()
    for n in range(1000):
        first.record(row(n))
    first.close()  # no flush(): close alone must not lose the queue
    assert first.rows_written == 1000
    with pytest.raises(LedgerError):
        first.record(row(5000))
    first.close()  # idempotent

    second = UsageLedger(path)
    assert len(second.rows()) == 1000
    second.start()
    second.record(row(3))  # already billed before the restart
    second.record(row(1000))
    second.close()
    assert second.duplicates == 1 and second.rows_written == 1
    assert backend.query("SELECT count(*) FROM usage") == [(1001,)]
    assert backend.query("SELECT component, version FROM schema_version") == [("ledger", len(MIGRATIONS))]
    if backend.name == "sqlite":
        assert backend.query("PRAGMA journal_mode") == [("wal",)]


def test_close_without_start_still_writes_the_queue(path: str) -> None:
    led = UsageLedger(path)
    led.record(row(1))
    led.record(row(2))
    assert led.pending == 2
    with pytest.raises(LedgerError):
        led.flush()  # no writer to wait for
    led.close()
    assert led.rows_written == 2


def test_many_threads_record_concurrently(path: str) -> None:
    led = UsageLedger(path, batch_size=32)
    led.start()

    def worker(base: int) -> None:
        for n in range(base, base + 500):
            led.record(row(n))

    threads = [threading.Thread(target=worker, args=(t * 1000,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    led.close()
    assert led.rows_written == 4000 and led.duplicates == 0 and led.failed == 0
    reopened = UsageLedger(path)
    assert len({r.response_id for r in reopened.rows()}) == 4000
    reopened.close()


async def test_many_tasks_record_then_aclose(path: str) -> None:
    led = UsageLedger(path)
    await led.astart()

    async def session(s: int) -> None:
        for turn in range(20):
            led.record(row(s * 100 + turn, mode="longlived"))
            await asyncio.sleep(0)  # interleave the sessions

    await asyncio.gather(*(session(s) for s in range(50)))
    await led.aflush()
    assert led.rows_written == 1000
    await led.aclose()
    reopened = UsageLedger(path)
    assert len(reopened.rows(mode="longlived")) == 1000
    reopened.close()


def test_bad_rows_are_refused_on_the_callers_stack() -> None:
    with pytest.raises(ValueError):
        row(1, mode="grpc")
    with pytest.raises(ValueError):
        LedgerRow("resp_x", "k", "m", "ws", "completed", -1, 0, 0, 1, 0.0, 0.0)


def test_api_key_fingerprint_never_holds_the_key() -> None:
    key = "sk-test-" + "abc123" * 8
    fp = fingerprint_api_key(key)
    assert fp == fingerprint_api_key(key) and fp.startswith("key_")
    assert key not in fp and key[8:20] not in fp
    assert fingerprint_api_key("other") != fp
    assert fingerprint_api_key(None) == fingerprint_api_key("") == "anonymous"


def test_a_memory_ledger_needs_no_file() -> None:
    led = UsageLedger(":memory:")
    led.start()
    led.record(row(1))
    led.flush()
    assert led.rows() == [row(1)]
    led.close()


def test_two_ledgers_on_one_database_bill_each_response_once(path: str, backend: Backend) -> None:
    """Two servers' ledgers: the primary key is the idempotency key, whoever writes second is refused."""
    a, b = UsageLedger(path), UsageLedger(path)
    a.start()
    b.start()
    for n in range(300):
        (a if n % 2 else b).record(row(n))
    for n in range(0, 300, 3):  # a third of them billed again, by the other server
        (b if n % 2 else a).record(row(n, output=99))
    a.close()
    b.close()
    assert a.rows_written + b.rows_written == 300 and a.duplicates + b.duplicates == 100
    # Which of two racing writes commits first is the database's call; that exactly one does is the key's.
    assert backend.query(
        "SELECT count(*), count(DISTINCT response_id) FROM usage WHERE output_tokens IN (10, 99)"
    ) == [(300, 300)]
