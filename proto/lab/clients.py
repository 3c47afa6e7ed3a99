"""The lab's five clients: one rollout of a :class:`RolloutPlan` over each transport, as a :class:`Trace`.

All five do what a real agent client does on that wire, and nothing more. Every client keeps the
conversation as the server returned it (an agent needs it to rewrite its history), and per round:

* ``http`` — ``POST /v1/responses`` (SSE) with the whole history and the tools, every round (as Chat
  Completions-style clients and the Agents SDK without chaining do).
* ``http-cached`` — the same requests with ``X-Responses-Lab-Cache: items``: the server's item cache skips
  what it has already scanned and tokenized (the seed's step before WebSockets).
* ``http-prev`` — ``previous_response_id`` and only the new items (tools re-sent: OpenAI does not carry
  them over a chain).
* ``ws`` — GA WebSocket mode: a flat ``response.create`` per round on one connection, chained with
  ``previous_response_id`` + the new items.
* ``longlived`` — one ``response.create``, then one ``response.append`` of the outputs per suspension.

Two kinds of round are not a plain continuation:

* **A user message after the model's final message** (a trace's round without tools): the HTTP modes and
  ``ws`` send it as any round; the long-lived response has ended, so a new ``response.create`` chains on it
  with ``previous_response_id`` (loaded from the store).
* **A history rewrite** (``Send.kind == "rewrite"``: earlier items edited): no chain can express it. ``http``
  and ``http-cached`` re-send as always; ``http-prev`` and ``ws`` send the whole rewritten input without
  ``previous_response_id`` (as Codex does when its input is not a strict extension of the last request);
  the long-lived response is ended with ``response.cancel`` (its terminal event is awaited) and a new one
  created with the whole input. The lab measures what that costs (NOTES.md (Issue 11)).

``reconnect=K`` (``ws`` only): every K turns the client closes its connection and opens one to the next of
its servers (two servers sharing a database: ``--db``), as a client whose socket dropped lands elsewhere;
that turn misses the connection's cache and is served from the store. The reconnect is marked
(``RECONNECT``) just before the turn's send, outside its TTFT (the handshake is in E2E, as a user sees it):
``metrics.store_vs_cached`` splits the turns by it. HTTP turns are one request each whatever the server
(``http-prev`` reads the store every turn), and a long-lived response ends with its connection, so the
knob is the GA WebSocket mode's.

The client "runs" a round's tools by sleeping the plan's tool time once (parallel calls overlap), then
answers with the plan's pre-generated outputs. Connections are opened by ``open()`` before a rollout starts
(a session keeps its connection, as agents do), so E2E holds no handshake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import msgspec
from websockets.asyncio.client import ClientConnection, connect

from proto.core.events import TERMINAL_TYPES
from proto.core.response import MODES
from proto.lab.metrics import RECONNECT, SEND, Mark, Trace
from proto.lab.plan import RolloutPlan, Send
from proto.server.transports.http import CACHE_HEADER

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


def answer(calls: list[dict[str, Any]], send: Send) -> list[dict[str, Any]]:
    """Pair the last round's calls with this round's pre-generated outputs, in call order."""
    if len(calls) != len(send.new):
        raise LabClientError(f"the model made {len(calls)} calls, the plan has {len(send.new)} outputs")
    return [{"type": "function_call_output", "call_id": c["call_id"], "output": out} for c, out in zip(calls, send.new, strict=True)]


def new_items(calls: list[dict[str, Any]], send: Send) -> list[dict[str, Any]]:
    """A round's new items: the outputs of the last round's calls, or a user message after its message."""
    if send.kind == "user" or (send.kind == "rewrite" and not calls):
        return [{"role": "user", "content": text} for text in send.new]
    return answer(calls, send)


def rewrite(history: list[dict[str, Any]], send: Send) -> None:
    """Replace the bodies of the items a rewrite round edits (``Send.rewrite``), in place."""
    for index, text in send.rewrite:
        item = history[index]
        if item.get("type") == "function_call_output":
            item["output"] = text
        elif item.get("role") == "assistant":
            item["content"] = [{"type": "output_text", "text": text, "annotations": []}]
        elif item.get("role") == "user":
            item["content"] = text
        else:
            raise LabClientError(f"a rewrite cannot edit a {item.get('type')} item (history[{index}])")


def as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the client re-sends it (the server's own fields it does not take back dropped)."""
    if item.get("type") == "message":
        return {"type": "message", "role": "assistant", "content": item.get("content", [])}
    return item


class _Client:
    mode = ""
    on_send: Callable[[], None] | None = None  # the runner's progress hook, called at every send

    def _sent(self, trace: Trace, kind: str = "") -> None:
        trace.marks.append(Mark(asyncio.get_running_loop().time(), SEND))
        trace.kinds.append(kind)
        if self.on_send is not None:
            self.on_send()

    async def _tools(self, trace: Trace, send: Send) -> None:
        """The client's tool (or user) time before a round: slept once, recorded as a span."""
        if send.wait_s <= 0:
            return
        t0 = asyncio.get_running_loop().time()
        trace.tool_wait_s += send.wait_s
        await asyncio.sleep(send.wait_s)
        trace.tool_spans.append((t0, asyncio.get_running_loop().time()))


class _ChainedClient(_Client):
    """The request/response transports: each round is one response that ends at the model's calls."""

    chains = True  # sends previous_response_id and only the new items

    async def exchange(self, body: dict[str, Any], trace: Trace, kind: str) -> dict[str, Any]:
        raise NotImplementedError

    async def rollout(self, plan: RolloutPlan) -> Trace:
        trace = Trace(self.mode, session=plan.session)
        base = plan.request()
        history: list[dict[str, Any]] = list(base["input"])
        calls: list[dict[str, Any]] = []
        previous: str | None = None
        for send in plan.sends:
            new = base["input"]
            if send.kind != "first":
                await self._tools(trace, send)
                rewrite(history, send)
                new = new_items(calls, send)
                history += new
            body = dict(base, input=new)
            if not self.chains or send.kind in ("first", "rewrite") or previous is None:
                body["input"] = history
            else:
                body["previous_response_id"] = previous
            response = await self.exchange(body, trace, send.kind)
            trace.add_response(response)
            if response.get("status") != "completed":
                return trace
            calls = function_calls(response)
            history += [as_input(item) for item in response.get("output", [])]
            previous = response["id"]
        return trace


class HttpClient(_ChainedClient):
    """``http`` (full history), ``http-cached`` (full history, the item-cache header) or ``http-prev``
    (``previous_response_id``) over SSE, on one keep-alive connection (httpx's pool, HTTP/1.1)."""

    def __init__(self, http_url: str, mode: str, api_key: str | None = None) -> None:
        self.mode = mode
        self.chains = mode == "http-prev"
        self._url = http_url.rstrip("/") + "/v1/responses"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if mode == "http-cached":
            headers[CACHE_HEADER] = "items"
        self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=1))

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        await self._client.aclose()

    async def exchange(self, body: dict[str, Any], trace: Trace, kind: str) -> dict[str, Any]:
        content = _encode(dict(body, stream=True))
        request = self._client.build_request("POST", self._url, content=content, headers={"content-type": "application/json"})
        trace.bytes_sent += _http_request_bytes(request, len(content))
        self._sent(trace, kind)
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
                if kind in TERMINAL_TYPES:
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

    async def send(self, event: dict[str, Any], trace: Trace, kind: str | None = "") -> None:
        """``kind`` None: not a round's request (a cancel): no SEND mark."""
        assert self._ws is not None, "open() first"
        data = _encode(event)
        trace.bytes_sent += ws_frame_bytes(data)
        if kind is not None:
            self._sent(trace, kind)
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
    """GA WebSocket mode: one connection, a flat ``response.create`` per round; with ``reconnect=K`` and
    several ``urls``, a new connection to the next one every K turns."""

    mode = "ws"

    def __init__(self, url: str, api_key: str | None, reconnect: int = 0, others: tuple[str, ...] = ()) -> None:
        super().__init__(url, api_key)
        self._urls = (url, *others)
        self._reconnect = reconnect
        self._turn = 0  # of the rollout in progress: 0 is its first send
        self._hops = 0  # reconnects so far: each goes to the next server

    async def exchange(self, body: dict[str, Any], trace: Trace, kind: str) -> dict[str, Any]:
        self._turn = self._turn + 1 if "previous_response_id" in body else 0
        if self._reconnect and self._turn and self._turn % self._reconnect == 0:
            self._hops += 1
            await self.reconnect(self._urls[self._hops % len(self._urls)], trace)
        await self.send({"type": "response.create", **body}, trace, kind)
        while True:
            event = await self.recv(trace)
            if event.get("type") in TERMINAL_TYPES:
                return dict(event["response"])


class LongLivedLabClient(_WebSocketClient):
    """The prototype: one response while the model calls tools; outputs go back with ``response.append``.
    A user message after a final answer chains a new response on it; a rewrite cancels and recreates."""

    mode = "longlived"

    def __init__(self, url: str, api_key: str | None = None) -> None:
        sep = "&" if "?" in url else "?"
        super().__init__(f"{url}{sep}protocol=longlived", api_key)

    async def rollout(self, plan: RolloutPlan) -> Trace:
        trace = Trace(self.mode, session=plan.session)
        base = plan.request()
        history: list[dict[str, Any]] = list(base["input"])
        calls: list[dict[str, Any]] = []
        open_id: str | None = None  # the response waiting for outputs
        ended: str | None = None  # the last response that ended (completed)
        folded = 0  # output items of the open response already in the history (response.done carries only the new)
        for send in plan.sends:
            if send.kind == "first":
                await self.send({"type": "response.create", **base}, trace, send.kind)
            else:
                await self._tools(trace, send)
                rewrite(history, send)
                new = new_items(calls, send)
                history += new
                if send.kind == "outputs" and open_id is not None:
                    await self.send({"type": "response.append", "input": new}, trace, send.kind)
                elif send.kind == "user" and ended is not None:
                    await self.send({"type": "response.create", **dict(base, input=new, previous_response_id=ended)}, trace, send.kind)
                else:  # a rewrite: the open response cannot take it; end it, start anew with everything
                    if open_id is not None:
                        await self.send({"type": "response.cancel", "response_id": open_id}, trace, None)
                        while (event := await self.recv(trace)).get("type") not in TERMINAL_TYPES:
                            pass
                        trace.add_response(event["response"])  # cancelled: the rounds it ran stay billed
                        folded = 0
                    await self.send({"type": "response.create", **dict(base, input=history)}, trace, send.kind)
            open_id = None
            while True:
                event = await self.recv(trace)
                kind = event.get("type")
                if kind in TERMINAL_TYPES:
                    response = event["response"]
                    trace.add_response(response)
                    history += [as_input(item) for item in response.get("output", [])[folded:]]
                    folded = 0
                    if response.get("status") != "completed":
                        return trace
                    ended, calls = response["id"], []
                    break
                if kind == "response.done" and event.get("can_append"):
                    response = event.get("response", {})
                    history += [as_input(item) for item in response.get("output", [])]
                    pending = {p["call_id"] for p in event.get("pending_calls", [])}
                    calls = [c for c in function_calls(response) if c["call_id"] in pending]
                    open_id = response.get("id")
                    folded += len(response.get("output", []))
                    break
        return trace



def make_client(
    mode: str, ws_url: str, http_url: str, api_key: str | None = None, reconnect: int = 0, other_ws_urls: tuple[str, ...] = ()
) -> Transport:
    if mode in ("http", "http-cached", "http-prev"):
        return HttpClient(http_url, mode, api_key=api_key)
    if mode == "ws":
        return GaWebSocketClient(ws_url, api_key, reconnect, other_ws_urls)
    if mode == "longlived":
        return LongLivedLabClient(ws_url, api_key)
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
