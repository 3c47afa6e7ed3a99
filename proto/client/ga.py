"""A client for GA WebSocket mode (docs/protocol.md, "4. GA WebSocket mode"): one connection, a flat
``response.create`` per response; each response ends at its first local call and the next one continues
it with ``previous_response_id`` and only the new items (``messages.continuation``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import proto.client.messages as messages
from proto.client.errors import ProtocolFailure
from proto.client.ws import WebSocketClient
from proto.core.events import TERMINAL_TYPES


class GaClient(WebSocketClient):
    """``async with GaClient(url) as client: response = await client.create(body)``."""

    async def create(self, body: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """One response on the default lane: ``body`` sent as a ``response.create``, its events received to
        the terminal one; returns that event's Response. An ``error`` event raises ProtocolFailure (the
        connection stays usable: a refused create sends nothing else)."""
        await self.send(messages.create(body))
        while True:
            event = await self.recv(timeout)
            if event.type == "error":
                raise ProtocolFailure(event.data.get("error") or {})
            if event.type in TERMINAL_TYPES:
                return dict(event.data["response"])
