"""Request heads that do not arrive: a deadline and a cap (docs/operations.md, "Unfinished request heads").

uvicorn times out an idle keep-alive connection, but not a request head that arrives a byte at a time: a
slowloris client (half a request line, then a byte every few seconds) holds its connection and its file
descriptor for ever, and a few hundred of them lock every client out, ``/healthz`` included. So, at the
transport, before any ASGI code runs and for the WebSocket upgrade alike (it is an HTTP request until its
head is complete):

- **Deadline.** A request head must be complete within ``--header-timeout-s`` of its first byte (of the
  connection, for the first request): else ``408 Request Timeout`` and the connection closes. nginx's
  ``client_header_timeout`` (default 60 s) is the precedent, and its default.
- **Cap.** At most ``--max-unfinished-headers`` connections may be waiting for their request head; past
  it the one that has waited longest is answered the same 408 and closed. A new client gets in at once (a
  whole head in its first segment is done before a slowloris that has waited seconds), and the cap holds
  whatever the arrival rate; refusing at accept instead would lock out the valid clients that the cap
  exists to let in.

Nothing here blocks or awaits: a timer per waiting connection (``loop.call_later``), cancelled when its
head is complete, and one insertion-ordered dict, oldest first.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, ClassVar, Protocol

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# What is written to a connection whose head missed its deadline (RFC 9110 §15.5.9), before it closes.
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class Waiting(Protocol):
    def head_overdue(self) -> None: ...


class HeadGate:
    """The connections of one server whose request head has not arrived in full, oldest first."""

    def __init__(self, timeout_s: float, cap: int) -> None:
        self.timeout_s = timeout_s
        self.cap = cap
        self._waiting: dict[Waiting, asyncio.TimerHandle] = {}
        self.timed_out = 0  # heads that missed the deadline (408, closed)
        self.evicted = 0  # connections closed to keep the cap

    def __len__(self) -> int:
        return len(self._waiting)

    def waiting(self, conn: Waiting, loop: asyncio.AbstractEventLoop) -> None:
        """``conn``'s request head has begun (or the connection opened): its deadline starts, unless it is
        already running. Past the cap, the longest-waiting connection is closed."""
        if conn in self._waiting:
            return
        self._waiting[conn] = loop.call_later(self.timeout_s, self._overdue, conn)
        while len(self._waiting) > self.cap:
            oldest = next(iter(self._waiting))
            self.arrived(oldest)
            self.evicted += 1
            oldest.head_overdue()

    def arrived(self, conn: Waiting) -> None:
        """``conn``'s head is complete, or the connection is gone: no deadline runs for it."""
        timer = self._waiting.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def _overdue(self, conn: Waiting) -> None:
        if self._waiting.pop(conn, None) is not None:
            self.timed_out += 1
            conn.head_overdue()


def default_cap() -> int:
    """A quarter of this process's file-descriptor limit (at most 1 024): the other three quarters stay
    for clients that send their requests, the databases and the engine hop."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(1, min(1024, (soft if soft > 0 else 4096) // 4))


class _HttpTools(HttpToolsProtocol):
    gate: ClassVar[HeadGate]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.gate.waiting(self, self.loop)

    def on_message_begin(self) -> None:  # the next request on a kept-alive connection
        super().on_message_begin()
        self.gate.waiting(self, self.loop)

    def on_headers_complete(self) -> None:
        self.gate.arrived(self)
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.arrived(self)
        super().connection_lost(exc)

    def head_overdue(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(TIMED_OUT)
            self.transport.close()


class _H11(H11Protocol):
    gate: ClassVar[HeadGate]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.gate.waiting(self, self.loop)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # h11 holds the head until it is whole
            if not self.transport.is_closing():
                self.gate.waiting(self, self.loop)
        else:
            self.gate.arrived(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.arrived(self)
        super().connection_lost(exc)

    def head_overdue(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(TIMED_OUT)
            self.transport.close()


def guarded(http: str, gate: HeadGate) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``http`` (``httptools`` or ``h11``) bound to ``gate``: a class of its own
    per server, so that servers in one process (the tests') do not share a gate."""
    base: type[Any] = _HttpTools if http == "httptools" else _H11
    return type(f"Guarded{base.__name__}", (base,), {"gate": gate})
