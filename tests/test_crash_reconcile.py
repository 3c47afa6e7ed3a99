"""SIGKILL mid-rollout, then a restart on the same database: nothing silently lost.

Each response leaves a durable trace when it starts (the ledger's open row) and updates it with what it
delivered at every turn end and every ``--progress-interval-s`` while a turn streams. A real
``responses-lab serve`` is killed with responses in every state — a long-lived one streaming its second turn,
one suspended on a call, a GA stream, an SSE stream, a JSON request — and a new one started on the same
file: before it serves, every response that had started is billed ``incomplete`` with reason
``server_crashed``, for at least the last progress its trace recorded and never more than the client
received; the responses that had ended keep their own rows. The guarantee is written out in
docs/operations.md, "Billing guarantees".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import GUARD, SLOW_MODEL, query, serve_process, sse_read
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from proto.server.storage.ledger import UsageLedger
from sampler.tokens import Tokenizer

pytestmark = pytest.mark.process  # every test starts a server or a process

LONG = "Write at length.\n!tokens 5000 !say never"
TWO_TURNS = "Look first.\n!call grep {}\n!tokens 5000 !say never"
TOOLS = [{"type": "function", "name": "grep"}]
DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
TRACE = ("--progress-interval-s", "0.02")  # the crash trace a streaming turn leaves, every 20 ms
_tokenizer = Tokenizer()


def body(script: str, **fields: Any) -> dict[str, Any]:
    return {"model": SLOW_MODEL, "input": [{"role": "user", "content": script}], "tools": TOOLS, **fields}


def tokens_of(events: list[dict[str, Any]]) -> int:
    return sum(_tokenizer.count(e["delta"]) for e in events if e["type"] in DELTAS)


async def read_until(
    ws: ClientConnection, events: list[dict[str, Any]], stop: str | None = None, deltas: int = 0
) -> None:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), GUARD))
        events.append(event)
        if event["type"] == stop or (deltas and sum(e["type"] in DELTAS for e in events) >= deltas):
            return


async def drain(ws: ClientConnection, events: list[dict[str, Any]]) -> None:
    """Everything the dead server had written before it died (the kernel delivers it), to the close."""
    with contextlib.suppress(ConnectionClosed):
        while True:
            events.append(json.loads(await asyncio.wait_for(ws.recv(), GUARD)))


async def test_sigkill_then_restart_bills_or_marks_every_response_that_had_started(tmp_path: Path) -> None:
    db = tmp_path / "lab.db"
    streams: dict[str, list[dict[str, Any]]] = {}
    async with serve_process(db, *TRACE) as first:
        url = first.ws_url
        async with (
            httpx.AsyncClient(base_url=first.http_url, timeout=GUARD) as http,
            connect(url + "?protocol=longlived") as second_turn,
            connect(url + "?protocol=longlived") as suspended,
            connect(url) as ga,
            http.stream("POST", "/v1/responses", json=body(LONG, stream=True)) as sse,
        ):
            ended = (await http.post("/v1/responses", json=body("!say done", store=True))).json()
            assert ended["status"] == "completed"
            json_request = asyncio.create_task(http.post("/v1/responses", json=body(LONG)))
            for name, ws, script in (
                ("second_turn", second_turn, TWO_TURNS),
                ("suspended", suspended, TWO_TURNS),
                ("ga", ga, LONG),
            ):
                await ws.send(json.dumps({"type": "response.create", **body(script)}))
                streams[name] = []
                await read_until(
                    ws,
                    streams[name],
                    stop="response.done" if ws is not ga else None,
                    deltas=20 if ws is ga else 0,
                )
            call = streams["second_turn"][-1]["pending_calls"][0]
            await second_turn.send(
                json.dumps(
                    {
                        "type": "response.append",
                        "input": [
                            {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
                        ],
                    }
                )
            )
            await read_until(
                second_turn, streams["second_turn"], deltas=20 + tokens_of(streams["second_turn"])
            )
            streams["sse"] = []
            lines = sse.aiter_lines()
            await sse_read(lines, streams["sse"], deltas=20)
            # Every in-flight response's trace is durable, each with some progress (the suspended one: its
            # turn).
            for _ in range(500):
                traced = query(db, "SELECT response_id, output_tokens FROM open_responses")
                if len(traced) == 5 and all(output > 0 for _, output in traced):
                    break
                await asyncio.sleep(0.01)
            first.process.send_signal(signal.SIGKILL)
            assert await asyncio.wait_for(first.process.wait(), GUARD) == -signal.SIGKILL
            # the last durable figures
            proven = dict(query(db, "SELECT response_id, output_tokens FROM open_responses"))
            assert len(proven) == 5, proven
            for name, ws in (("second_turn", second_turn), ("suspended", suspended), ("ga", ga)):
                await drain(ws, streams[name])
            with contextlib.suppress(httpx.HTTPError):
                await sse_read(lines, streams["sse"])
            json_lost = await asyncio.gather(json_request, return_exceptions=True)
            assert isinstance(json_lost[0], httpx.HTTPError)  # the server died under it
    received = {events[0]["response"]["id"]: tokens_of(events) for events in streams.values()}

    async with serve_process(db, *TRACE) as second:  # the same file: reconciled before it serves
        async with httpx.AsyncClient(base_url=second.http_url, timeout=GUARD) as http:
            scraped = (await http.get("/metrics")).text
            assert "responses_lab_ledger_reconciled 5.0" in scraped
            assert (await http.post("/v1/responses", json=body("!say after", store=False))).json()[
                "status"
            ] == "completed"
            assert (
                await http.get(f"/v1/responses/{ended['id']}")
            ).status_code == 200  # the ended one was stored
        second.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.process.wait(), 30)
    rows = {
        r[0]: r[1:]
        for r in query(db, "SELECT response_id, status, reason, output_tokens, input_tokens FROM usage")
    }
    assert query(db, "SELECT count(*) FROM open_responses") == [(0,)]
    assert rows.pop(ended["id"])[:2] == ("completed", "")
    after = [rid for rid, (status, *_) in rows.items() if status == "completed"]
    assert len(after) == 1
    del rows[after[0]]
    assert set(proven) == set(rows)  # every response that had started: none silently lost, none twice
    assert set(received) <= set(rows)
    for response_id, (status, reason, output_tokens, input_tokens) in rows.items():
        assert (status, reason) == ("incomplete", "server_crashed") and input_tokens > 0
        assert output_tokens == proven[response_id]  # billed what the durable trace proves
        if response_id in received:  # ... which is never more than the client received
            assert output_tokens <= received[response_id], (response_id, output_tokens, received[response_id])


async def test_workers_reconcile_once_before_they_start_and_never_bill_a_live_siblings_response(
    tmp_path: Path,
) -> None:
    db = tmp_path / "lab.db"
    dead = UsageLedger(str(db))  # a process that died with a response open: its open row stays behind
    dead.start()
    dead.started("resp_dead", "anonymous", SLOW_MODEL, "longlived", 1e9)
    dead.progress("resp_dead", 40, 0, 7, 1)
    dead.close()
    async with serve_process(db, "--workers", "2", "--shutdown-grace-s", "1", *TRACE) as server:
        url = server.ws_url + "?protocol=longlived"
        sockets = [await connect(url) for _ in range(4)]  # spread over both workers, one started maybe later
        try:
            ids = []
            for ws in sockets:
                await ws.send(json.dumps({"type": "response.create", **body(LONG)}))
                events: list[dict[str, Any]] = []
                await read_until(ws, events, deltas=5)
                ids.append(events[0]["response"]["id"])
            for _ in range(300):  # both workers have started (each answers /healthz once it serves)
                traced = dict(query(db, "SELECT response_id, output_tokens FROM open_responses"))
                if all(traced.get(i, 0) > 0 for i in ids):
                    break
                await asyncio.sleep(0.01)
            assert query(db, "SELECT response_id, status, reason, output_tokens FROM usage") == [
                ("resp_dead", "incomplete", "server_crashed", 7)
            ]
            # live ones left alone
            assert set(ids) <= set(dict(query(db, "SELECT response_id, owner FROM open_responses")))
        finally:
            for ws in sockets:
                ws.transport.abort()  # the clients just go: their responses are cut and billed
        server.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(server.process.wait(), 30)
    billed = dict(query(db, "SELECT response_id, status FROM usage"))
    assert billed == {"resp_dead": "incomplete", **dict.fromkeys(ids, "cancelled")}  # each once
