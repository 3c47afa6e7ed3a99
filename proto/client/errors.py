"""What the clients raise: the server refused or broke the exchange (the peer's doing, never a bug here)."""

from __future__ import annotations

from typing import Any


class ClientError(RuntimeError):
    """The server refused or broke an exchange."""


class ProtocolFailure(ClientError):
    """The server sent an ``error`` event (docs/protocol.md, "Error shapes")."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = error


class HttpStatusError(ClientError):
    """``POST /v1/responses`` answered with another status than 200."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status
        self.text = text


class StreamEnded(ClientError):
    """The stream or the connection ended before the response's terminal event."""
