"""The lab's five rollout clients: one rollout of a :class:`RolloutPlan` over each transport, as a
:class:`Trace`.

Each is a thin wrapper on the client library (``proto/client``): the library builds, sends and parses the
frames and calls the lab's observer on each one (its time and its bytes on the wire); a wrapper adds only
its mode's policy, what to re-send each round.

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
  ``previous_response_id``, as Codex does when its input is not a strict extension of the last request plus
  the items the server returned (openai/codex, ``codex-rs/core/src/client.rs``: ``get_incremental_items``,
  ``prepare_websocket_request``); the long-lived client sends a ``response.create`` with the whole input,
  which supersedes a suspended response on the same connection (docs/protocol.md, "A create supersedes a
  suspended response"; Codex's v1 transport does the same). What that costs: docs/lab.md, "History
  rewrites".

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

from proto.client import messages
from proto.client.errors import ClientError, HttpStatusError, ProtocolFailure
from proto.client.frames import SENT, Frame
from proto.client.ga import GaClient
from proto.client.http import HttpClient
from proto.client.longlived import longlived_url
from proto.client.messages import as_input, function_calls
from proto.client.ws import WebSocketClient
from proto.core.codec import CACHE_HEADER
from proto.core.events import TERMINAL_TYPES
from proto.core.response import MODES
from proto.lab.analysis.metrics import RECONNECT, SEND, Mark, Trace
from proto.lab.config import PEER_MODES
from proto.lab.workload.plan import RolloutPlan, Send

__all__ = ["LabClientError", "RolloutClient", "answer", "make_client", "new_items", "rewrite"]


class LabClientError(RuntimeError):
    """The server refused or broke a rollout (an ``error`` event, an HTTP error status, a closed socket)."""


class RolloutClient(Protocol):
    """What the runner drives: one client per session, opened once, one rollout after another."""

    mode: str
    on_send: Callable[[], None] | None

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def rollout(self, plan: RolloutPlan) -> Trace: ...


def answer(calls: list[dict[str, Any]], send: Send) -> list[dict[str, Any]]:
    """Pair the last round's calls with this round's pre-generated outputs, in call order."""
    if len(calls) != len(send.new):
        raise LabClientError(f"the model made {len(calls)} calls, the plan has {len(send.new)} outputs")
    return [messages.function_call_output(c["call_id"], out) for c, out in zip(calls, send.new, strict=True)]


def new_items(calls: list[dict[str, Any]], send: Send) -> list[dict[str, Any]]:
    """A round's new items: the outputs of the last round's calls, or a user message after its message."""
    if send.kind == "user" or (send.kind == "rewrite" and not calls):
        return [messages.user_message(text) for text in send.new]
    return answer(calls, send)


def rewrite(history: list[dict[str, Any]], send: Send) -> None:
    """A rewrite round's edits, in place: the bodies it replaces (``Send.rewrite``), then the items it
    drops (``Send.drop``; both index the history as it was)."""
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
    for index in reversed(send.drop):
        del history[index]


def _loop_time() -> float:
    """The traces' clock: the running loop's (the tool waits are slept and spanned on it too)."""
    return asyncio.get_running_loop().time()


class _Client:
    mode = ""
    on_send: Callable[[], None] | None = None  # the runner's progress hook, called at every send

    def __init__(self) -> None:
        self._trace = Trace(self.mode)  # the rollout in progress: the observer records into it
        self._kind = ""  # the round in progress (plan.Send.kind): the kind of its send

    def _start(self, plan: RolloutPlan) -> Trace:
        self._trace = Trace(self.mode, session=plan.session)
        return self._trace

    def _observe(self, frame: Frame) -> None:
        """The library's timing hook: each frame into the trace of the rollout in progress."""
        trace = self._trace
        if frame.direction != SENT:
            trace.marks.append(Mark(frame.t, frame.type))
            return
        trace.bytes_sent += frame.wire_bytes
        if frame.type == messages.CANCEL:  # not a round's request: no SEND mark
            return
        trace.marks.append(Mark(frame.t, SEND))
        trace.kinds.append(self._kind)
        if self.on_send is not None:
            self.on_send()

    def _failed(self, exc: ClientError) -> LabClientError:
        if isinstance(exc, ProtocolFailure):
            return LabClientError(f"{self.mode}: {exc.error}")
        if isinstance(exc, HttpStatusError):
            return LabClientError(f"{self.mode}: HTTP {exc.status}: {exc.text[:300]}")
        return LabClientError(f"{self.mode}: {exc}")

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

    async def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        raise NotImplementedError

    async def rollout(self, plan: RolloutPlan) -> Trace:
        trace = self._start(plan)
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
            if not self.chains or send.kind in ("first", "rewrite") or previous is None:
                body = dict(base, input=history)
            else:
                body = messages.continuation(base, new, previous)
            self._kind = send.kind
            response = await self.exchange(body, trace)
            trace.add_response(response)
            if response.get("status") != "completed":
                return trace
            calls = function_calls(response)
            history += [as_input(item) for item in response.get("output", [])]
            previous = response["id"]
        return trace


class HttpRolloutClient(_ChainedClient):
    """``http`` (full history), ``http-cached`` (full history, the item-cache header) or ``http-prev``
    (``previous_response_id``) over SSE, on one keep-alive connection (httpx's pool, HTTP/1.1)."""

    def __init__(self, http_url: str, mode: str, api_key: str | None = None) -> None:
        self.mode = mode
        super().__init__()
        self.chains = mode == "http-prev"
        headers = {CACHE_HEADER: "items"} if mode == "http-cached" else {}
        self._http = HttpClient(http_url, api_key, headers=headers, observer=self._observe, clock=_loop_time)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        await self._http.aclose()

    async def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        try:
            return await self._http.create(body)
        except ClientError as exc:
            raise self._failed(exc) from exc


class _WebSocketRolloutClient(_Client):
    def __init__(self, ws: WebSocketClient) -> None:
        super().__init__()
        self._ws = ws

    async def open(self) -> None:
        await self._ws.connect()

    async def reconnect(self, url: str, trace: Trace) -> None:
        """Drop this connection and open one to ``url`` (marked in the trace, before the next send)."""
        await self._ws.close()
        await self._ws.connect(url)
        trace.marks.append(Mark(asyncio.get_running_loop().time(), RECONNECT))

    async def close(self) -> None:
        await self._ws.close()

    async def recv(self) -> dict[str, Any]:
        event = await self._ws.recv()
        if event.type == "error":
            raise LabClientError(f"{self.mode}: {event.data.get('error')}")
        return event.data


_WS_OPTIONS: dict[str, Any] = {"max_size": 2**26, "ping_interval": None, "clock": _loop_time}


class GaRolloutClient(_WebSocketRolloutClient, _ChainedClient):
    """GA WebSocket mode: one connection, a flat ``response.create`` per round; with ``reconnect=K`` and
    several ``urls``, a new connection to the next one every K turns."""

    mode = "ws"

    def __init__(
        self, url: str, api_key: str | None, reconnect: int = 0, others: tuple[str, ...] = ()
    ) -> None:
        self._ga = GaClient(url, api_key, observer=self._observe, **_WS_OPTIONS)
        super().__init__(self._ga)
        self._urls = (url, *others)
        self._reconnect = reconnect
        self._turn = 0  # of the rollout in progress: 0 is its first send
        self._hops = 0  # reconnects so far: each goes to the next server

    async def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        self._turn = self._turn + 1 if "previous_response_id" in body else 0
        if self._reconnect and self._turn and self._turn % self._reconnect == 0:
            self._hops += 1
            await self.reconnect(self._urls[self._hops % len(self._urls)], trace)
        try:
            return await self._ga.create(body)
        except ClientError as exc:
            raise self._failed(exc) from exc


class PeerGaRolloutClient(GaRolloutClient):
    """A peer's own GA WebSocket mode (docs/lab.md, "Peers"), driven as ``ws`` drives this server's, with
    ``parallel_tool_calls: true`` said outright: OpenAI's default, which agentic-api 0.9.0 does not assume
    (upstream it asks for one call a turn unless told)."""

    def __init__(self, mode: str, url: str, api_key: str | None) -> None:
        self.mode = mode
        super().__init__(url, api_key)

    async def exchange(self, body: dict[str, Any], trace: Trace) -> dict[str, Any]:
        return await super().exchange({"parallel_tool_calls": True, **body}, trace)


class LongLivedRolloutClient(_WebSocketRolloutClient):
    """The prototype: one response while the model calls tools; outputs go back with ``response.append``.
    A user message after a final answer chains a new response on it; a rewrite creates one that supersedes
    the open response."""

    mode = "longlived"

    def __init__(self, url: str, api_key: str | None = None) -> None:
        super().__init__(WebSocketClient(longlived_url(url), api_key, observer=self._observe, **_WS_OPTIONS))

    async def send(self, event: dict[str, Any], kind: str) -> None:
        self._kind = kind
        await self._ws.send(event)

    async def rollout(self, plan: RolloutPlan) -> Trace:
        trace = self._start(plan)
        base = plan.request()
        history: list[dict[str, Any]] = list(base["input"])
        calls: list[dict[str, Any]] = []
        open_id: str | None = None  # the response waiting for outputs
        ended: str | None = None  # the last response that ended (completed)
        folded = (
            0  # output items of the open response already in the history (response.done carries only the new)
        )
        for send in plan.sends:
            if send.kind == "first":
                await self.send(messages.create(base), send.kind)
            else:
                await self._tools(trace, send)
                rewrite(history, send)
                new = new_items(calls, send)
                history += new
                if send.kind == "outputs" and open_id is not None:
                    await self.send(messages.append(new), send.kind)
                elif send.kind == "user" and ended is not None:
                    await self.send(messages.create(messages.continuation(base, new, ended)), send.kind)
                else:  # a rewrite: no append can take it; a create with everything supersedes the open one
                    await self.send(messages.create(dict(base, input=history)), send.kind)
                    if open_id is not None:  # it ends first (incomplete, superseded) and stays billed
                        while (event := await self.recv()).get("type") not in TERMINAL_TYPES:
                            pass
                        trace.add_response(event["response"])
                        folded = 0
            open_id = None
            while True:
                event = await self.recv()
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
    mode: str,
    ws_url: str,
    http_url: str,
    api_key: str | None = None,
    reconnect: int = 0,
    other_ws_urls: tuple[str, ...] = (),
) -> RolloutClient:
    if mode in ("http", "http-cached", "http-prev"):
        return HttpRolloutClient(http_url, mode, api_key=api_key)
    if mode == "ws":
        return GaRolloutClient(ws_url, api_key, reconnect, other_ws_urls)
    if mode == "longlived":
        return LongLivedRolloutClient(ws_url, api_key)
    if mode in PEER_MODES:
        return PeerGaRolloutClient(mode, ws_url, api_key)
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
