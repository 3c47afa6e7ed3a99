"""Decoding client frames and items, encoding server events. Every encoder/decoder is built once."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from proto.errors import ClientError, param_from_validation
from proto.events import CLIENT_EVENT_TYPES, AnyServerEvent, ClientEvent, CreateBody
from proto.items import EasyMessage, Item, Message

_event_decoder = msgspec.json.Decoder(ClientEvent)
_body_decoder = msgspec.json.Decoder(CreateBody)
_item_decoder = msgspec.json.Decoder(Item)
_easy_decoder = msgspec.json.Decoder(EasyMessage)
_any_decoder = msgspec.json.Decoder()
_server_decoder = msgspec.json.Decoder(AnyServerEvent)
_encoder = msgspec.json.Encoder()


def decode_client_event(data: str | bytes) -> ClientEvent:
    """One WebSocket text frame → one typed client event, or a ``ClientError`` naming what is wrong."""
    try:
        return _event_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _classify(data, exc) from None
    except msgspec.DecodeError as exc:
        raise ClientError("invalid_json", f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec raises RecursionError (not DecodeError) past its nesting limit: still the peer's input.
        raise ClientError("invalid_json", "frame is nested too deeply") from None
    except UnicodeEncodeError:
        raise ClientError("invalid_json", "frame is not valid UTF-8 (lone surrogate)") from None


_MISSING_FIELD = re.compile(r"missing required field `([^`]+)`")


def _param(exc: msgspec.ValidationError, prefix: str = "") -> str | None:
    # msgspec names the object that lacks a field, not the field: point ``param`` at the field itself.
    param = param_from_validation(exc, prefix)
    missing = _MISSING_FIELD.search(str(exc))
    return f"{param or '$'}.{missing.group(1)}" if missing else param


def _classify(data: str | bytes, exc: msgspec.ValidationError) -> ClientError:
    # Only on the error path: look at the raw object to tell "unknown type" from "bad field".
    # The typed decoder stops at the first misfit, so the rest of the frame may not even be JSON.
    try:
        raw: Any = _any_decoder.decode(data)
    except msgspec.ValidationError:
        # Valid JSON that no Python value holds (a number out of range): still a bad field.
        return ClientError("invalid_event", str(exc), _param(exc))
    except msgspec.DecodeError as bad:
        return ClientError("invalid_json", f"frame is not valid JSON: {bad}")
    except RecursionError:
        return ClientError("invalid_json", "frame is nested too deeply")
    if not isinstance(raw, dict):
        return ClientError("invalid_event", f"an event must be a JSON object, got {type(raw).__name__}")
    kind = raw.get("type")
    if not isinstance(kind, str):
        return ClientError("invalid_event", "an event needs a string field `type`", "$.type")
    if kind not in CLIENT_EVENT_TYPES:
        return ClientError("unknown_event_type", f"unknown event type {kind!r}", "$.type")
    return ClientError("invalid_event", str(exc), _param(exc))


def decode_body(data: str | bytes) -> CreateBody:
    """The body of ``POST /v1/responses``; ``param`` in OpenAI's spelling (``input[0].call_id``)."""
    try:
        return _body_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise ClientError("invalid_request", str(exc), body_param(_param(exc))) from None
    except msgspec.DecodeError as exc:
        raise ClientError("invalid_json", f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ClientError("invalid_json", "body is nested too deeply") from None


def body_param(param: str | None) -> str | None:
    """``$.input[0].call_id`` → ``input[0].call_id``: HTTP and GA WebSocket name fields as OpenAI does
    (the long-lived protocol keeps the JSONPath of the event)."""
    if param is None or param == "$":
        return None
    return param[2:] if param.startswith("$.") else param


def decode_items(raw_items: str | list[msgspec.Raw], path: str = "$.input", code: str = "invalid_request") -> list[Item]:
    """Items one by one, so an error names its index; a bare string is one user message.

    ``code`` is what a malformed item is called: ``invalid_request`` for an HTTP body, ``invalid_event``
    for an item inside a WebSocket event (docs/protocol.md §3)."""
    if isinstance(raw_items, str):
        return [Message(role="user", content=raw_items)]
    items: list[Item] = []
    for index, raw in enumerate(raw_items):
        items.append(_decode_item(raw, f"{path}[{index}]", code))
    return items


def _decode_item(raw: msgspec.Raw, path: str, code: str) -> Item:
    try:
        return _item_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        if "missing required field `type`" not in str(exc):
            raise ClientError(code, str(exc), _param(exc, path)) from None
    except RecursionError:
        raise ClientError(code, "item is nested too deeply", path) from None
    try:
        easy = _easy_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise ClientError(code, str(exc), _param(exc, path)) from None
    except RecursionError:
        raise ClientError(code, "item is nested too deeply", path) from None
    return Message(role=easy.role, content=easy.content)


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def decode_server_event(data: str | bytes) -> AnyServerEvent:
    """For clients and tests: one server frame → its typed event."""
    return _server_decoder.decode(data)

