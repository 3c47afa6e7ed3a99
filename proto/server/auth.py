"""API keys: ``Authorization: Bearer KEY`` on every endpoint, the WebSocket handshake included."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers

from proto.server.ledger import fingerprint_api_key


class Auth:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [key.encode() for key in keys]

    @property
    def open(self) -> bool:
        return not self._keys

    def identify(self, headers: Headers) -> str | None:
        """The caller's ``api_key_id`` (a fingerprint, never the key), or None when refused."""
        if self.open:
            return fingerprint_api_key(None)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        given = token.strip().encode()
        # Compare against every key in constant time: no early exit that leaks which prefix matched.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(given, key)
        return fingerprint_api_key(token.strip()) if matched else None
