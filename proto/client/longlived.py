"""An asyncio client for the long-lived protocol.

Built on the ``websockets`` library's asyncio client: mature, keeps up with RFC 6455 details (ping/pong,
fragmentation, close handshake) and is what the official ``openai`` SDK itself uses for its WebSocket
mode, so our measurements see the same client stack a real user would. Frames are decoded with msgspec
into plain dicts (the client must also see what a stranger's server might send, not only our structs).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from websockets.asyncio.client import ClientConnection, connect

from proto.core.events import TERMINAL_TYPES

ToolFn = Callable[[dict[str, Any]], Awaitable[str]]
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


@dataclass
class ClientEvent:
    """One event as the client saw it: the server's, or the client's own (``client.*``) for timelines."""

    t: float  # time.perf_counter() when received / happened
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.data.get("type", ""))


@dataclass
class RolloutResult:
    """What one ``rollout()`` observed."""

    response: dict[str, Any]
    events: list[ClientEvent] = field(default_factory=list)
    bytes_sent: int = 0
    appends: int = 0


class ProtocolFailure(Exception):
    """The server sent an ``error`` event while a rollout was running."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = error


class LongLivedClient:
    """``async with LongLivedClient(url) as client: result = await client.rollout(request, tools)``."""

    def __init__(self, url: str, api_key: str | None = None, max_size: int | None = 2**24) -> None:
        sep = "&" if "?" in url else "?"
        self.url = url if "protocol=longlived" in url else f"{url}{sep}protocol=longlived"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._max_size = max_size
        self._ws: ClientConnection | None = None
        self.bytes_sent = 0

    async def __aenter__(self) -> LongLivedClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        self._ws = await connect(self.url, additional_headers=self._headers, max_size=self._max_size, compression=None)

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    @property
    def ws(self) -> ClientConnection:
        if self._ws is None:
            raise RuntimeError("not connected")
        return self._ws

    async def send(self, event: Mapping[str, Any]) -> float:
        """Send one event; returns the time it was handed to the socket."""
        data = _encode(event).decode()
        self.bytes_sent += len(data)
        t = time.perf_counter()
        await self.ws.send(data)
        return t

    async def recv(self, timeout: float | None = None) -> ClientEvent:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        return ClientEvent(time.perf_counter(), _decode(raw))

    async def rollout(
        self,
        request: Mapping[str, Any],
        tools: Mapping[str, ToolFn],
        on_event: Callable[[ClientEvent], None] | None = None,
        timeout: float | None = 120.0,
    ) -> RolloutResult:
        """Open a response, answer every suspension with the tools' outputs, return at the terminal event.

        Pending calls of one suspension run concurrently; their outputs go back in one ``response.append``.
        """
        seen = RolloutResult(response={})
        sent_before = self.bytes_sent

        def note(event: ClientEvent) -> None:
            seen.events.append(event)
            if on_event is not None:
                on_event(event)

        t = await self.send({"type": "response.create", **request})
        note(ClientEvent(t, {"type": "client.create"}))
        while True:
            event = await self.recv(timeout)
            note(event)
            kind = event.type
            if kind == "error":
                raise ProtocolFailure(event.data.get("error", {}))
            if kind in TERMINAL_TYPES:
                seen.response = event.data["response"]
                seen.bytes_sent = self.bytes_sent - sent_before
                return seen
            if kind == "response.done" and event.data.get("can_append"):
                pending = event.data.get("pending_calls", [])
                calls = _calls_by_id(event.data.get("response", {}))
                outputs = await asyncio.gather(*(self._run_tool(tools, calls, call, note) for call in pending))
                t = await self.send({"type": "response.append", "input": list(outputs)})
                seen.appends += 1
                note(ClientEvent(t, {"type": "client.append", "outputs": len(outputs)}))

    async def _run_tool(
        self,
        tools: Mapping[str, ToolFn],
        calls: dict[str, dict[str, Any]],
        pending: dict[str, Any],
        note: Callable[[ClientEvent], None],
    ) -> dict[str, Any]:
        call_id, name = pending["call_id"], pending["name"]
        arguments = calls.get(call_id, {}).get("arguments", "{}")
        started = time.perf_counter()
        note(ClientEvent(started, {"type": "client.tool.start", "call_id": call_id, "name": name}))
        fn = tools.get(name)
        if fn is None:
            output = json.dumps({"error": f"no tool named {name!r} on this client"})
        else:
            try:
                args = json.loads(arguments) if arguments else {}
                output = await fn(args if isinstance(args, dict) else {"value": args})
            except Exception as exc:  # a tool's failure is the model's business, not the protocol's
                output = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        done = time.perf_counter()
        note(ClientEvent(done, {"type": "client.tool.done", "call_id": call_id, "name": name, "duration_ms": (done - started) * 1e3}))
        return {"type": "function_call_output", "call_id": call_id, "output": output}


def _calls_by_id(response: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["call_id"]: item for item in response.get("output", []) if item.get("type") == "function_call"}
