"""A client for the long-lived protocol (docs/protocol.md, "3. The long-lived protocol"): one response
spans the rollout; each suspension (``response.done`` with ``can_append``) is answered with one
``response.append`` of the tools' outputs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import proto.client.messages as messages
from proto.client.errors import ProtocolFailure
from proto.client.frames import DEFAULT_CLOCK, ClientEvent, Clock, Observer
from proto.client.ws import WebSocketClient
from proto.core.events import TERMINAL_TYPES

ToolFn = Callable[[dict[str, Any]], Awaitable[str]]

__all__ = ["ClientEvent", "LongLivedClient", "ProtocolFailure", "RolloutResult", "ToolFn", "longlived_url"]


@dataclass
class RolloutResult:
    """What one ``rollout()`` observed."""

    response: dict[str, Any]
    events: list[ClientEvent] = field(default_factory=list)
    bytes_sent: int = 0
    appends: int = 0


def longlived_url(url: str) -> str:
    """``url`` asking for the long-lived protocol (``?protocol=longlived``, added unless already there)."""
    sep = "&" if "?" in url else "?"
    return url if "protocol=longlived" in url else f"{url}{sep}protocol=longlived"


class LongLivedClient(WebSocketClient):
    """``async with LongLivedClient(url) as client: result = await client.rollout(request, tools)``."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        max_size: int | None = 2**24,
        *,
        observer: Observer | None = None,
        clock: Clock = DEFAULT_CLOCK,
        ping_interval: float | None = 20.0,
        open_timeout: float | None = 10.0,
    ) -> None:
        super().__init__(
            longlived_url(url),
            api_key,
            observer=observer,
            clock=clock,
            max_size=max_size,
            ping_interval=ping_interval,
            open_timeout=open_timeout,
        )

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

        t = await self.send(messages.create(request))
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
                outputs = await asyncio.gather(
                    *(self._run_tool(tools, calls, call, note) for call in pending)
                )
                t = await self.send(messages.append(outputs))
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
        started = self.clock()
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
        done = self.clock()
        note(
            ClientEvent(
                done,
                {
                    "type": "client.tool.done",
                    "call_id": call_id,
                    "name": name,
                    "duration_ms": (done - started) * 1e3,
                },
            )
        )
        return messages.function_call_output(call_id, output)


def _calls_by_id(response: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["call_id"]: item for item in messages.function_calls(response)}
