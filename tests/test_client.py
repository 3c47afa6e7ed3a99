"""The client library (proto/client) by itself: the messages it builds (the exact bytes, and that the
server's own decoder takes them), the SSE parser on bodies split anywhere, and a round trip of each client
against a real server on loopback with the observer watching every frame."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import httpx
import pytest
from helpers import MODEL, TOOLS, TWO_CALLS
from hypothesis import given
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from proto.client import messages
from proto.client.errors import HttpStatusError, ProtocolFailure
from proto.client.frames import RECEIVED, SENT, Frame, encode, http_request_bytes, ws_frame_bytes
from proto.client.ga import GaClient
from proto.client.http import HttpClient
from proto.client.longlived import LongLivedClient, longlived_url
from proto.client.sse import SseEvent, SseParser
from proto.core.codec import decode_body, decode_client_event
from proto.core.events import TERMINAL_TYPES, ResponseAppend, ResponseCancel, ResponseCreate, ResponseInject
from proto.server.serve import ThreadedServer


# ------------------------------------------------------------------------------------------- messages
def test_each_message_has_the_wire_key_order() -> None:
    base = messages.body(MODEL, [messages.user_message("hi")], tools=TOOLS, store=False)
    assert list(base) == ["model", "input", "tools", "store"]
    assert encode(messages.create(base)).startswith(
        b'{"type":"response.create","model":"mock-4000tps","input":[{"role":"user","content":"hi"}]'
    )
    chained = messages.continuation(base, [messages.function_call_output("call_1", "ok")], "resp_1")
    assert list(chained) == ["model", "input", "tools", "store", "previous_response_id"]
    assert chained["input"] == [{"type": "function_call_output", "call_id": "call_1", "output": "ok"}]
    assert list(messages.streaming(base)) == [*base, "stream"]
    assert list(messages.streaming(dict(base, stream=False))) == [*base, "stream"]
    assert encode(messages.append([{"type": "function_call_output", "call_id": "c", "output": "o"}])) == (
        b'{"type":"response.append","input":[{"type":"function_call_output","call_id":"c","output":"o"}]}'
    )
    assert messages.append([], response_id="resp_1") == {
        "type": "response.append",
        "input": [],
        "response_id": "resp_1",
    }
    assert messages.cancel() == {"type": "response.cancel"}
    assert messages.cancel("resp_1") == {"type": "response.cancel", "response_id": "resp_1"}
    assert messages.inject("resp_1", [], event_id="e1") == {
        "type": "response.inject",
        "response_id": "resp_1",
        "input": [],
        "event_id": "e1",
    }
    assert messages.body(MODEL, "just text") == {"model": MODEL, "input": "just text"}


def test_the_server_decodes_every_message_the_client_builds() -> None:
    base = messages.body(MODEL, [messages.user_message("hi")], tools=TOOLS)
    outputs = messages.outputs([{"call_id": "call_1"}, {"call_id": "call_2"}], "done")
    assert isinstance(decode_client_event(encode(messages.create(base))), ResponseCreate)
    appended = decode_client_event(encode(messages.append(outputs, response_id="resp_1")))
    assert (
        isinstance(appended, ResponseAppend) and appended.response_id == "resp_1" and len(appended.input) == 2
    )
    assert isinstance(decode_client_event(encode(messages.inject("resp_1", outputs))), ResponseInject)
    assert isinstance(decode_client_event(encode(messages.cancel("resp_1"))), ResponseCancel)
    chained = decode_body(encode(messages.streaming(messages.continuation(base, outputs, "resp_1"))))
    assert chained.previous_response_id == "resp_1" and chained.stream is True


def test_reading_a_response() -> None:
    response = {"output": [
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "x"}]},
        {"type": "function_call", "call_id": "call_1", "name": "grep", "arguments": "{}"},
    ]}  # fmt: skip
    assert [c["call_id"] for c in messages.function_calls(response)] == ["call_1"]
    assert messages.as_input(response["output"][0]) == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "x"}],
    }
    assert messages.as_input(response["output"][1]) is response["output"][1]


def test_wire_costs() -> None:
    assert ws_frame_bytes(b"x" * 125) == 131 and ws_frame_bytes(126) == 134 and ws_frame_bytes(65536) == 65550
    request = httpx.Request("POST", "http://h/v1/responses", headers={"a": "b"}, content=b"{}")
    raw = (
        b"POST /v1/responses HTTP/1.1\r\n"
        + b"".join(k + b": " + v + b"\r\n" for k, v in request.headers.raw)
        + b"\r\n{}"
    )
    assert http_request_bytes(request, 2) == len(raw)


def test_longlived_url() -> None:
    assert longlived_url("ws://h/v1/responses") == "ws://h/v1/responses?protocol=longlived"
    assert longlived_url("ws://h/v1/responses?x=1") == "ws://h/v1/responses?x=1&protocol=longlived"
    assert longlived_url("ws://h/v1/responses?protocol=longlived") == "ws://h/v1/responses?protocol=longlived"


# ------------------------------------------------------------------------------------------- SSE
def feed_all(chunks: list[bytes]) -> list[SseEvent]:
    parser = SseParser()
    return [event for chunk in chunks for event in parser.feed(chunk)]


def test_sse_rules() -> None:
    body = (
        b"\xef\xbb\xbf: a comment\r\n"
        b'event: response.created\r\ndata: {"a":1}\r\n\r\n'  # CRLF
        b"data: one\rdata:two\r\r"  # CR; no space after the colon
        b"id: 7\nevent: x\ndata\n\n"  # a field without a colon: empty data
        b"event: nothing\n\n"  # no data: not dispatched
        b"data: left open"  # unterminated at the end: discarded
    )
    expected = [
        SseEvent("response.created", '{"a":1}'),
        SseEvent("message", "one\ntwo"),
        SseEvent("x", "", "7"),
    ]
    assert feed_all([body]) == expected
    assert feed_all([body[i : i + 1] for i in range(len(body))]) == expected
    assert feed_all([b"data: a\r", b"", b"\ndata: b\n\n"]) == [
        SseEvent("message", "a\nb")
    ]  # CRLF split by an empty chunk


_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20)


@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["", "response.output_text.delta", "error"]),
            st.lists(_text, min_size=1, max_size=3),
        ),
        max_size=6,
    ),
    ending=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_sse_parser_is_indifferent_to_where_the_body_splits(
    events: list[tuple[str, list[str]]], ending: bytes, cuts: list[int]
) -> None:
    body = b""
    for name, lines in events:
        if name:
            body += b"event: " + name.encode() + ending
        body += b"".join(b"data: " + line.encode() + ending for line in lines) + ending
    points = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    chunks = [body[a:b] for a, b in itertools.pairwise(points)]
    expected = [SseEvent(name or "message", "\n".join(lines)) for name, lines in events]
    assert feed_all(chunks) == expected == feed_all([body])


# ------------------------------------------------------------------------------------------- on loopback
class Recorder:
    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def __call__(self, frame: Frame) -> None:
        self.frames.append(frame)

    def sent(self) -> list[Frame]:
        return [f for f in self.frames if f.direction == SENT]

    def received(self) -> list[str]:
        return [f.type for f in self.frames if f.direction == RECEIVED]


async def test_http_client_streams_and_posts(server: ThreadedServer) -> None:
    seen = Recorder()
    base = messages.body(MODEL, [messages.user_message(TWO_CALLS)], tools=TOOLS)
    async with HttpClient(server.http_url, observer=seen) as client:
        first = await client.create(base)
        assert first["status"] == "completed" and len(messages.function_calls(first)) == 2
        [sent] = seen.sent()
        assert sent.event["stream"] is True and sent.wire_bytes > len(encode(sent.event))
        received = seen.received()
        assert (
            received[0] == "response.created"
            and received[-1] == "response.completed"
            and "response.output_item.done" in received
        )
        assert [f.t for f in seen.frames] == sorted(f.t for f in seen.frames)
        reply = await client.post(
            messages.continuation(base, messages.outputs(messages.function_calls(first)), first["id"])
        )
        assert reply.status_code == 200 and reply.json()["status"] == "completed"
        with pytest.raises(HttpStatusError) as refused:
            await client.create(messages.body("no-such-model", "hi"))
        assert refused.value.status == 404  # model_not_found


async def test_http_client_keeps_one_connection_across_turns(server: ThreadedServer) -> None:
    """Each streamed turn is read to the body's end, so the next request reuses the connection (the lab's
    HTTP modes are measured on one keep-alive connection, as an SDK client runs): one TCP connect for
    three turns, counted by httpcore's own trace."""
    connects: list[str] = []

    async def trace(name: str, info: Any) -> None:
        if name == "connection.connect_tcp.started":
            connects.append(name)

    base = messages.body(MODEL, [messages.user_message(TWO_CALLS)], tools=TOOLS)
    async with HttpClient(server.http_url) as client:
        build = client._request

        def traced(body: Any, *rest: Any) -> httpx.Request:
            request = build(body, *rest)
            request.extensions["trace"] = trace
            return request

        client._request = traced  # type: ignore[method-assign]
        previous = None
        for _ in range(3):
            body = (
                base
                if previous is None
                else messages.continuation(
                    base, messages.outputs(messages.function_calls(previous)), previous["id"]
                )
            )
            previous = await client.create(body)
            assert previous["status"] == "completed"
    assert connects == ["connection.connect_tcp.started"]


async def test_http_client_sends_again_when_an_idle_connection_was_closed(server: ThreadedServer) -> None:
    """A server closes an idle keep-alive connection as the next request goes out (uvicorn's keep-alive
    timeout racing an agent's tool time): a proxy in front of the real server drops the first connection at
    the second request's first bytes. The client sends it again on a new connection: both turns complete,
    the second chained to the first, and the observer sees one send a call."""
    upstream = httpx.URL(server.http_url)
    connections: list[int] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drop_at: int | None) -> None:
        posts = 0
        while chunk := await reader.read(65536):
            posts += chunk.count(b"POST /v1/responses")
            if drop_at is not None and posts >= drop_at:
                return  # the request is not forwarded: the connection closes under it
            writer.write(chunk)
            await writer.drain()

    handlers: set[asyncio.Task[Any]] = set()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        connections.append(len(connections))
        first = len(connections) == 1
        server_r, server_w = await asyncio.open_connection(upstream.host, upstream.port)
        up = asyncio.create_task(pipe(client_r, server_w, 2 if first else None))
        down = asyncio.create_task(pipe(server_r, client_w, None))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        await asyncio.wait([up, down])
        for w in (client_w, server_w):
            w.close()
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()

    proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    base = messages.body(MODEL, [messages.user_message(TWO_CALLS)], tools=TOOLS)
    seen = Recorder()
    try:
        async with HttpClient(f"http://127.0.0.1:{port}", observer=seen) as client:
            first = await client.create(base)
            second = await client.create(
                messages.continuation(base, messages.outputs(messages.function_calls(first)), first["id"])
            )
    finally:
        proxy.close()
        await proxy.wait_closed()
        await asyncio.wait(handlers)  # the client has closed: every pipe has ended
    assert first["status"] == second["status"] == "completed"
    assert second["previous_response_id"] == first["id"]
    assert len(connections) == 2  # the dropped one, and the one the request was sent again on
    # one call, one send for the observer (the lab counts a client turn per send): the first one's time
    assert len(seen.sent()) == 2 and seen.received().count("response.completed") == 2


async def test_http_client_reads_past_a_done_sentinel() -> None:
    """vLLM-style servers (agentic-api, in front of this one) end a stream with ``data: [DONE]`` after the
    terminal event, as Chat Completions streams do; the client reads the body to its end and skips it, as
    the openai SDK's stream does."""
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    body = (
        b'event: response.completed\ndata: {"type":"response.completed","response":'
        + encode(response)
        + b"}\n\ndata: [DONE]\n\n"
    )
    async with HttpClient("http://upstream.test") as client:
        client.http = httpx.AsyncClient(
            transport=httpx.MockTransport(lambda request: httpx.Response(200, content=body))
        )
        done = await client.create(messages.body(MODEL, "hi"))
    assert done == response


async def test_ga_client_chains_and_survives_a_refusal(server: ThreadedServer) -> None:
    seen = Recorder()
    base = messages.body(MODEL, [messages.user_message(TWO_CALLS)], tools=TOOLS, store=False)
    async with GaClient(server.url, observer=seen, ping_interval=None) as client:
        with pytest.raises(ProtocolFailure) as refused:
            await client.create(messages.body("no-such-model", "hi"))
        assert refused.value.error["code"] == "model_not_found"
        first = await client.create(base)
        second = await client.create(
            messages.continuation(base, messages.outputs(messages.function_calls(first)), first["id"])
        )
        assert second["status"] == "completed" and second["output"][-1]["type"] == "message"
    sent = seen.sent()
    assert [f.type for f in sent] == ["response.create"] * 3
    assert [f.wire_bytes for f in sent] == [ws_frame_bytes(encode(f.event)) for f in sent]
    assert sum(len(encode(f.event)) for f in sent) == client.bytes_sent
    assert seen.received().count("response.completed") == 2


async def test_longlived_client_rollout_and_raw_frames(server: ThreadedServer) -> None:
    seen = Recorder()
    calls: list[dict[str, Any]] = []

    async def tool(args: dict[str, Any]) -> str:
        calls.append(args)
        return "ok"

    request = messages.body(MODEL, [messages.user_message(TWO_CALLS)], tools=TOOLS)
    async with LongLivedClient(server.url, observer=seen) as client:
        result = await client.rollout(request, {"grep": tool, "read_file": tool})
        assert result.response["status"] == "completed" and result.appends == 1 and len(calls) == 2
        assert [f.type for f in seen.sent()] == ["response.create", "response.append"]
        assert result.bytes_sent == sum(len(encode(f.event)) for f in seen.sent())
        assert seen.received()[-1] in TERMINAL_TYPES and "response.done" in seen.received()
        # No open response: a cancel is refused with an error event, read with recv.
        await client.send(messages.cancel())
        refused = await client.recv(timeout=10)
        assert refused.type == "error" and refused.data["error"]["code"] == "response_already_completed"
    with pytest.raises(RuntimeError):
        _ = client.ws
    closed = LongLivedClient(server.url)
    await closed.connect()
    await closed.ws.close()
    with pytest.raises(ConnectionClosed):
        await closed.recv()
