"""A database the ledger cannot write (docs/operations.md, "Databases"): refused at start-up with a clear
message; while it happens at run time, no response starts (503 ``ledger_unavailable`` on every transport)
instead of being served unbilled until 100 000 operations are pending; served again once it recovers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import (
    GUARD,
    MODEL,
    TERMINAL_OR_ERROR,
    assert_error,
    clean_env,
    cli_command,
    running,
    state,
    until,
)
from helpers import wait_for as wait_until
from websockets.asyncio.client import connect

from proto.server.storage.ledger import UsageLedger
from proto.server.storage.store import ResponseStore

pytestmark = pytest.mark.process

BODY = {"model": MODEL, "input": "!say hello", "store": False}


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` as a file nobody may write: mode 0444, and for root (whom modes do not stop) the immutable
    attribute. Skips where neither holds."""
    path.chmod(0o444)
    immutable = False
    try:
        if os.access(path, os.W_OK):
            chattr = shutil.which("chattr")
            done = (
                subprocess.run([chattr, "+i", str(path)], capture_output=True, check=False)
                if chattr
                else None
            )
            if done is None or done.returncode != 0 or (os.access(path, os.W_OK) and _writable(path)):
                pytest.skip("cannot make a file read-only here (root without chattr +i)")
            immutable = True
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        path.chmod(0o644)


def _writable(path: Path) -> bool:
    try:
        with open(path, "r+b"):
            return True
    except OSError:
        return False


def test_serve_refuses_a_read_only_database_at_start_up(tmp_path: Path) -> None:
    db = tmp_path / "lab.db"
    UsageLedger(str(db)).close()  # the schema, as a previous server left it
    ResponseStore(str(db)).close()
    with read_only(db):
        try:
            done = subprocess.run(
                [*cli_command(), "serve", "--port", "0", "--db", str(db)],
                capture_output=True,
                text=True,
                timeout=30,
                env=clean_env(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError("the server started on a read-only database") from exc
    assert done.returncode == 1, done.stderr
    assert "refusing to start" in done.stderr and "readonly" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


async def ws_create(url: str) -> dict[str, Any]:
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "response.create", **BODY}))
        return (await until(ws, TERMINAL_OR_ERROR))[-1]


async def test_while_the_ledger_cannot_write_no_response_starts_on_any_transport(tmp_path: Path) -> None:
    with running(db=str(tmp_path / "lab.db")) as srv:
        ledger = state(srv).pipeline.ledger
        failing = True

        def read_only_database(sql: str) -> None:  # what SQLite says for a file it may not write
            if failing and sql == "BEGIN IMMEDIATE":
                raise sqlite3.OperationalError("attempt to write a readonly database")

        async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
            assert (await http.post("/v1/responses", json=BODY)).status_code == 200
            await ledger.aflush()  # its rows are durable: the failure begins with the next response
            ledger._db.trace = read_only_database
            # The response that finds the ledger healthy is served; its writes are what fail.
            served = [(await http.post("/v1/responses", json=BODY)).json()["id"]]
            await wait_until(lambda: ledger.unwritable is not None, "the ledger's write failed")
            for stream in (False, True):
                reply = await http.post("/v1/responses", json={**BODY, "stream": stream})
                assert reply.status_code == 503, reply.text
                assert reply.json()["error"]["code"] == "ledger_unavailable", reply.text
                assert "readonly" in reply.json()["error"]["message"]
            background = await http.post("/v1/responses", json={**BODY, "background": True, "store": True})
            assert (
                background.status_code == 503 and background.json()["error"]["code"] == "ledger_unavailable"
            )
            assert_error(await ws_create(srv.url), "ledger_unavailable", None)
            assert_error(await ws_create(srv.url + "?protocol=longlived"), "ledger_unavailable", None)
            scraped = (await http.get("/metrics")).text
            assert "responses_lab_ledger_unwritable 1.0" in scraped
            assert ledger.pending <= 3  # the served one's open row, progress and usage row: nothing more

            failing = False  # the database takes writes again: the writer's next retry proves it
            await wait_until(lambda: ledger.unwritable is None, "the ledger recovered")
            served.append((await http.post("/v1/responses", json=BODY)).json()["id"])
            assert (await ws_create(srv.url))["type"] == "response.completed"
        ledger.flush()
        billed = {row.response_id for row in ledger.rows()}
        assert set(served) <= billed and len(billed) == 4  # every served response once; no refused one
