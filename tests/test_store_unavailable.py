"""Storage faults over the wire (docs/operations.md, "Databases"): typed, survivable, nothing lost.

Before, a store write that failed (the database locked past its busy timeout) raised inside the response's
task: no terminal event, the long-lived connection stuck "streaming" for good, and HTTP answered a plain
``Internal Server Error``. Now every response ends with one typed terminal event, the connection serves the
next rollout, and the ledger — which retries with backoff — holds a row for every response once the lock
goes. The busy timeout is the server's ``--db-busy-timeout-s`` (50 ms here).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import GUARD, MODEL, TERMINAL_OR_ERROR, assert_error, running, state, until
from websockets.asyncio.client import ClientConnection, connect

from proto.core.errors import ERROR_CODES

pytestmark = pytest.mark.process  # every test starts a server or a process

BUSY_S = 0.05


def create(script: str = "!say hello", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": [{"role": "user", "content": script}], **fields}


async def ws_response(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "response.create", **create(**fields)}))
    return (await until(ws, TERMINAL_OR_ERROR))[-1]


async def sse_response(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    async with http.stream("POST", "/v1/responses", json=create(stream=True, **fields)) as reply:
        events = [
            json.loads(line[len("data: ") :])
            async for line in reply.aiter_lines()
            if line.startswith("data: ")
        ]
    return events[-1]


def assert_failed_store_unavailable(terminal: dict[str, Any]) -> str:
    assert terminal["type"] == "response.failed", terminal
    assert terminal["response"]["error"]["code"] == "store_unavailable", terminal
    response_id: str = terminal["response"]["id"]
    return response_id


def metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


async def test_a_database_locked_past_the_busy_timeout_fails_each_response_typed_and_loses_no_row(
    tmp_path: Path,
) -> None:
    db = tmp_path / "lab.db"
    with running(db=str(db), db_busy_timeout_s=BUSY_S) as srv:
        ledger = state(srv).pipeline.ledger
        async with (
            connect(srv.url + "?protocol=longlived") as longlived,
            connect(srv.url) as ga,
            httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http,
        ):
            assert (await ws_response(longlived, store=True))[
                "type"
            ] == "response.completed"  # schema and WAL exist
            await asyncio.to_thread(ledger.flush)
            holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN EXCLUSIVE")  # another process's write lock, held far past the busy timeout
            try:
                failed = [
                    assert_failed_store_unavailable(await ws_response(longlived, store=True)),
                    assert_failed_store_unavailable(await ws_response(ga, store=True)),
                    assert_failed_store_unavailable(await sse_response(http, store=True)),
                ]
                # nothing sent yet: 503 body
                reply = await http.post("/v1/responses", json=create(store=True))
                assert reply.status_code == ERROR_CODES["store_unavailable"][0] == 503, reply.text
                assert (
                    reply.json()["error"]["code"] == "store_unavailable"
                    and reply.json()["error"]["type"] == "server_error"
                )
                # The same connections serve the next rollout (not stored: the store is still locked).
                served = [await ws_response(longlived, store=False), await ws_response(ga, store=False)]
                served.append(await sse_response(http, store=False))
                plain = await http.post("/v1/responses", json=create(store=False))
                assert [t["type"] for t in served] == ["response.completed"] * 3 and plain.json()[
                    "status"
                ] == "completed"
                scraped = (await http.get("/metrics")).text
                assert metric(scraped, "responses_lab_ledger_pending") >= 8  # the rows wait, none dropped
                assert metric(scraped, "responses_lab_ledger_rows_retried") >= 1
            finally:
                holder.rollback()
                holder.close()
            # The lock is gone: the same connections store again.
            again = await ws_response(longlived, store=True)
            assert again["type"] == "response.completed"
            assert (await http.get(f"/v1/responses/{again['response']['id']}")).status_code == 200
        await asyncio.to_thread(ledger.flush)
        rows = {row.response_id: row for row in ledger.rows()}
        assert len(rows) == 10 and ledger.pending == 0 and ledger.failed == 0  # every response, once
        assert ledger.open_responses() == []
        for response_id in failed:
            assert (rows[response_id].status, rows[response_id].reason) == ("failed", "store_unavailable")
        assert sum(row.reason == "store_unavailable" for row in rows.values()) == 4  # the JSON one too
        # Bill what was delivered (docs/decisions/0012-bill-what-was-delivered.md): the streams were read
        # to their failure, the JSON client got a 503 body and none of the response, so no token.
        (json_row,) = [
            r for r in rows.values() if r.reason == "store_unavailable" and r.response_id not in failed
        ]
        assert (json_row.status, json_row.input_tokens, json_row.output_tokens) == ("failed", 0, 0), json_row
        assert all(rows[response_id].output_tokens > 0 for response_id in failed)
        for terminal in served:
            assert rows[terminal["response"]["id"]].status == "completed"


async def test_a_store_read_fault_is_typed_on_every_transport_and_the_connection_serves_on(
    tmp_path: Path,
) -> None:
    db = tmp_path / "lab.db"
    with running(db=str(db)) as srv:
        async with (
            connect(srv.url + "?protocol=longlived") as longlived,
            connect(srv.url) as ga,
            httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http,
        ):
            stored = (await http.post("/v1/responses", json=create(store=True))).json()["id"]
            with sqlite3.connect(db) as other:
                other.execute("DROP TABLE responses")  # the chain cannot be read: a storage fault, not a 404
            other.close()
            follow = {"previous_response_id": stored, "store": False}
            reply = await http.post("/v1/responses", json=create("more", **follow))
            assert reply.status_code == 503 and reply.json()["error"]["code"] == "store_unavailable", (
                reply.text
            )
            assert_error(await ws_response(ga, **follow), "store_unavailable", None)
            assert_error(await ws_response(longlived, **follow), "store_unavailable", None)
            for ws in (longlived, ga):  # no response was opened: the next one runs
                assert (await ws_response(ws, store=False))["type"] == "response.completed"
            assert (await http.post("/v1/responses", json=create(store=False))).json()[
                "status"
            ] == "completed"
