"""API keys: ``Authorization: Bearer KEY`` on every endpoint, the WebSocket handshake included."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from proto.core.errors import ClientError, HttpErrorEnvelope, retry_headers
from proto.server.config import check_keys
from proto.server.storage.ledger import fingerprint_api_key

KeyedEndpoint = Callable[[Request, str], Awaitable[Response]]
_encoder = msgspec.json.Encoder()


def error_response(exc: ClientError) -> Response:
    """OpenAI's JSON error body, with the status its code is registered with."""
    return Response(
        _encoder.encode(HttpErrorEnvelope(exc.body())),
        status_code=exc.status,
        headers=retry_headers(exc.retry_after_s),
        media_type="application/json",
    )


def unauthorized() -> ClientError:
    return ClientError("unauthorized", "missing or invalid API key")


class Auth:
    def __init__(self, keys: list[str]) -> None:
        check_keys(keys)  # a blank key would match a blank token: refused before anything serves
        self._keys = [key.strip().encode() for key in keys]

    @property
    def open(self) -> bool:
        return not self._keys

    def identify(self, headers: Headers) -> str | None:
        """The caller's ``api_key_id`` (a fingerprint, never the key), or None when refused."""
        if self.open:
            return fingerprint_api_key(None)
        scheme, _, raw = headers.get("authorization", "").partition(" ")
        token = raw.strip()  # stripped before the emptiness check: a blank token is no token
        if scheme.lower() != "bearer" or not token:
            return None
        given = token.encode()
        # Compare against every key in constant time: no early exit that leaks which prefix matched.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(given, key)
        return fingerprint_api_key(token) if matched else None

    def guard(self, endpoint: KeyedEndpoint) -> Callable[[Request], Awaitable[Response]]:
        """An HTTP endpoint that runs only for a known key, and is handed that key's ``api_key_id``."""

        async def guarded(request: Request) -> Response:
            key_id = self.identify(request.headers)
            if key_id is None:
                return error_response(unauthorized())
            return await endpoint(request, key_id)

        return guarded
