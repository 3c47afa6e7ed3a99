"""Every event an end-to-end test receives is checked against the vendored Open Responses schemas
(tests/spec.py; docs/protocol.md, "Conformance"), whichever way the test reads it.

``install`` wraps the two places every in-process client's bytes come through, so no test has to ask:

* ``websockets``' asyncio ``ClientConnection.recv`` (the tests' own sockets, ``proto.client``'s GA and
  long-lived clients, the openai SDK's ``responses.connect()``, the lab): each text frame from
  ``/v1/responses`` is an event (``check_event``, ``ws``: the GA error envelope is the spec's
  ``WebSocketErrorEvent``, the long-lived protocol's own events its documented extensions);
* httpx's transports (``httpx.AsyncClient``/``Client``, so the openai SDK and ``proto.client.http`` too):
  an SSE body from ``/v1/responses`` is checked event by event as the test reads it (``error`` as the
  spec's ``ErrorStreamingEvent``); a JSON body once read whole: a Response from ``POST /v1/responses``,
  ``GET /v1/responses/{id}`` or ``…/cancel`` as ``ResponseResource``, the compact endpoint's reply as
  ``CompactResource``, an error body's ``error`` as the spec's ``ErrorPayload``.

A violation is raised where the test reads (``NotConforming``) and also kept, so a client that catches
what its reads raise (an SDK wrapping errors) cannot hide it: the fixture in tests/conftest.py fails the
test with every violation it collected. The schemas are compiled once per session (``spec.validator`` is
cached). Subprocess clients (Codex, the AI SDK on node) are outside; the compliance suite validates its
own reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
from spec import check_compact, check_event, check_response, check_schema
from websockets.asyncio.client import ClientConnection

RESPONSE_PATH = re.compile(r"^/v1/responses(?:/(?P<rest>.*))?$")
violations: list[str] = []  # what the running test received that does not conform
enabled = True  # off for a test marked ``nonconforming`` (tests/conftest.py)


class NotConforming(AssertionError):
    """The server sent an event or object the spec does not admit."""


def _report(what: str, check: Callable[[], None]) -> None:
    if not enabled:
        return
    try:
        check()
    except AssertionError as exc:
        message = f"{what}: {exc}"
        violations.append(message)
        raise NotConforming(message) from None


# ------------------------------------------------------------------------------------------- WebSocket
def check_frame(message: str | bytes) -> None:
    """One text frame the server sent on ``/v1/responses``: a JSON object that is a valid event."""

    def check() -> None:
        try:
            event = json.loads(message)
        except ValueError:
            raise AssertionError(f"not JSON: {message[:200]!r}") from None
        check_event(event, "ws")

    _report("WebSocket frame", check)


def _wrap_recv(original: Any) -> Any:
    async def recv(self: ClientConnection, decode: bool | None = None) -> str | bytes:
        message: str | bytes = await original(self, decode)
        if _path(self.request.path if self.request is not None else "") is not None:
            check_frame(message)
        return message

    return recv


# ------------------------------------------------------------------------------------------- HTTP
def _path(target: str) -> str | None:
    """``rest`` of a ``/v1/responses[/rest]`` path ("" for the create), None for any other path."""
    match = RESPONSE_PATH.match(target.split("?", 1)[0])
    return None if match is None else match.group("rest") or ""


def check_body(method: str, rest: str, status: int, body: bytes) -> None:
    """A whole JSON reply of ``/v1/responses[/rest]``."""

    def check() -> None:
        value = json.loads(body)
        if status >= 400:
            check_schema(value.get("error"), "ErrorPayload")
        elif rest == "compact":
            check_compact(value)
        elif _is_response(method, rest):
            check_response(value)

    _report(f"{method} /v1/responses/{rest} ({status})", check)


def _is_response(method: str, rest: str) -> bool:
    """A create, a retrieve (``GET /v1/responses/{id}``) or a cancel: the reply is a Response."""
    created = method == "POST" and rest == ""
    retrieved = method == "GET" and bool(rest) and "/" not in rest
    return created or retrieved or (method == "POST" and rest.endswith("/cancel"))


class SseChecker:
    """Feeds an SSE body's bytes, checking each complete event's ``data`` as it arrives."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        for block in events:
            lines = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            data = b"\n".join(lines)
            if data and data != b"[DONE]":
                _report("SSE event", lambda data=data: check_event(json.loads(data), "sse"))


class _Checked(httpx.AsyncByteStream, httpx.SyncByteStream):
    """A response body that is checked as the test reads it (SSE) or once read to its end (JSON)."""

    def __init__(self, stream: Any, request: httpx.Request, response: httpx.Response, rest: str) -> None:
        self._stream = stream
        content_type = response.headers.get("content-type", "")
        self._sse = SseChecker() if content_type.startswith("text/event-stream") else None
        self._json = content_type.startswith("application/json")
        self._where = (request.method, rest, response.status_code)
        self._body = b""

    def _seen(self, chunk: bytes) -> None:
        if self._sse is not None:
            self._sse.feed(chunk)
        elif self._json:
            self._body += chunk

    def _ended(self) -> None:
        if self._json and self._body:
            check_body(*self._where, self._body)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._seen(chunk)
            yield chunk
        self._ended()

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            self._seen(chunk)
            yield chunk
        self._ended()

    async def aclose(self) -> None:
        await self._stream.aclose()

    def close(self) -> None:
        self._stream.close()


def _checked(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    rest = _path(request.url.path)
    if rest is not None:
        response.stream = _Checked(response.stream, request, response, rest)
    return response


def _wrap_async(original: Any) -> Any:
    async def handle_async_request(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        return _checked(await original(self, request), request)

    return handle_async_request


def _wrap_sync(original: Any) -> Any:
    def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        return _checked(original(self, request), request)

    return handle_request


# ------------------------------------------------------------------------------------------- install
PATCHES: tuple[tuple[Any, str, Callable[[Any], Any]], ...] = (
    (ClientConnection, "recv", _wrap_recv),
    (httpx.AsyncHTTPTransport, "handle_async_request", _wrap_async),
    (httpx.HTTPTransport, "handle_request", _wrap_sync),
)


def install() -> Callable[[], None]:
    """Wrap the readers; returns what puts them back."""
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in PATCHES]
    for owner, name, wrap in PATCHES:
        setattr(owner, name, wrap(getattr(owner, name)))

    def uninstall() -> None:
        for owner, name, original in saved:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)

    return uninstall
