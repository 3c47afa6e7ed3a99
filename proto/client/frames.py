"""What every client of this package records: the events it received, each with its arrival time, and the
optional observer that sees each frame sent or received with its time and its size on the wire.

The observer is the latency lab's timing hook (``proto/lab/run/clients.py``): it is called synchronously,
before a frame is handed to the socket and right after one is decoded, so a timeline built from it holds
the same instants the socket saw. It must not block; it reads the frame during the call (``event`` is the
caller's own object, which the caller may go on changing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import msgspec

encode = msgspec.json.Encoder().encode  # compact JSON, keys in the order the caller built them
decode = msgspec.json.Decoder().decode

Clock = Callable[[], float]
SENT: Literal["sent"] = "sent"
RECEIVED: Literal["received"] = "received"


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame, as an observer sees it."""

    direction: Literal["sent", "received"]
    t: float  # the client's clock: just before the frame is handed to the socket, or just after it arrived
    wire_bytes: (
        int  # sent: what it costs on the wire (see ws_frame_bytes, http_request_bytes); received: its payload
    )
    type: str  # the event's ``type`` ("" when it has none)
    event: Mapping[str, Any]


Observer = Callable[[Frame], None]


@dataclass
class ClientEvent:
    """One event as the client saw it: the server's, or the client's own (``client.*``) for timelines."""

    t: float  # the client's clock (time.perf_counter() unless the client was given another) when received
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.data.get("type", ""))


DEFAULT_CLOCK: Clock = time.perf_counter


def ws_frame_bytes(payload: bytes | int) -> int:
    """What a client-to-server WebSocket frame costs on the wire: header (2/4/10 bytes), mask (4), payload
    (RFC 6455, 5.2)."""
    n = payload if isinstance(payload, int) else len(payload)
    return n + 4 + (2 if n < 126 else 4 if n < 65536 else 10)


def http_request_bytes(request: httpx.Request, body: int) -> int:
    """What an HTTP/1.1 request costs on the wire: request line, headers, blank line, body."""
    line = len(request.method) + len(request.url.raw_path) + len(" HTTP/1.1\r\n") + 1
    headers = sum(len(k) + len(v) + 4 for k, v in request.headers.raw)
    return line + headers + 2 + body


def bearer(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
