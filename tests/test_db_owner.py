"""One server per SQLite file, enforced (docs/operations.md, "Databases"): a second server on a file
another live process serves is refused with a clear message before it touches the file, and a ledger's
reconcile bills only the rows of owners that are provably dead (their owner lock is free), so a rolling
restart cannot bill a live server's responses ``server_crashed``."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from helpers import MODEL, clean_env, cli_command, create, outputs, running, serve_process, state, until
from websockets.asyncio.client import connect

from proto.core.events import TERMINAL_TYPES
from proto.server.storage.database import DatabaseInUse
from proto.server.storage.ledger import UsageLedger

pytestmark = pytest.mark.process


def test_a_second_server_in_process_on_the_same_file_is_refused(tmp_path: Path) -> None:
    db = str(tmp_path / "lab.db")
    with running(db=db), pytest.raises(DatabaseInUse, match="another live process"), running(db=db):
        pass
    with running(db=db):  # the first one stopped: its claim went with it
        pass


async def test_servers_sharing_a_file_on_purpose_never_bill_each_others_live_responses(
    tmp_path: Path,
) -> None:
    """``--db-shared`` (the lab's reconnect pairs): no claim, and the second server's start-up reconcile
    leaves the first one's suspended response alone; it ends and is billed as it ended."""
    db = str(tmp_path / "lab.db")
    with running(db=db) as first:
        async with connect(first.url + "?protocol=longlived") as ws:
            await ws.send(json.dumps(create()))
            done = (await until(ws, {"response.done"}))[-1]
            with running(db=db, db_shared=True) as second:
                assert state(second).pipeline.ledger.reconciled == 0
            await ws.send(json.dumps({"type": "response.append", "input": outputs(done["pending_calls"])}))
            assert (await until(ws, TERMINAL_TYPES))[-1]["type"] == "response.completed"
        ledger = state(first).pipeline.ledger
        await asyncio.to_thread(ledger.flush)
        assert [(row.status, row.reason) for row in ledger.rows()] == [("completed", "")]


def test_reconcile_leaves_a_live_ledgers_rows_alone(tmp_path: Path) -> None:
    db = str(tmp_path / "lab.db")
    live = UsageLedger(db)
    live.start()
    try:
        live.started("resp_live", "key_a", MODEL, "longlived", 1e9)
        live.flush()
        other = UsageLedger(db)
        try:
            assert other.reconcile() == 0  # before: every owner but oneself was taken for dead
            assert [row.response_id for row in other.open_responses()] == ["resp_live"]
        finally:
            other.close()
    finally:
        live.close()


async def test_a_second_serve_process_is_refused_and_the_first_ones_live_response_is_billed_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "lab.db"
    async with serve_process(db) as first:
        async with connect(first.ws_url + "?protocol=longlived") as ws:
            await ws.send(json.dumps(create()))
            done = (await until(ws, {"response.done"}))[-1]  # suspended, waiting for its tool outputs
            second = await asyncio.create_subprocess_exec(
                *cli_command(), "serve", "--port", "0", "--db", str(db),
                env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            try:
                _, raw = await asyncio.wait_for(second.communicate(), 60)
            except TimeoutError as exc:
                second.kill()
                await second.wait()
                raise AssertionError("a second server started on the same SQLite file") from exc
            stderr = raw.decode()
            assert second.returncode == 1, stderr
            assert "another live process" in stderr and str(first.process.pid) in stderr
            assert "Traceback" not in stderr
            # The response the second server would have billed server_crashed runs on and ends normally.
            await ws.send(json.dumps({"type": "response.append", "input": outputs(done["pending_calls"])}))
            assert (await until(ws, TERMINAL_TYPES))[-1]["type"] == "response.completed"
        first.process.terminate()
        await first.process.wait()
    ledger = UsageLedger(str(db))
    try:
        rows = ledger.rows()
        assert [(row.status, row.reason) for row in rows] == [("completed", "")], rows
        assert ledger.open_responses() == []
    finally:
        ledger.close()
