"""Background mode over HTTP (docs/protocol.md, "Background mode"), on a real server on loopback.

``background: true`` answers at once with the Response ``queued``; the response moves to ``in_progress``
and to its end in the store (``GET`` polls it), survives its client, is billed once, and can be cancelled
(idempotent) — from the process that runs it or from another one on the same database. Created with
``stream: true`` its events are logged, so ``GET …?stream=true&starting_after=N`` resumes after event N,
live while it runs and after it ended. Bad input is refused typed and leaves nothing in the store; a
response whose server died or shut down is ended, not left ``in_progress``. Every Response object and
event is checked against the Open Responses spec (tests/spec.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from databases import Backend, PostgresServer
from helpers import GUARD, MODEL, SLOW_MODEL, auth, query, running, serve_process, state
from openai import AsyncOpenAI, BadRequestError, NotFoundError
from spec import check_event, check_response
from virtual import virtual

from proto.server.background import CANCEL_WAIT_S
from proto.server.serve import ThreadedServer
from proto.server.storage.ledger import LedgerRow

pytestmark = pytest.mark.process  # every test starts a server

KEY, OTHER = "sk-background-0001", "sk-background-0002"
STREAMING_MODEL = "mock-1000tps"  # 1000 tokens/s: `!tokens 1500` streams for about a second and a half
LONG = "!tokens 1500 !say x"  # on STREAMING_MODEL
ENDLESS = "!tokens 5000 !say never"  # on SLOW_MODEL: over a minute, unless cancelled
RUNNING = ("queued", "in_progress")


def body(script: str, model: str = MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "input": script, "background": True, **fields}


def client(server: ThreadedServer, key: str = KEY) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.http_url, headers=auth(key), timeout=GUARD)


async def poll(
    http: httpx.AsyncClient, response_id: str, until: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """GET it until its status is in ``until`` (default: any terminal one); each Response checked."""
    for _ in range(1000):
        reply = await http.get(f"/v1/responses/{response_id}")
        assert reply.status_code == 200, reply.text
        response: dict[str, Any] = reply.json()
        check_response(response)
        if (response["status"] in until) if until else (response["status"] not in RUNNING):
            return response
        await asyncio.sleep(0.01)
    raise AssertionError(f"{response_id} never reached {until or 'a terminal status'}")


async def events_of(lines: AsyncIterator[str], events: list[dict[str, Any]], stop_after: int = 0) -> None:
    """The SSE body's events into ``events`` (each checked): to the end, or until ``stop_after`` were read."""
    async for line in lines:
        if line.startswith("data: "):
            event = json.loads(line[len("data: ") :])
            check_event(event)
            events.append(event)
            if stop_after and len(events) >= stop_after:
                return


async def stream_some(http: httpx.AsyncClient, created: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The first ``count`` events of a create's SSE stream (each checked); then the client goes away."""
    events: list[dict[str, Any]] = []
    async with http.stream("POST", "/v1/responses", json=created) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        await events_of(reply.aiter_lines(), events, stop_after=count)
    return events


async def resume(http: httpx.AsyncClient, response_id: str, after: int | None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"stream": "true"}
    if after is not None:
        params["starting_after"] = after
    events: list[dict[str, Any]] = []
    async with http.stream("GET", f"/v1/responses/{response_id}", params=params) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        await events_of(reply.aiter_lines(), events)
    return events


def billed(server: ThreadedServer, response_id: str) -> LedgerRow:
    """Its one usage row (and no second one was ever refused)."""
    ledger = state(server).pipeline.ledger
    ledger.flush()
    rows = [row for row in ledger.rows() if row.response_id == response_id]
    assert len(rows) == 1 and ledger.duplicates == 0, rows
    return rows[0]


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


# ------------------------------------------------------------------------------------ create → poll → end
async def test_create_returns_queued_then_poll_sees_it_complete_and_it_is_billed_once(
    backend: Backend,
) -> None:
    with running(db=backend.url, api_key=[KEY, OTHER]) as srv:
        async with client(srv) as http, client(srv, OTHER) as other:
            reply = await http.post("/v1/responses", json=body("!say polled at last"))
            assert reply.status_code == 200, reply.text
            queued = reply.json()
            check_response(queued)
            assert (queued["status"], queued["background"], queued["output"]) == ("queued", True, [])
            done = await poll(http, queued["id"])
            assert (done["status"], done["background"]) == ("completed", True)
            assert done["output"][-1]["content"][0]["text"] == "polled at last"
            assert done["created_at"] == queued["created_at"]
            # The store's key isolation: another key's poll, cancel and resume find nothing.
            for reply in (
                await other.get(f"/v1/responses/{queued['id']}"),
                await other.post(f"/v1/responses/{queued['id']}/cancel"),
                await other.get(f"/v1/responses/{queued['id']}", params={"stream": "true"}),
            ):
                assert reply.status_code == 404 and reply.json()["error"]["code"] == "response_not_found"
            # Its input items were stored once, with the same ids across its three writes.
            items = (await http.get(f"/v1/responses/{queued['id']}/input_items")).json()["data"]
            assert len(items) == 1 and items[0]["id"].startswith("msg_")
            stored = backend.query("SELECT COUNT(*) FROM items WHERE response_id = ?", (queued["id"],))
            assert stored == [(2,)]  # that input and the output message: no input stored under a 2nd id
            # It chains as any stored response, in the background too.
            follow = body("!say and then", previous_response_id=queued["id"])
            chained = await poll(http, (await http.post("/v1/responses", json=follow)).json()["id"])
            assert chained["status"] == "completed" and chained["previous_response_id"] == queued["id"]
            assert chained["usage"]["input_tokens"] > done["usage"]["input_tokens"]  # the chain was loaded
        row = billed(srv, queued["id"])
        assert (row.status, row.output_tokens) == ("completed", done["usage"]["output_tokens"])


async def test_poll_sees_in_progress_and_a_continuation_waits_for_the_end() -> None:
    with running(api_key=[KEY]) as srv:
        async with client(srv) as http:
            queued = (await http.post("/v1/responses", json=body(ENDLESS, SLOW_MODEL))).json()
            running_now = await poll(http, queued["id"], ("in_progress",))
            assert running_now["background"] is True
            follow = {"model": MODEL, "input": "!say next", "previous_response_id": queued["id"]}
            reply = await http.post("/v1/responses", json=follow)
            assert reply.status_code == 409, reply.text
            assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == (
                "response_in_progress",
                "previous_response_id",
            )
            await http.post(f"/v1/responses/{queued['id']}/cancel")
            assert (await http.post("/v1/responses", json=follow)).status_code == 200  # once it ended


# ------------------------------------------------------------------------------------ cancel
async def test_cancel_is_idempotent_and_an_ended_response_stays_as_it_was(backend: Backend) -> None:
    with running(db=backend.url, api_key=[KEY]) as srv:
        async with client(srv) as http:
            queued = (await http.post("/v1/responses", json=body(ENDLESS, SLOW_MODEL))).json()
            await poll(http, queued["id"], ("in_progress",))
            first = await http.post(f"/v1/responses/{queued['id']}/cancel")
            assert first.status_code == 200, first.text
            cancelled = first.json()
            check_response(cancelled)
            assert (cancelled["status"], cancelled["background"]) == ("cancelled", True)
            again = await http.post(f"/v1/responses/{queued['id']}/cancel")
            assert again.status_code == 200 and again.json() == cancelled
            assert (await http.get(f"/v1/responses/{queued['id']}")).json() == cancelled
            # One that completed stays completed.
            done = await poll(http, (await http.post("/v1/responses", json=body("!say done"))).json()["id"])
            after = await http.post(f"/v1/responses/{done['id']}/cancel")
            assert after.status_code == 200 and after.json() == done
        row = billed(srv, queued["id"])
        assert (row.status, row.reason) == ("cancelled", "cancelled")
        assert row.output_tokens == cancelled["usage"]["output_tokens"]
        assert billed(srv, done["id"]).status == "completed"


async def test_a_queued_response_cancelled_before_it_starts_never_samples() -> None:
    with running(api_key=[KEY]) as srv:
        async with client(srv) as http:
            queued = (await http.post("/v1/responses", json=body(ENDLESS, SLOW_MODEL))).json()
            # Asked on the server's loop before its task first runs: the driver ends it at once.
            assert srv.loop is not None
            background = state(srv).http.background

            async def cancel_now() -> None:
                background.running[queued["id"]].cut_by_owner("cancelled")

            asyncio.run_coroutine_threadsafe(cancel_now(), srv.loop).result(GUARD)
            ended = await poll(http, queued["id"])
        assert (ended["status"], ended["output"]) == ("cancelled", [])
        assert billed(srv, queued["id"]).output_tokens == 0


async def test_delete_cancels_a_running_background_response_then_removes_it_and_its_log(
    tmp_path: Path,
) -> None:
    db = tmp_path / "lab.sqlite3"
    with running(db=str(db), api_key=[KEY]) as srv:
        async with client(srv) as http:
            seen = await stream_some(http, body(ENDLESS, SLOW_MODEL, stream=True), 6)
            response_id = seen[0]["response"]["id"]
            deleted = await http.delete(f"/v1/responses/{response_id}")
            assert deleted.json() == {"id": response_id, "object": "response", "deleted": True}
            for reply in (
                await http.get(f"/v1/responses/{response_id}"),
                await http.get(f"/v1/responses/{response_id}", params={"stream": "true"}),
                await http.post(f"/v1/responses/{response_id}/cancel"),
            ):
                assert reply.status_code == 404 and reply.json()["error"]["code"] == "response_not_found"
        assert billed(srv, response_id).status == "cancelled"  # it ran, it was cut, it was billed once
    for table in ("responses", "background_responses", "background_events"):
        assert query(db, f"SELECT COUNT(*) FROM {table} WHERE response_id = '{response_id}'") == [(0,)]


# ------------------------------------------------------------------------------------ stream and resume
async def test_stream_disconnect_then_resume_from_the_middle_and_from_the_end(backend: Backend) -> None:
    with running(db=backend.url, api_key=[KEY]) as srv:
        async with client(srv) as http:
            first = await stream_some(http, body(LONG, STREAMING_MODEL, stream=True), 12)
            # The client went away; the response did not.
            assert [e["type"] for e in first[:3]] == [
                "response.created",
                "response.queued",
                "response.in_progress",
            ]
            assert (
                first[0]["response"]["status"] == "queued" and first[2]["response"]["status"] == "in_progress"
            )
            response_id = first[0]["response"]["id"]
            last = first[-1]["sequence_number"]
            live = await resume(http, response_id, last)  # while it still streams: followed to its end
            numbers = [e["sequence_number"] for e in first + live]
            assert numbers == list(range(len(numbers)))  # nothing lost, nothing twice
            assert live[-1]["type"] == "response.completed"
            stored = await poll(http, response_id)
            assert stored["status"] == "completed"
            assert text_of(first + live) == stored["output"][-1]["content"][0]["text"]
            # After its end: from the middle, from the start, from the end.
            middle = await resume(http, response_id, 5)
            assert middle == (first + live)[6:]
            assert await resume(http, response_id, None) == first + live
            assert await resume(http, response_id, live[-1]["sequence_number"]) == []
        row = billed(srv, response_id)
        assert (row.status, row.output_tokens) == ("completed", stored["usage"]["output_tokens"])


async def test_a_response_created_without_stream_is_polled_not_streamed() -> None:
    with running(api_key=[KEY]) as srv:
        async with client(srv) as http:
            done = await poll(http, (await http.post("/v1/responses", json=body("!say hi"))).json()["id"])
            plain = (await http.post("/v1/responses", json={"model": MODEL, "input": "!say hi"})).json()
            for response_id in (done["id"], plain["id"]):
                reply = await http.get(f"/v1/responses/{response_id}", params={"stream": "true"})
                assert reply.status_code == 400, reply.text
                assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == (
                    "invalid_request",
                    "stream",
                )


# ------------------------------------------------------------------------------------ bad input
async def test_bad_input_is_refused_typed_and_leaves_nothing_stored(tmp_path: Path) -> None:
    db = tmp_path / "lab.sqlite3"
    with running(db=str(db), api_key=[KEY]) as srv:
        async with client(srv) as http:
            done = await poll(
                http, (await http.post("/v1/responses", json=body("!say hi", stream=False))).json()["id"]
            )
            streamed = (await http.post("/v1/responses", json=body("!say hi", stream=True))).text
            streamed_id = json.loads(streamed.split("data: ", 1)[1].split("\n", 1)[0])["response"]["id"]
            await poll(http, streamed_id)
            plain = (await http.post("/v1/responses", json={"model": MODEL, "input": "!say hi"})).json()
            before = (
                query(db, "SELECT COUNT(*) FROM responses")[0][0],
                query(db, "SELECT COUNT(*) FROM background_responses")[0][0],
            )
            cases = [
                (
                    http.post("/v1/responses", json=body("!say hi", store=False)),
                    400,
                    "invalid_request",
                    "store",
                ),
                (
                    http.post("/v1/responses", json=body("!say hi", model="nope")),
                    404,
                    "model_not_found",
                    "model",
                ),
                (http.post("/v1/responses/resp_nope/cancel"), 404, "response_not_found", "response_id"),
                (http.post(f"/v1/responses/{plain['id']}/cancel"), 400, "invalid_request", "response_id"),
                (
                    http.get("/v1/responses/resp_nope", params={"stream": "true"}),
                    404,
                    "response_not_found",
                    None,
                ),
            ]
            for bad in ("abc", "-1", "1.5"):
                cases.append(
                    (
                        http.get(
                            f"/v1/responses/{streamed_id}", params={"stream": "true", "starting_after": bad}
                        ),
                        400,
                        "invalid_request",
                        "starting_after",
                    )
                )
            for request, status, code, param in cases:
                reply = await request
                assert reply.status_code == status, reply.text
                error = reply.json()["error"]
                assert error["code"] == code and error["message"], error
                if param is not None:
                    assert error["param"] == param, error
            after = (
                query(db, "SELECT COUNT(*) FROM responses")[0][0],
                query(db, "SELECT COUNT(*) FROM background_responses")[0][0],
            )
            assert after == before
            assert (await http.get(f"/v1/responses/{done['id']}")).json() == done  # unchanged, still served


async def test_a_store_that_refuses_the_queued_write_answers_503_and_keeps_nothing(
    backend: Backend, lock: Callable[[], Any]
) -> None:
    with running(db=backend.url, api_key=[KEY], db_busy_timeout_s=0.2) as srv:
        async with client(srv) as http:
            holder = lock()  # another session's write lock on every table, past the busy timeout
            try:
                reply = await http.post("/v1/responses", json=body("!say hi", stream=True))
            finally:
                holder.execute("ROLLBACK")
            assert reply.status_code == 503 and reply.json()["error"]["code"] == "store_unavailable"
            for table in ("responses", "items", "background_responses", "background_events"):
                assert backend.query(f"SELECT COUNT(*) FROM {table}") == [(0,)], table
            done = await poll(http, (await http.post("/v1/responses", json=body("!say hi"))).json()["id"])
            assert done["status"] == "completed"  # it serves on


# ------------------------------------------------------------------------------------ two processes, one db
async def test_poll_cancel_and_resume_from_another_server_on_the_same_postgresql(pg: PostgresServer) -> None:
    """Two servers (as ``serve --workers 2`` runs two workers) on one PostgreSQL: the one that did not
    create the response polls it, follows its stream and cancels it."""
    url = pg.fresh()
    with running(db=url, api_key=[KEY]) as one, running(db=url, api_key=[KEY]) as two:
        async with client(one) as here, client(two) as there:
            first = await stream_some(here, body(LONG, STREAMING_MODEL, stream=True), 8)
            response_id = first[0]["response"]["id"]
            assert (await poll(there, response_id, RUNNING))["background"] is True  # polled elsewhere
            live = await resume(there, response_id, first[-1]["sequence_number"])  # followed elsewhere
            numbers = [e["sequence_number"] for e in first + live]
            assert numbers == list(range(len(numbers))) and live[-1]["type"] == "response.completed"
            # Cancelled elsewhere: the owner sees the row and ends it.
            queued = (await here.post("/v1/responses", json=body(ENDLESS, SLOW_MODEL))).json()
            await poll(there, queued["id"], ("in_progress",))
            cancelled = await there.post(f"/v1/responses/{queued['id']}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
            assert (await here.get(f"/v1/responses/{queued['id']}")).json() == cancelled.json()
            assert (await there.post(f"/v1/responses/{queued['id']}/cancel")).json() == cancelled.json()
        assert billed(one, response_id).status == "completed"
        assert billed(one, queued["id"]).status == "cancelled"
        assert not state(two).http.background.running


async def test_serve_workers_2_any_worker_polls_resumes_and_cancels(backend: Backend) -> None:
    """``serve --workers 2``: every request on a fresh connection, so the kernel hands each to either
    worker; whichever gets it polls, follows and cancels a response the other may run."""
    async with (
        serve_process(backend.url, "--workers", "2", "--api-key", KEY) as served,
        httpx.AsyncClient(
            base_url=served.http_url,
            headers=auth(KEY),
            timeout=GUARD,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as http,
    ):
        first = await stream_some(http, body(LONG, STREAMING_MODEL, stream=True), 6)
        response_id = first[0]["response"]["id"]
        for _ in range(4):
            rest = await resume(http, response_id, first[-1]["sequence_number"])
            numbers = [e["sequence_number"] for e in first + rest]
            assert numbers == list(range(len(numbers))) and rest[-1]["type"] == "response.completed"
        queued = (await http.post("/v1/responses", json=body(ENDLESS, SLOW_MODEL))).json()
        await poll(http, queued["id"], ("in_progress",))
        cancelled = (await http.post(f"/v1/responses/{queued['id']}/cancel")).json()
        assert cancelled["status"] == "cancelled"
        for _ in range(4):
            assert (await http.get(f"/v1/responses/{queued['id']}")).json() == cancelled
            assert (await http.post(f"/v1/responses/{queued['id']}/cancel")).json() == cancelled
    usage = backend.query(
        "SELECT status FROM usage WHERE response_id IN (?, ?) ORDER BY status", (response_id, queued["id"])
    )
    assert usage == [("cancelled",), ("completed",)]


async def test_a_cancel_waits_for_an_owner_that_never_answers_only_until_its_limit(tmp_path: Path) -> None:
    """A response whose owner is gone and not yet reconciled (its row says it runs on a process that no
    longer exists): the cancel asks, waits ``CANCEL_WAIT_S`` of the server's limit clock, and answers the
    Response as it is. Virtual time: nothing here waits ten seconds."""
    db = tmp_path / "lab.sqlite3"
    async with (
        virtual(db=str(db), api_key=[KEY]) as srv,
        httpx.AsyncClient(base_url=srv.http_url, headers=auth(KEY), timeout=GUARD) as http,
    ):
        done = await poll(http, (await http.post("/v1/responses", json=body("!say hi"))).json()["id"])
        orphan = dict(done, id="resp_" + "0" * 32, status="in_progress", output=[], completed_at=None)
        with sqlite3.connect(db) as conn:
            conn.execute(
                "INSERT INTO responses SELECT ?, api_key_id, previous_response_id, model, created_at, ?,"
                " input_items_json FROM responses WHERE response_id = ?",
                (orphan["id"], json.dumps(orphan).encode(), done["id"]),
            )
            conn.execute(
                "INSERT INTO background_responses (response_id, api_key_id, owner, stream)"
                " SELECT ?, api_key_id, 'a-process-that-died', 0 FROM background_responses"
                " WHERE response_id = ?",
                (orphan["id"], done["id"]),
            )
        conn.close()
        cancel = asyncio.create_task(http.post(f"/v1/responses/{orphan['id']}/cancel"))
        await asyncio.sleep(0.5)  # five of the owner's polls: nobody answers, the clock has not moved
        assert not cancel.done()
        await srv.advance_until(CANCEL_WAIT_S, cancel.done, "the cancel's wait ended")
        reply = await cancel
        assert reply.status_code == 200 and reply.json() == orphan
        asked = query(
            db, f"SELECT cancel_requested FROM background_responses WHERE response_id = '{orphan['id']}'"
        )
        assert asked == [(1,)]


# ------------------------------------------------------------------------------------ the openai SDK
async def test_the_openai_sdk_creates_polls_cancels_and_resumes_a_stream() -> None:
    with running(api_key=[KEY]) as srv:
        async with AsyncOpenAI(base_url=srv.http_url + "/v1", api_key=KEY, max_retries=0) as sdk:
            queued = await sdk.responses.create(model=MODEL, input="!say from the sdk", background=True)
            assert (queued.status, queued.background) == ("queued", True)
            polled = queued
            while polled.status in RUNNING:
                await asyncio.sleep(0.01)
                polled = await sdk.responses.retrieve(queued.id)
            assert polled.status == "completed" and polled.output_text == "from the sdk"

            endless = await sdk.responses.create(model=SLOW_MODEL, input=ENDLESS, background=True)
            cancelled = await sdk.responses.cancel(endless.id)
            assert cancelled.status == "cancelled"
            assert (await sdk.responses.cancel(endless.id)).status == "cancelled"
            plain = await sdk.responses.create(model=MODEL, input="!say hi")
            with pytest.raises(BadRequestError):
                await sdk.responses.cancel(plain.id)
            with pytest.raises(NotFoundError):
                await sdk.responses.cancel("resp_nope")

            stream = await sdk.responses.create(
                model=STREAMING_MODEL, input=LONG, background=True, stream=True
            )
            seen = []
            async for event in stream:
                seen.append(event)
                if len(seen) == 10:
                    break
            await stream.close()
            rest = [
                event
                async for event in await sdk.responses.retrieve(
                    seen[0].response.id,  # type: ignore[union-attr]
                    stream=True,
                    starting_after=seen[-1].sequence_number,
                )
            ]
    assert [e.type for e in seen[:3]] == ["response.created", "response.queued", "response.in_progress"]
    numbers = [e.sequence_number for e in seen + rest]
    assert numbers == list(range(len(numbers))) and rest[-1].type == "response.completed"


# ------------------------------------------------------------------------------------ shutdown and crash
async def test_shutdown_ends_a_background_response_stored_and_billed(backend: Backend) -> None:
    with running(db=backend.url, api_key=[KEY]) as srv:
        async with client(srv) as http:
            seen = await stream_some(http, body(ENDLESS, SLOW_MODEL, stream=True), 5)
            response_id = seen[0]["response"]["id"]
            await poll(http, response_id, ("in_progress",))
    [(raw,)] = backend.query("SELECT response_json FROM responses WHERE response_id = ?", (response_id,))
    stored = json.loads(bytes(raw))
    check_response(stored)
    assert (stored["status"], stored["incomplete_details"]) == (
        "incomplete",
        {"reason": "server_shutting_down"},
    )
    [(kind, ended)] = backend.query(
        "SELECT e.type, b.ended FROM background_events e JOIN background_responses b USING (response_id)"
        " WHERE response_id = ? ORDER BY sequence_number DESC LIMIT 1",
        (response_id,),
    )
    assert (kind, ended) == ("response.incomplete", 1)
    usage = backend.query("SELECT status, reason FROM usage WHERE response_id = ?", (response_id,))
    assert usage == [("incomplete", "server_shutting_down")]


async def test_a_crashed_servers_background_response_is_ended_at_the_next_start(backend: Backend) -> None:
    flags = ("--api-key", KEY, "--progress-interval-s", "0.02")
    async with serve_process(backend.url, *flags) as first:
        async with httpx.AsyncClient(base_url=first.http_url, headers=auth(KEY), timeout=GUARD) as http:
            seen = await stream_some(http, body(ENDLESS, SLOW_MODEL, stream=True), 8)
            polled = await poll(http, seen[0]["response"]["id"], ("in_progress",))
        first.process.send_signal(signal.SIGKILL)
        await first.process.wait()
    async with (
        serve_process(backend.url, *flags) as second,
        httpx.AsyncClient(base_url=second.http_url, headers=auth(KEY), timeout=GUARD) as http,
    ):
        ended = await poll(http, polled["id"])
        assert (ended["status"], ended["incomplete_details"]) == (
            "incomplete",
            {"reason": "server_crashed"},
        )
        rest = await resume(http, polled["id"], seen[-1]["sequence_number"])  # what it logged, then the end
        numbers = [e["sequence_number"] for e in seen + rest]
        assert numbers == list(range(len(numbers))) and rest[-1]["type"] == "response.incomplete"
        assert rest[-1]["response"]["incomplete_details"] == {"reason": "server_crashed"}
        cancel = await http.post(f"/v1/responses/{polled['id']}/cancel")
        assert cancel.status_code == 200 and cancel.json() == ended  # ended: stays as it was
    usage = backend.query("SELECT status, reason FROM usage WHERE response_id = ?", (polled["id"],))
    assert usage == [("incomplete", "server_crashed")]
