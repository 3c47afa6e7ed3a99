"""The lab's four clients: one rollout of a :class:`RolloutPlan` over each transport, as a :class:`Trace`.

All four do what a real agent client does on that wire, and nothing more:

* ``http`` — ``POST /v1/responses`` (SSE); the client keeps the conversation and re-sends all of it, with
  the tools, every turn (as Chat Completions-style clients and the Agents SDK without chaining do).
* ``http-prev`` — the same with ``previous_response_id`` and only the new items (tools re-sent: OpenAI does
  not carry them over a chain).
* ``ws`` — GA WebSocket mode: a flat ``response.create`` per turn on one connection, chained with
  ``previous_response_id`` + the new items.
* ``longlived`` — one ``response.create``, then one ``response.append`` of the outputs per suspension.

``reconnect=K`` (``ws`` only): every K turns the client closes its connection and opens one to the next of
its servers (two servers sharing a database: ``--db``), as a client whose socket dropped lands elsewhere;
that turn misses the connection's cache and is served from the store. The reconnect is marked
(``RECONNECT``) just before the turn's send, outside its TTFT (the handshake is in E2E, as a user sees it):
``metrics.store_vs_cached`` splits the turns by it. HTTP turns are one request each whatever the server
(``http-prev`` reads the store every turn), and a long-lived response ends with its connection, so the
knob is the GA WebSocket mode's.

The client "runs" a turn's tools by sleeping the workload's recorded tool time once (parallel calls
overlap), then answers with pre-generated outputs of the recorded size. Connections are opened by
``open()`` before a rollout starts (a session keeps its connection, as agents do), so E2E holds no
handshake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import msgspec
from websockets.asyncio.client import ClientConnection, connect

from proto.lab.metrics import RECONNECT, SEND, TERMINAL, Mark, Trace
from proto.lab.plan import RolloutPlan, TurnSend
from proto.response import MODES

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class LabClientError(RuntimeError):
    """The server refused or broke a rollout (an ``error`` event, an HTTP error status, a closed socket)."""


class Transport(Protocol):
    mode: str
    on_send: Callable[[], None] | None

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def rollout(self, plan: RolloutPlan) -> Trace: ...


def ws_frame_bytes(payload: bytes) -> int:
    """What a client-to-server frame costs on the wire: header (2/4/10 bytes), mask (4), payload."""
    n = len(payload)
    return n + 4 + (2 if n < 126 else 4 if n < 65536 else 10)


def function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response.get("output", []) if item.get("type") == "function_call"]


def answer(calls: list[dict[str, Any]], send: TurnSend) -> list[dict[str, Any]]:
    """Pair turn k's calls with its pre-generated outputs, in call order."""
    if len(calls) != len(send.outputs):
        raise LabClientError(f"the model made {len(calls)} calls, the workload recorded {len(send.outputs)}")
    return [{"type": "function_call_output", "call_id": c["call_id"], "output": out} for c, out in zip(calls, send.outputs, strict=True)]


def _answers_for(plan: RolloutPlan, turn: int) -> TurnSend:
    if turn >= len(plan.answers):
        raise LabClientError(f"the model called tools at turn {turn}; the workload has {len(plan.answers)} tool turns")
    return plan.answers[turn]


class _Client:
    mode = ""
    on_send: Callable[[], None] | None = None  # the runner's progress hook, called at every send

    def _sent(self, trace: Trace) -> None:
        trace.marks.append(Mark(asyncio.get_running_loop().time(), SEND))
        if self.on_send is not None:
            self.on_send()


class _ChainedClient(_Client):
    """The request/response transports: each turn is one response that ends at the model's calls."""

    async def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        raise NotImplementedError

    async def rollout(self, plan: RolloutPlan) -> Trace:
        trace = Trace(self.mode)
        base = plan.request()
        history: list[Any] = list(base["input"])
        new_items: list[Any] = history
        previous: str | None = None
        turn = 0
        while True:
            body = dict(base, input=new_items)
            if self.mode == "http":
                body["input"] = history
            elif previous is not None:
                body["previous_response_id"] = previous
            response = await self.exchange(body, trace)
            trace.add_response(response)
            calls = function_calls(response)
            if response.get("status") != "completed" or not calls:
                return trace
            send = _answers_for(plan, turn)
            trace.tool_wait_s += send.tool_wait_s
            await asyncio.sleep(send.tool_wait_s)
            new_items = answer(calls, send)
            history = [*history, *response["output"], *new_items]
            previous = response["id"]
            turn += 1


class HttpClient(_ChainedClient):
    """``http`` (full history) or ``http-prev`` (``previous_response_id``) over SSE, on one keep-alive
    connection (httpx's pool, HTTP/1.1)."""

    def __init__(self, http_url: str, chained: bool, api_key: str | None = None) -> None:
        self.mode = "http-prev" if chained else "http"
        self._url = http_url.rstrip("/") + "/v1/responses"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=1))

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        await self._client.aclose()

    async def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        content = _encode(dict(body, stream=True))
        request = self._client.build_request("POST", self._url, content=content, headers={"content-type": "application/json"})
        trace.bytes_sent += _http_request_bytes(request, len(content))
        self._sent(trace)
        response = await self._client.send(request, stream=True)
        try:
            if response.status_code != 200:
                await response.aread()
                raise LabClientError(f"{self.mode}: HTTP {response.status_code}: {response.text[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                t = asyncio.get_running_loop().time()
                event = _decode(line[5:])
                kind = event.get("type", "")
                trace.marks.append(Mark(t, kind))
                if kind == "error":
                    raise LabClientError(f"{self.mode}: {event.get('error')}")
                if kind in TERMINAL:
                    return dict(event["response"])
        finally:
            await response.aclose()
        raise LabClientError(f"{self.mode}: the stream ended without a terminal event")


def _http_request_bytes(request: httpx.Request, body: int) -> int:
    line = len(request.method) + len(request.url.raw_path) + len(" HTTP/1.1\r\n") + 1
    headers = sum(len(k) + len(v) + 4 for k, v in request.headers.raw)
    return line + headers + 2 + body


class _WebSocketClient(_Client):
    def __init__(self, url: str, api_key: str | None) -> None:
        self._url = url
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._ws: ClientConnection | None = None

    async def open(self) -> None:
        self._ws = await connect(self._url, additional_headers=self._headers, max_size=2**26, compression=None, ping_interval=None)

    async def reconnect(self, url: str, trace: Trace) -> None:
        """Drop this connection and open one to ``url`` (marked in the trace, before the next send)."""
        await self.close()
        self._url = url
        await self.open()
        trace.marks.append(Mark(asyncio.get_running_loop().time(), RECONNECT))

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    async def send(self, event: dict[str, Any], trace: Trace) -> None:
        assert self._ws is not None, "open() first"
        data = _encode(event)
        trace.bytes_sent += ws_frame_bytes(data)
        self._sent(trace)
        await self._ws.send(data.decode())

    async def recv(self, trace: Trace) -> dict[str, Any]:
        assert self._ws is not None, "open() first"
        raw = await self._ws.recv()
        t = asyncio.get_running_loop().time()
        event: dict[str, Any] = _decode(raw)
        kind = event.get("type", "")
        trace.marks.append(Mark(t, kind))
        if kind == "error":
            raise LabClientError(f"{self.mode}: {event.get('error')}")
        return event


class GaWebSocketClient(_WebSocketClient, _ChainedClient):
    """GA WebSocket mode: one connection, a flat ``response.create`` per turn; with ``reconnect=K`` and
    several ``urls``, a new connection to the next one every K turns."""

    mode = "ws"

    def __init__(self, url: str, api_key: str | None, reconnect: int = 0, others: tuple[str, ...] = ()) -> None:
        super().__init__(url, api_key)
        self._urls = (url, *others)
        self._reconnect = reconnect
        self._turn = 0  # of the rollout in progress: 0 is its first send
        self._hops = 0  # reconnects so far: each goes to the next server

    async def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        self._turn = self._turn + 1 if "previous_response_id" in body else 0
        if self._reconnect and self._turn and self._turn % self._reconnect == 0:
            self._hops += 1
            await self.reconnect(self._urls[self._hops % len(self._urls)], trace)
        await self.send({"type": "response.create", **body}, trace)
        while True:
            event = await self.recv(trace)
            if event.get("type") in TERMINAL:
                return dict(event["response"])


class LongLivedLabClient(_WebSocketClient):
    """The prototype: one response for the whole rollout; outputs go back with ``response.append``."""

    mode = "longlived"

    def __init__(self, url: str, api_key: str | None = None) -> None:
        sep = "&" if "?" in url else "?"
        super().__init__(f"{url}{sep}protocol=longlived", api_key)

    async def rollout(self, plan: RolloutPlan) -> Trace:
        trace = Trace(self.mode)
        await self.send({"type": "response.create", **plan.request()}, trace)
        turn = 0
        while True:
            event = await self.recv(trace)
            kind = event.get("type")
            if kind in TERMINAL:
                trace.add_response(event["response"])
                return trace
            if kind == "response.done" and event.get("can_append"):
                response = event.get("response", {})
                pending = {p["call_id"] for p in event.get("pending_calls", [])}
                calls = [c for c in function_calls(response) if c["call_id"] in pending]
                send = _answers_for(plan, turn)
                trace.tool_wait_s += send.tool_wait_s
                await asyncio.sleep(send.tool_wait_s)
                await self.send({"type": "response.append", "input": answer(calls, send)}, trace)
                turn += 1


def make_client(
    mode: str, ws_url: str, http_url: str, api_key: str | None = None, reconnect: int = 0, other_ws_urls: tuple[str, ...] = ()
) -> Transport:
    if mode in ("http", "http-prev"):
        return HttpClient(http_url, chained=mode == "http-prev", api_key=api_key)
    if mode == "ws":
        return GaWebSocketClient(ws_url, api_key, reconnect, other_ws_urls)
    if mode == "longlived":
        return LongLivedLabClient(ws_url, api_key)
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
