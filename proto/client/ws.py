"""One WebSocket connection to ``/v1/responses``, the part both WebSocket protocols share.

Built on the ``websockets`` library's asyncio client: mature, keeps up with RFC 6455 details (ping/pong,
fragmentation, close handshake) and is what the official ``openai`` SDK itself uses for its WebSocket
mode, so our measurements see the same client stack a real user would. Frames are decoded with msgspec
into plain dicts (the client must also see what a stranger's server might send, not only our structs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect

from proto.client.errors import ClientError
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
    ws_frame_bytes,
)


class WebSocketClient:
    """``async with Client(url) as client:`` — ``send`` events, ``recv`` them; ``observer`` sees each frame.

    ``ping_interval`` None sends no pings (the lab's clients: a ping is a frame the measurement did not
    ask for); ``max_size`` bounds one received frame."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        observer: Observer | None = None,
        clock: Clock = DEFAULT_CLOCK,
        max_size: int | None = 2**24,
        ping_interval: float | None = 20.0,
        open_timeout: float | None = 10.0,
    ) -> None:
        self.url = url
        self.observer = observer
        self.clock = clock
        self.bytes_sent = 0  # the payloads sent on this client, every connection
        self._headers = bearer(api_key)
        self._options: dict[str, Any] = {
            "max_size": max_size,
            "ping_interval": ping_interval,
            "open_timeout": open_timeout,
        }
        self._ws: ClientConnection | None = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self, url: str | None = None) -> None:
        """Open the connection (to ``url`` from now on, when given). Call ``close`` first to move it."""
        if url is not None:
            self.url = url
        self._ws = await connect(
            self.url, additional_headers=self._headers, compression=None, **self._options
        )

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    @property
    def ws(self) -> ClientConnection:
        """The connection itself, for what this class does not wrap (a test's abort, a raw frame)."""
        if self._ws is None:
            raise RuntimeError("not connected: connect() first")
        return self._ws

    async def send(self, event: Mapping[str, Any]) -> float:
        """Send one event as one text frame; returns the time it was handed to the socket."""
        ws = self.ws
        data = encode(event)
        self.bytes_sent += len(data)
        t = self.clock()
        if self.observer is not None:
            self.observer(Frame(SENT, t, ws_frame_bytes(data), str(event.get("type", "")), event))
        await ws.send(data, text=True)
        return t

    async def recv(self, timeout: float | None = None) -> ClientEvent:
        """The next event (a JSON object), stamped with its arrival; ``websockets``' ConnectionClosed when the
        server has closed."""
        ws = self.ws
        raw = await (
            ws.recv(decode=False) if timeout is None else asyncio.wait_for(ws.recv(decode=False), timeout)
        )
        t = self.clock()
        data = decode(raw)
        if not isinstance(data, dict):
            raise ClientError(f"the server sent a frame that is not a JSON object: {raw[:200]!r}")
        event = ClientEvent(t, data)
        if self.observer is not None:
            self.observer(Frame(RECEIVED, t, len(raw), event.type, data))
        return event
