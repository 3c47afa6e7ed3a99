"""Errors, typed by whose fault they are (after h11's ``LocalProtocolError`` / ``RemoteProtocolError``).

``ClientError`` is the peer's bad input: it becomes one ``error`` event (WebSocket) or an OpenAI JSON error
body (HTTP) with a stable ``code``, and the connection keeps serving. ``LocalProtocolError`` is our own
misuse of the core (a bug): it is never sent to the peer as if it were their fault.
"""

from __future__ import annotations

import math

import msgspec

# code -> (HTTP status, OpenAI error type). One table so every transport reports the same thing.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid_json": (400, "invalid_request_error"),
    "invalid_event": (400, "invalid_request_error"),
    "invalid_request": (400, "invalid_request_error"),
    "unknown_event_type": (400, "invalid_request_error"),
    "no_open_response": (400, "invalid_request_error"),
    "response_in_progress": (409, "invalid_request_error"),
    "unknown_call_id": (400, "invalid_request_error"),
    "duplicate_call_output": (400, "invalid_request_error"),
    "response_already_completed": (409, "invalid_request_error"),
    "response_not_found": (404, "invalid_request_error"),
    "model_not_found": (404, "invalid_request_error"),
    # OpenAI's status and wording on HTTP and WebSocket alike: 400, "Previous response with id '…' not found."
    "previous_response_not_found": (400, "invalid_request_error"),
    "item_not_found": (404, "invalid_request_error"),
    "conversation_not_found": (404, "invalid_request_error"),
    "message_too_large": (413, "invalid_request_error"),
    "invalid_encoding": (400, "invalid_request_error"),
    "invalid_encrypted_content": (
        400,
        "invalid_request_error",
    ),  # OpenAI's code: encrypted content it cannot read
    "unsupported_encoding": (415, "invalid_request_error"),
    "tool_timeout": (408, "invalid_request_error"),
    "too_many_items": (400, "invalid_request_error"),
    "too_many_tools": (400, "invalid_request_error"),
    "too_many_pending_calls": (400, "invalid_request_error"),
    "too_many_queued_items": (400, "invalid_request_error"),
    # GA WebSocket lanes, the codes the openai SDK's lane session names: a malformed stream_id, and a
    # connection past its distinct named lanes
    "invalid_stream_id": (400, "invalid_request_error"),
    "websocket_stream_limit_reached": (400, "invalid_request_error"),
    "binary_frame_not_supported": (400, "invalid_request_error"),
    "content_policy": (400, "invalid_request_error"),
    "context_length_exceeded": (
        400,
        "invalid_request_error",
    ),  # OpenAI's code: prompt past the model's window
    "empty_array": (400, "invalid_request_error"),  # OpenAI's code for an empty list where items are required
    # OpenAI's codes for a string past its documented length or empty where one is required, and a map
    # with too many pairs (``proto/core/limits.py``)
    "string_above_max_length": (400, "invalid_request_error"),
    "empty_string": (400, "invalid_request_error"),
    "invalid_value": (400, "invalid_request_error"),  # OpenAI's: a function tool's name off its pattern
    "integer_below_min_value": (400, "invalid_request_error"),
    "integer_above_max_value": (400, "invalid_request_error"),
    "object_above_max_properties": (400, "invalid_request_error"),
    "unauthorized": (401, "authentication_error"),
    "websocket_connection_limit_reached": (400, "invalid_request_error"),
    # Refused at the door, nothing started (docs/protocol.md, "Admission"): OpenAI's code and status for a
    # request over a limit, with the type its request-count limits carry; the retry hint goes with it.
    "rate_limit_exceeded": (429, "requests"),
    "server_overloaded": (503, "server_error"),
    "engine_failure": (500, "server_error"),
    "server_shutting_down": (503, "server_error"),
    "store_unavailable": (503, "server_error"),
    "ledger_unavailable": (503, "server_error"),
    "server_error": (500, "server_error"),
}


class ClientError(Exception):
    """The peer sent something we refuse; carries what the wire error needs."""

    def __init__(
        self, code: str, message: str, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        if code not in ERROR_CODES:
            raise LocalProtocolError(f"unregistered error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s  # a retry hint: sent as ``retry_headers`` on every transport

    @property
    def status(self) -> int:
        return ERROR_CODES[self.code][0]

    @property
    def type(self) -> str:
        return ERROR_CODES[self.code][1]

    def body(self) -> ErrorBody:
        return ErrorBody(type=self.type, code=self.code, message=self.message, param=self.param)


def retry_headers(retry_after_s: float | None) -> dict[str, str]:
    """The retry hint as OpenAI's SDKs read it: ``retry-after-ms`` first (milliseconds, the exact wait),
    then ``retry-after`` (whole seconds, RFC 9110's delay-seconds, rounded up). Over HTTP they are response
    headers; over WebSocket the error envelope's ``headers`` object (Codex reads it there). Empty: no hint."""
    if retry_after_s is None:
        return {}
    return {"retry-after-ms": str(round(retry_after_s * 1000)), "retry-after": str(math.ceil(retry_after_s))}


class LocalProtocolError(Exception):
    """Our own code drove a core into a state the protocol does not allow (a bug, not the peer's fault)."""


class ErrorBody(msgspec.Struct, kw_only=True):
    type: str
    code: str | None
    message: str
    param: str | None = None


class HttpErrorEnvelope(msgspec.Struct):
    error: ErrorBody


def param_from_validation(exc: msgspec.ValidationError, prefix: str = "") -> str | None:
    """msgspec reports the failing path as ``... - at `$.input[3].call_id```: pass it on as ``param``."""
    text = str(exc)
    marker = "at `$"
    at = text.rfind(marker)
    if at < 0:
        return prefix or None
    path = text[at + len(marker) : text.rfind("`")]
    return f"{prefix}{path}" if prefix else f"${path}"
