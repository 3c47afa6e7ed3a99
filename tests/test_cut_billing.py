"""A response cut short is billed for what it delivered (docs/operations.md, "Billing guarantees"), on every
transport.

Before, only finished turns were billed: 3 858 tokens streamed, then ``response.cancel`` → ``usage 0/0`` in
the
terminal event and the ledger. Now the turn in progress books its prompt (once its prefill started) and the
output tokens already handed to the transport, before the terminal event is made.

What each test can know from the client's side:

* a long-lived ``response.cancel``: every frame the server framed before the cancel reaches the client before
  the terminal event (the outbox is FIFO), so the bill equals the tokens the client counted, exactly;
* a disconnect: the client cannot read what was in flight when it left, so the bill is at least what it
  counted (never a free stream) and covers the prompt, exactly;
* a slow reader: what the server discarded once it gave up on the reader is bounded by two send queues and
  one emit chunk (``Outbox`` policy, ``sampler.loop.EMIT_CHUNK``);
* a shutdown: every stream (WebSocket, SSE) writes everything framed before it says why it ends
  (``server_shutting_down``), so the bill is exact again; a JSON reply is that error, with a 503.

Tokens are counted client-side by tokenizing each delta (the mock's filler words are one token each with
their leading space: ``sampler.tokens.Tokenizer.model_tokens``).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import (
    GUARD,
    MODEL,
    SLOW_MODEL,
    query,
    running,
    serve_process,
    server_tasks,
    sse_read,
    state,
    wait_for,
)
from test_faults import RawClient
from virtual import virtual
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from proto.core.events import TERMINAL_TYPES
from proto.server.serve import ThreadedServer
from proto.server.storage.ledger import LedgerRow
from sampler.loop import EMIT_CHUNK
from sampler.tokens import Tokenizer

pytestmark = pytest.mark.process  # every test starts a server or a process

LONG = "Write at length.\n!tokens 5000 !say never"  # 77 s at 65 tokens/s: always cut
TWO_TURNS = "Look first.\n!call grep {}\n!tokens 5000 !say never"
TOOLS = [{"type": "function", "name": "grep"}]
DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
ONE_SECOND = 65  # deltas: one second of SLOW_MODEL's stream
_tokenizer = Tokenizer()


def body(script: str = LONG, model: str = SLOW_MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "input": [{"role": "user", "content": script}], "tools": TOOLS, **fields}


def tokens_of(events: list[dict[str, Any]]) -> int:
    """The output tokens these events carried, counted the client's way."""
    return sum(_tokenizer.count(event["delta"]) for event in events if event["type"] in DELTAS)


async def read(
    ws: ClientConnection, events: list[dict[str, Any]], until: frozenset[str] | None = None, deltas: int = 0
) -> None:
    """Append frames to ``events`` until one of ``until`` arrives, or until ``deltas`` deltas were seen."""
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), GUARD))
        events.append(event)
        if (until and event["type"] in until | {"error"}) or (
            deltas and sum(e["type"] in DELTAS for e in events) >= deltas
        ):
            return


async def prompt_tokens(srv: ThreadedServer, payload: dict[str, Any]) -> int:
    """The prompt the server bills for this input, from an uncut reference request (at most 16 tokens of
    output)."""
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
        reply = await http.post("/v1/responses", json={**payload, "max_output_tokens": 16, "store": False})
    usage: dict[str, int] = reply.json()["usage"]
    return usage["input_tokens"]


def row(srv: ThreadedServer, response_id: str) -> LedgerRow:
    ledger = state(srv).pipeline.ledger
    ledger.flush()
    found = ledger.get(response_id)
    assert found is not None, f"no ledger row for {response_id}"
    return found


async def settled(srv: ThreadedServer) -> None:
    """Nothing of the cut response is left: its task, the GPU slot, the KV pins of its turn."""
    server = state(srv)

    def busy() -> list[str]:
        return [n for n in server_tasks(srv) if n.startswith(("response-", "sse-", "http-response"))]

    await wait_for(lambda: not busy(), "the response's task ended")
    await wait_for(
        lambda: all(gpu.slots.running == 0 for gpu in server.pipeline.engines.gpus.values()),
        "every GPU slot free",
    )


# ----------------------------------------------------------------------------------------- cancel


async def test_a_cancel_after_a_second_of_stream_bills_exactly_what_the_client_received() -> None:
    with running() as srv:
        async with connect(srv.url + "?protocol=longlived") as ws:
            await ws.send(json.dumps({"type": "response.create", **body(TWO_TURNS)}))
            events: list[dict[str, Any]] = []
            await read(ws, events, until=frozenset({"response.done"}))
            call = events[-1]["pending_calls"][0]
            output = {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": "src/a.py:1: match",
            }
            await ws.send(json.dumps({"type": "response.append", "input": [output]}))
            first_turn = len(events)
            await read(ws, events, deltas=ONE_SECOND + tokens_of(events))  # a second into the second turn
            await ws.send(json.dumps({"type": "response.cancel"}))
            await read(ws, events, until=TERMINAL_TYPES)
        terminal = events[-1]
        assert terminal["type"] == "response.incomplete" and terminal["response"]["status"] == "cancelled", (
            terminal
        )
        received = tokens_of(events)
        usage, turns = (
            terminal["response"]["lab"]["usage_total"],
            terminal["response"]["lab"]["turns"],
        )  # the total (the event's own usage is since the last response.done)
        assert usage["output_tokens"] == received  # exactly: every framed delta reached the client first
        assert len(turns) == 2 and turns[1]["output_tokens"] == tokens_of(events[first_turn:]) >= ONE_SECOND
        # The cut turn's prompt is billed, the same prompt an uncut request over HTTP pays for that history.
        fn_call = next(e["item"] for e in events if e["type"] == "response.output_item.done")
        history = [{"role": "user", "content": TWO_TURNS}, fn_call, output]
        assert turns[1]["prompt_tokens"] == await prompt_tokens(srv, body(TWO_TURNS) | {"input": history})
        assert usage["input_tokens"] == turns[0]["prompt_tokens"] + turns[1]["prompt_tokens"]
        billed = row(srv, terminal["response"]["id"])
        assert (billed.status, billed.reason) == ("cancelled", "cancelled")
        assert (billed.input_tokens, billed.cached_tokens, billed.output_tokens, billed.turns) == (
            usage["input_tokens"],
            usage["input_tokens_details"]["cached_tokens"],
            received,
            2,
        )
        await settled(srv)


# ----------------------------------------------------------------------------------------- disconnect


async def _stream_then_leave(srv: ThreadedServer, transport: str) -> tuple[str | None, int]:
    """Stream a second of LONG over ``transport``, then drop the connection: (response id, tokens received).
    A JSON client receives nothing before it leaves (its reply is the whole Response): it leaves once the
    crash trace shows a second of output was generated."""
    if transport in ("longlived", "ga"):
        url = srv.url + ("?protocol=longlived" if transport == "longlived" else "")
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "response.create", **body()}))
            events: list[dict[str, Any]] = []
            await read(ws, events, deltas=ONE_SECOND)
            ws.transport.abort()  # the TCP connection just drops
        return events[0]["response"]["id"], tokens_of(events)
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
        if transport == "sse":
            async with http.stream("POST", "/v1/responses", json=body(stream=True)) as reply:
                events = []
                await sse_read(reply.aiter_lines(), events, deltas=ONE_SECOND)
            return events[0]["response"]["id"], tokens_of(events)
        request = asyncio.create_task(http.post("/v1/responses", json=body()))
        ledger = state(srv).pipeline.ledger

        def a_second_generated() -> bool:
            ledger.flush()
            return any(o.output_tokens >= ONE_SECOND for o in ledger.open_responses())

        await wait_for(a_second_generated, "the JSON response generated a second of output")
        request.cancel()  # the client gives up: httpx closes the connection
        with pytest.raises(asyncio.CancelledError):
            await request
        return None, 0


@pytest.mark.parametrize("transport", ["longlived", "ga", "sse", "json"])
async def test_a_client_that_disconnects_mid_stream_pays_for_the_prompt_and_at_least_what_it_received(
    transport: str,
) -> None:
    with running(progress_interval_s=0.02) as srv:
        prompt = await prompt_tokens(srv, body())
        response_id, received = await _stream_then_leave(srv, transport)
        await settled(srv)  # the GPU slot was given back at once, not after the 77 s of output
        ledger = state(srv).pipeline.ledger
        ledger.flush()
        [billed] = [r for r in ledger.rows() if r.status == "cancelled"]  # the other: the reference request
        assert response_id in (None, billed.response_id)
        assert (billed.reason, billed.turns) == ("cancelled", 1)
        assert billed.input_tokens == prompt
        assert max(received, ONE_SECOND) <= billed.output_tokens < 5000, (received, billed)
        assert ledger.open_responses() == []  # the crash trace is gone with the final row


# ----------------------------------------------------------------------------------------- slow reader


@pytest.mark.parametrize("protocol", ["longlived", "ga"])
async def test_a_slow_reader_pays_for_what_it_was_sent_within_the_queue_bound(protocol: str) -> None:
    queue = 32
    model = f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0,max-output-tokens=200000"
    async with virtual(send_queue=queue, send_timeout_s=1.0, model_override=[model]) as virtual_server:
        srv = virtual_server.server
        server = state(srv)
        target = "/v1/responses" + ("?protocol=longlived" if protocol == "longlived" else "")
        client = RawClient(srv.settings.host, srv.settings.port, target)
        # never read
        client.send_text(json.dumps({"type": "response.create", **body("!tokens 200000 !say never", MODEL)}))
        await wait_for(lambda: bool(server.connections), "the session started")
        session = next(iter(server.connections))
        await wait_for(lambda: session.out.qsize() >= queue, "the send queue filled: the sampler waits")
        await virtual_server.advance_until(
            1.0, lambda: session.stopping is not None, "the slow reader was given up on"
        )
        texts = await asyncio.to_thread(read_texts, client)
        client.sock.close()
        await wait_for(lambda: not server.connections, "the session ended")
        received = tokens_of([json.loads(text) for text in texts])
        server.pipeline.ledger.flush()
        [billed] = server.pipeline.ledger.rows()
        assert (billed.status, billed.reason) == ("cancelled", "cancelled")
        # Never free; and what was framed but never written is what the policy discards: the queue and the
        # writer's batch when it gave up, plus the emit chunk the cut interrupted.
        assert received <= billed.output_tokens <= received + 2 * queue + EMIT_CHUNK, (
            received,
            billed.output_tokens,
        )


def read_texts(client: RawClient) -> list[str]:
    """Every text frame the server still sends, up to its close."""
    import wsproto.events as wse

    texts: list[str] = []
    partial = ""
    while True:
        for event in client.read_events():
            if isinstance(event, wse.CloseConnection):
                return texts
            if isinstance(event, wse.TextMessage):
                partial += event.data
                if event.message_finished:
                    texts.append(partial)
                    partial = ""
        if client.conn.state.name == "CLOSED":
            return texts


# ----------------------------------------------------------------------------------------- shutdown


async def test_sigterm_bills_every_cut_response_for_what_it_delivered(tmp_path: Path) -> None:
    db = tmp_path / "lab.db"
    received: dict[str, int] = {}
    async with serve_process(db, "--shutdown-grace-s", "1", "--progress-interval-s", "0.02") as served:
        async with httpx.AsyncClient(base_url=served.http_url, timeout=GUARD) as http:
            json_reply = asyncio.create_task(http.post("/v1/responses", json=body()))
            url = served.ws_url
            async with (
                connect(url + "?protocol=longlived") as longlived,
                connect(url) as ga,
                http.stream("POST", "/v1/responses", json=body(stream=True)) as sse,
            ):
                sockets: dict[str, ClientConnection] = {"longlived": longlived, "ga": ga}
                streams: dict[str, list[dict[str, Any]]] = {name: [] for name in ("longlived", "ga", "sse")}
                for name, ws in sockets.items():
                    await ws.send(json.dumps({"type": "response.create", **body()}))
                    await read(ws, streams[name], deltas=10)
                lines = sse.aiter_lines()
                await sse_read(lines, streams["sse"], deltas=10)
                for _ in range(500):  # the JSON response generated too (its trace says so): bounded poll
                    if (
                        len([n for (n,) in query(db, "SELECT output_tokens FROM open_responses") if n >= 10])
                        == 4
                    ):
                        break
                    await asyncio.sleep(0.01)
                served.process.send_signal(signal.SIGTERM)
                for name, ws in sockets.items():
                    await read(ws, streams[name], until=frozenset({"error"}))
                    assert streams[name][-1]["error"]["code"] == "server_shutting_down"
                    with pytest.raises(ConnectionClosed):
                        await asyncio.wait_for(ws.recv(), GUARD)
                await sse_read(lines, streams["sse"])  # the stream is cut too, and says why before it ends
                assert (
                    streams["sse"][-1]["type"] == "error"
                    and streams["sse"][-1]["error"]["code"] == "server_shutting_down"
                )
                for events in streams.values():
                    received[events[0]["response"]["id"]] = tokens_of(events)
            reply = await json_reply  # the JSON reply had sent nothing: the typed error body
            assert reply.status_code == 503 and reply.json()["error"]["code"] == "server_shutting_down", (
                reply.text
            )
        assert await asyncio.wait_for(served.process.wait(), 30) in (0, -signal.SIGTERM)
    rows = {
        r[0]: r[1:]
        for r in query(db, "SELECT response_id, mode, status, reason, output_tokens, input_tokens FROM usage")
    }
    assert (
        query(db, "SELECT count(*) FROM open_responses") == [(0,)]
        and len(rows) == 4
        and set(received) <= set(rows)
    )
    for response_id, (mode, status, reason, output_tokens, input_tokens) in rows.items():
        assert (status, reason) == ("cancelled", "cancelled") and input_tokens > 0, rows[response_id]
        if response_id in received:  # every stream writes all it framed before it says why it ends: exact
            assert output_tokens == received[response_id], (mode, output_tokens, received[response_id])
        else:  # JSON: nothing reached the client; what it generated, at least what its trace had shown
            assert mode == "http" and output_tokens >= 10
