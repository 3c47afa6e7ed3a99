"""Decoding client frames and items, encoding server events. Every encoder/decoder is built once."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from proto.core.errors import ClientError, param_from_validation
from proto.core.events import CLIENT_EVENT_TYPES, AnyServerEvent, ClientEvent, CreateBody
from proto.core.items import FunctionCall, FunctionCallOutput, Item, ItemReference, Message
from proto.core.limits import MAX_CALL_ID, check_length, out_of_range

_T = TypeVar("_T")
_event_decoder = msgspec.json.Decoder(ClientEvent)
_body_decoder = msgspec.json.Decoder(CreateBody)
_item_decoder = msgspec.json.Decoder(Item)
_message_decoder = msgspec.json.Decoder(Message)
_reference_decoder = msgspec.json.Decoder(ItemReference)
_any_decoder = msgspec.json.Decoder()
_server_decoder = msgspec.json.Decoder(AnyServerEvent)
_encoder = msgspec.json.Encoder()

# The request header a client sets to "items" to ask for the item cache (the ``http-cached`` mode:
# docs/protocol.md, "The item cache (`http-cached`)"), shared by the HTTP transport and the clients.
CACHE_HEADER = "x-responses-lab-cache"


def decode_client_event(data: str | bytes) -> ClientEvent:
    """One WebSocket text frame → one typed client event, or a ``ClientError`` naming what is wrong."""
    try:
        return _event_decoder.decode(data)
    except msgspec.ValidationError as exc:
        if (valid := _valid_elsewhere(data)) is not None:
            return decode_client_event(valid)
        raise _classify(data, exc) from None
    except msgspec.DecodeError as exc:
        raise ClientError("invalid_json", f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec raises RecursionError (not DecodeError) past its nesting limit: still the peer's input.
        raise ClientError("invalid_json", "frame is nested too deeply") from None
    except UnicodeEncodeError:
        raise ClientError("invalid_json", "frame is not valid UTF-8 (lone surrogate)") from None


_MISSING_FIELD = re.compile(r"(?:missing required|contains unknown) field `([^`]+)`")


def _param(exc: msgspec.ValidationError, prefix: str = "") -> str | None:
    # msgspec names the object that lacks (or has an unknown) field, not the field: point ``param`` at the
    # field itself.
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
        param = _param(exc)
        return ClientError(event_fault_code(_kind_prefix(data), param), str(exc), param)
    except msgspec.DecodeError as bad:
        return ClientError("invalid_json", f"frame is not valid JSON: {bad}")
    except RecursionError:
        return ClientError("invalid_json", "frame is nested too deeply")
    if not isinstance(raw, dict):
        return ClientError("invalid_event", f"an event must be a JSON object, got {type(raw).__name__}")
    event_type = raw.get("type")
    if not isinstance(event_type, str):
        return ClientError("invalid_event", "an event needs a string field `type`", "$.type")
    if event_type not in CLIENT_EVENT_TYPES:
        return ClientError("unknown_event_type", f"unknown event type {event_type!r}", "$.type")
    param = _param(exc)
    return _range_error(exc, raw, param) or ClientError(
        event_fault_code(event_type, param), _message(exc), param
    )


_ENVELOPE = frozenset({"$.type", "$.event_id", "$.stream_id"})
_KIND = re.compile(rb'"type"\s*:\s*"([a-z._]+)"')


def _kind_prefix(data: str | bytes) -> str:
    """The event type of a frame no decoder can hold (its first ``"type"`` is the event's own)."""
    m = _KIND.search(data.encode() if isinstance(data, str) else data)
    return m[1].decode() if m else ""


def event_fault_code(kind: str, param: str | None) -> str:
    """A fault in the body a ``response.create`` carries, or in an item of any event, is the same fault
    as in an HTTP body: ``invalid_request`` on every transport. ``invalid_event`` is for
    the event's own envelope: its ``type``, ``event_id``, an append's ``input`` that is not a list."""
    if param is None or param in _ENVELOPE:
        return "invalid_event"
    if kind == "response.create" or param.startswith("$.input["):
        return "invalid_request"
    return "invalid_event"


_TAG = re.compile(r"Invalid value '([^']*)' - at `\$[^`]*\.type`")


def _message(exc: msgspec.ValidationError) -> str:
    """msgspec's message, with an unknown ``type`` named as what it is: an undocumented type."""
    text = str(exc)
    if m := _TAG.search(text):
        return f"undocumented type {m[1]!r} (not a type of the Responses API) - {text.rsplit(' - ', 1)[-1]}"
    return text


def decode_body(data: str | bytes) -> CreateBody:
    """The body of ``POST /v1/responses``; ``param`` in OpenAI's spelling (``input[0].call_id``)."""
    return decode_request(data, _body_decoder)


def decode_request(data: str | bytes, decoder: msgspec.json.Decoder[_T]) -> _T:
    """A request body through ``decoder``: ``invalid_json``, or ``invalid_request`` naming the failing field
    as OpenAI does."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        if (valid := _valid_elsewhere(data)) is not None:
            return decode_request(valid, decoder)
        raise request_error(exc, data) from None
    except msgspec.DecodeError as exc:
        raise ClientError("invalid_json", f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ClientError("invalid_json", "body is nested too deeply") from None


def _valid_elsewhere(data: str | bytes) -> bytes | None:
    """A create body the SDK's types refuse but the Open Responses schema allows, rewritten to what it
    means (docs/protocol.md, "The create body, items and tools": "Valid shapes the SDK's types lack"):
    ``tools: null`` (the schema's ``tools`` is nullable: no tools), a ``text.format`` without ``type`` (the
    schema's ``TextResponseFormat.type`` defaults to ``text``), an ``allowed_tools`` choice without ``mode``
    (``auto``, OpenAI's default for a choice) or with ``mode: "none"`` (the schema's ``ToolChoiceValueEnum``:
    no tool may be called, which is ``tool_choice: "none"``). None when nothing applies: the error stands.
    Only on the error path, so a valid body is decoded once."""
    raw = _raw(data)
    if not isinstance(raw, dict):
        return None
    fixed = False
    if "tools" in raw and raw["tools"] is None:
        del raw["tools"]
        fixed = True
    text = raw.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(text, dict) and isinstance(fmt, dict) and "type" not in fmt:
        text["format"] = {**fmt, "type": "json_schema" if {"name", "schema"} & fmt.keys() else "text"}
        fixed = True
    choice = raw.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        if "mode" not in choice:
            choice["mode"] = "auto"
            fixed = True
        elif choice["mode"] == "none":
            raw["tool_choice"] = "none"
            fixed = True
    return _encoder.encode(raw) if fixed else None


def request_error(exc: msgspec.ValidationError, data: str | bytes | None = None) -> ClientError:
    """A request body that does not fit its type: ``invalid_request`` naming the field as OpenAI does; an
    integer past its bound in OpenAI's code and words (``data``, the body, gives the value it names)."""
    param = body_param(_param(exc))
    if data is not None and (error := _range_error(exc, _raw(data), param)) is not None:
        return error
    return ClientError("invalid_request", _message(exc), param)


_BOUND = re.compile(r"^Expected `int` (<=|>=) (-?\d+) - at `\$([^`]*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def _range_error(exc: msgspec.ValidationError, raw: Any, param: str | None) -> ClientError | None:
    """An integer outside its documented range (``msgspec.Meta`` bounds: ``CreateBody``'s, and every
    request integer's int64 in ``openai_types``) as OpenAI refuses it (``proto/core/limits.py``), its
    value read back from the decoded ``raw`` at the error's path; None for any other misfit."""
    m = _BOUND.match(str(exc))
    if m is None or param is None:
        return None
    value: Any = raw
    for name, index in _STEP.findall(m[3]):
        try:
            value = value[name] if name else value[int(index)]
        except (KeyError, IndexError, TypeError):
            value = None
            break
    shown = value if isinstance(value, int) and not isinstance(value, bool) else None
    return out_of_range(param, shown, m[2], above=m[1] == "<=", name=body_param(param))


def _raw(data: str | bytes | msgspec.Raw) -> Any:
    """``data`` as plain JSON values (on an error path only), or None when no Python value holds it."""
    try:
        return _any_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None


def body_param(param: str | None) -> str | None:
    """``$.input[0].call_id`` → ``input[0].call_id``: HTTP and GA WebSocket name fields as OpenAI does
    (the long-lived protocol keeps the JSONPath of the event)."""
    if param is None or param == "$":
        return None
    return param[2:] if param.startswith("$.") else param


def decode_items(
    raw_items: str | list[msgspec.Raw], path: str = "$.input", code: str = "invalid_request"
) -> list[Item]:
    """Items one by one, so an error names its index; a bare string is one user message. A malformed
    item is ``invalid_request`` on every transport (``code`` lets a caller say otherwise)."""
    if isinstance(raw_items, str):
        return [Message(role="user", content=raw_items)]
    items: list[Item] = []
    for index, raw in enumerate(raw_items):
        item = _decode_item(raw, f"{path}[{index}]", code)
        if isinstance(item, FunctionCall | FunctionCallOutput):  # OpenAI's limit (and the spec's)
            check_length(f"{path}[{index}].call_id", item.call_id, MAX_CALL_ID, required=True)
        items.append(item)
    return items


def _decode_item(raw: msgspec.Raw, path: str, code: str) -> Item:
    try:
        return _item_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        if (valid := _status_dropped(raw)) is not None:
            return _decode_item(valid, path, code)
        if "missing required field `type`" not in str(exc):
            param = _param(exc, path)
            raise _range_error(exc, _raw(raw), param) or ClientError(code, _message(exc), param) from None
    except RecursionError:
        raise ClientError(code, "item is nested too deeply", path) from None
    # No ``type``: OpenAI accepts a message as ``{"role", "content"}`` and an item reference as ``{"id"}``.
    try:
        shape = _any_decoder.decode(raw)
        decoder = (
            _message_decoder
            if isinstance(shape, dict) and ("role" in shape or "id" not in shape)
            else _reference_decoder
        )
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        param = _param(exc, path)
        raise _range_error(exc, _raw(raw), param) or ClientError(code, _message(exc), param) from None
    except RecursionError:
        raise ClientError(code, "item is nested too deeply", path) from None


def _status_dropped(raw: msgspec.Raw) -> msgspec.Raw | None:
    """A message whose ``status`` is a string outside the SDK's enum (``""``): the Open Responses schema
    types an input message's ``status`` as any string, and an input's status is the client's own report,
    which nothing reads, so it is dropped (docs/protocol.md, "Valid shapes the SDK's types lack"). None
    for any other item: its error stands."""
    shape = _raw(raw)
    if not isinstance(shape, dict) or shape.get("type", "message") != "message":
        return None
    status = shape.get("status")
    if not isinstance(status, str) or status in ("in_progress", "completed", "incomplete"):
        return None
    del shape["status"]
    return msgspec.Raw(_encoder.encode(shape))


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def decode_server_event(data: str | bytes) -> AnyServerEvent:
    """For clients and tests: one server frame → its typed event."""
    return _server_decoder.decode(data)
