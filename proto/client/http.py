"""A client for ``POST /v1/responses`` (docs/protocol.md, "5. HTTP and SSE"): JSON, or SSE parsed with
:class:`proto.client.sse.SseParser`, on one ``httpx.AsyncClient`` (its keep-alive pool, HTTP/1.1).

Each request is built whole before it is sent, so the observer sees its exact cost on the wire (request
line, headers, body: ``frames.http_request_bytes``), stamped where its bytes leave: httpcore's ``trace``
extension's ``send_request_headers.started`` (httpx has built the request and holds the connection; the
next thing is the socket write), not when it is handed to httpx.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Self

import httpx

import proto.client.messages as messages
from proto.client.errors import ClientError, HttpStatusError, ProtocolFailure, StreamEnded
from proto.client.frames import (
    DEFAULT_CLOCK,
    RECEIVED,
    SENT,
    ClientEvent,
    Clock,
    Frame,
    Observer,
    bearer,
    decode,
    encode,
    http_request_bytes,
)
from proto.client.sse import SseParser
from proto.core.events import TERMINAL_TYPES

PATH = "/v1/responses"
_JSON = {"content-type": "application/json"}
SENDING = "send_request_headers.started"  # httpcore's trace event just before the request's first write


class HttpClient:
    """``async with HttpClient("http://127.0.0.1:8000") as client: response = await client.create(body)``.

    ``headers`` go on every request (an extension such as the lab's item-cache header)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        observer: Observer | None = None,
        clock: Clock = DEFAULT_CLOCK,
        timeout: float = 600.0,
        max_connections: int = 1,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + PATH
        self.observer = observer
        self.clock = clock
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.AsyncClient(
            headers={**bearer(api_key), **(headers or {})}, timeout=httpx.Timeout(timeout), limits=limits
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    def _request(self, body: Mapping[str, Any]) -> httpx.Request:
        content = encode(body)
        request = self.http.build_request("POST", self.url, content=content, headers=_JSON)
        self._observe_send(request, len(content), body)
        return request

    def _observe_send(self, request: httpx.Request, size: int, body: Mapping[str, Any]) -> None:
        """Tell the observer of ``request`` when its bytes first leave (httpcore's trace extension): the
        same request sent again (:meth:`_send`) is not told a second time."""
        observer = self.observer
        if observer is None:
            return
        wire = http_request_bytes(request, size)
        clock = self.clock
        told = False

        async def trace(name: str, info: Mapping[str, Any]) -> None:
            nonlocal told
            if name.endswith(SENDING) and not told:
                told = True
                observer(Frame(SENT, clock(), wire, "", body))

        request.extensions["trace"] = trace

    async def get(self, path: str) -> httpx.Response:
        """``GET path`` on the same connection, observed as a request is (a no-op round trip: the lab's HTTP
        floor, ``GET /healthz``)."""
        request = self.http.build_request("GET", self.base_url + path)
        self._observe_send(request, 0, {})
        response = await self.http.send(request)
        await response.aread()
        return response

    async def post(self, body: Mapping[str, Any]) -> httpx.Response:
        """``body`` as sent (``stream`` as the caller set it); the reply as it came, status and all."""
        return await self.http.send(self._request(body))

    async def _send(self, body: Mapping[str, Any]) -> httpx.Response:
        """``body`` sent, the response's headers read. A keep-alive connection the server closed as the
        request went out (its idle timeout) fails before any response byte; the request is sent once more,
        on a new connection, as the SDKs retry a connection error (the observer is told of the first send
        only: the call's latency includes the retry). Any other failure is the caller's."""
        request = self._request(body)  # its content is bytes: the same request can go out twice
        try:
            return await self.http.send(request, stream=True)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            return await self.http.send(request, stream=True)

    @contextlib.asynccontextmanager
    async def stream(self, body: Mapping[str, Any]) -> AsyncIterator[AsyncIterator[ClientEvent]]:
        """``async with client.stream(body) as events: async for event in events:`` — ``body`` sent with
        ``stream: true``, each SSE event decoded and stamped with its arrival (an ``error`` event too: the
        caller decides). Another status than 200 raises HttpStatusError. The response closes on exit."""
        response = await self._send(messages.streaming(body))
        try:
            if response.status_code != 200:
                await response.aread()
                raise HttpStatusError(response.status_code, response.text)
            events = self._events(response)
            try:
                yield events
            finally:
                await events.aclose()
        finally:
            await response.aclose()

    async def _events(self, response: httpx.Response) -> AsyncGenerator[ClientEvent, None]:
        parser = SseParser()
        async for chunk in response.aiter_bytes():
            t = self.clock()
            for sse in parser.feed(chunk):
                if sse.data.strip() == "[DONE]":
                    continue  # the end-of-stream sentinel vLLM-style servers (agentic-api) send last
                data = decode(sse.data)
                if not isinstance(data, dict):
                    raise ClientError(
                        f"the server sent an event that is not a JSON object: {sse.data[:200]!r}"
                    )
                event = ClientEvent(t, data)
                if self.observer is not None:
                    self.observer(Frame(RECEIVED, t, len(sse.data), event.type, data))
                yield event

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One streamed response to its terminal event; returns that event's Response. An ``error`` event
        raises ProtocolFailure; a stream that ends without a terminal event, StreamEnded. The body is read
        to its end after the terminal event, as the SDKs read it, so the connection goes back to the pool
        and the next request reuses it (a body left unread would make httpx close it)."""
        ended: dict[str, Any] | None = None
        async with self.stream(body) as events:
            async for event in events:
                if ended is not None:
                    continue  # past the terminal event: nothing the caller reads, only the body's end
                if event.type == "error":
                    raise ProtocolFailure(event.data.get("error") or {})
                if event.type in TERMINAL_TYPES:
                    ended = dict(event.data["response"])
        if ended is None:
            raise StreamEnded("the stream ended without a terminal event")
        return ended
