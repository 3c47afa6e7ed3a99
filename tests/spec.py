"""Validation against the vendored Open Responses specification (tests/openresponses/openapi.json, version
2026-04-24): any JSON object against a component schema (JSON Schema Draft 2020-12, ``#/components/
schemas/...`` refs resolved through a ``referencing`` Registry), and the two things every e2e test checks —
a Response object and a streamed event.

Where this server follows OpenAI's API beyond the spec (docs/protocol.md, "Conformance"), the part the spec
has no schema for is checked against OpenAI's own types instead, never skipped:

* items of OpenAI's hosted and custom tools (``web_search_call``, ``custom_tool_call`` …), which the spec
  admits only slug-prefixed, and tools other than ``function`` (``web_search``, ``custom``, ``namespace``):
  each must decode as OpenAI's type (``proto.core.openai_types``, generated from the SDK); the object
  around them then validates against the spec's schema;
* a ``tool_choice`` the spec has no shape for (a hosted, ``custom`` or ``mcp`` choice, an ``allowed_tools``
  entry other than a function): it must convert to OpenAI's type; the spec then sees ``auto`` (the
  ``allowed_tools`` entries it does define are kept);
* ``text.format.schema`` of a ``json_schema`` format: the spec's ``JsonSchemaResponseFormat`` admits only
  ``null`` there, OpenAI echoes the schema the request sent: it must be a JSON object, and the rest of the
  format validates against the spec;
* events the spec does not define (the long-lived protocol's ``response.done`` and inject replies, hosted
  tools' progress events, custom tool input deltas, GA WebSocket's steer replies): their type must be one
  of ``EXTENSION_EVENTS``, a ``sequence_number`` an integer, and any ``response`` they carry a valid Response.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import msgspec
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from proto.core import openai_types as oa
from proto.core.events import CreateBody

SPEC_PATH = Path(__file__).resolve().parent / "openresponses" / "openapi.json"
SPEC_URI = "urn:openresponses:2026-04-24"

# Events outside the spec, each documented in docs/protocol.md (§3.2 the long-lived protocol, §4 GA mode).
EXTENSION_EVENTS = frozenset(
    {
        "response.done",  # long-lived: the response is suspended on tool calls
        "response.inject.created",
        "response.inject.failed",  # long-lived: replies to response.inject
        "response.steer.accepted",
        "response.steer.pending",
        "response.steer.failed",  # GA mode's beta steering
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.compaction.compacting",  # a compaction turn samples its summary (no content)
    }
)
_item_decoder = msgspec.json.Decoder(oa.InputItem)
_tool_decoder = msgspec.json.Decoder(oa.Tool)
_TOOL_CHOICE = next(f.type for f in msgspec.structs.fields(CreateBody) if f.name == "tool_choice")


@functools.cache
def spec() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    return document


@functools.cache
def _registry() -> Registry:  # type: ignore[type-arg]
    return Registry().with_resource(SPEC_URI, Resource(contents=spec(), specification=DRAFT202012))


@functools.cache
def validator(name: str) -> Draft202012Validator:
    if name not in spec()["components"]["schemas"]:
        raise KeyError(f"no component schema {name!r} in the Open Responses spec")
    return Draft202012Validator({"$ref": f"{SPEC_URI}#/components/schemas/{name}"}, registry=_registry())


@functools.cache
def _compiled(name: str) -> jsonschema_rs.Validator:
    """The same schema compiled (jsonschema_rs): ~1 us an event where the validator above takes ~90 us, so
    every event of the end-to-end tests can be checked (tests/conformance.py)."""
    validator(name)  # the name's check and error
    registry = jsonschema_rs.Registry([(SPEC_URI, spec())])
    return jsonschema_rs.Draft202012Validator(
        {"$ref": f"{SPEC_URI}#/components/schemas/{name}"}, registry=registry
    )


def schema_errors(value: Any, name: str) -> list[str]:
    """Every violation of ``#/components/schemas/NAME``, as ``path: message``."""
    errors = sorted(validator(name).iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}" for e in errors]


def check_schema(value: Any, name: str) -> None:
    if _compiled(name).is_valid(value):
        return
    errors = schema_errors(value, name) or [f"(root): not valid (jsonschema_rs: {_rs_error(value, name)})"]
    assert not errors, f"not a valid {name}:\n  " + "\n  ".join(errors) + f"\n{json.dumps(value)[:2000]}"


def _rs_error(value: Any, name: str) -> str:
    try:
        _compiled(name).validate(value)
    except jsonschema_rs.ValidationError as e:
        return str(e)[:300]
    return "valid"


@functools.cache
def _discriminated(name: str) -> frozenset[str]:
    """The ``type`` values a discriminated ``oneOf`` (ItemField, Tool) admits."""
    kinds: set[str] = set()
    for ref in spec()["components"]["schemas"][name]["oneOf"]:
        target = spec()["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
        kinds.update(target["properties"]["type"]["enum"])
    return frozenset(kinds)


@functools.cache
def event_schemas() -> dict[str, str]:
    """Event ``type`` → its component schema, for every streaming event the spec defines."""
    found: dict[str, str] = {}
    for name, schema in spec()["components"]["schemas"].items():
        if name.endswith("StreamingEvent"):
            for kind in schema["properties"]["type"]["enum"]:
                found[kind] = name
    return found


def _openai_item(item: dict[str, Any], where: str) -> None:
    try:
        _item_decoder.decode(json.dumps(item))
    except msgspec.ValidationError as e:
        raise AssertionError(
            f"{where}: {item.get('type')!r} is neither an Open Responses item nor a valid OpenAI one: {e}"
        ) from None


def _split_item(item: Any, where: str) -> Any:
    """The item if the spec defines its type; else checked as OpenAI's and ``None`` returned."""
    if isinstance(item, dict) and item.get("type") not in _discriminated("ItemField"):
        _openai_item(item, where)
        return None
    return item


def check_response(response: Any, where: str = "response") -> None:
    """A Response object: valid ``ResponseResource``, OpenAI-only items and tools checked as OpenAI's."""
    check_schema(_spec_part(response, where), "ResponseResource")


def _spec_part(response: Any, where: str) -> dict[str, Any]:
    """The Response with what the spec has no schema for checked as OpenAI's and left out."""
    assert isinstance(response, dict), f"{where}: not an object: {response!r}"
    body = copy.copy(response)
    output = [_split_item(item, f"{where}.output[{i}]") for i, item in enumerate(response.get("output", []))]
    body["output"] = [item for item in output if item is not None]
    tools = []
    for i, tool in enumerate(response.get("tools", [])):
        if isinstance(tool, dict) and tool.get("type") not in _discriminated("Tool"):
            try:
                _tool_decoder.decode(json.dumps(tool))
            except msgspec.ValidationError as e:
                raise AssertionError(f"{where}.tools[{i}]: not a valid OpenAI tool: {e}") from None
        else:
            tools.append(tool)
    body["tools"] = tools
    body["tool_choice"] = _spec_tool_choice(response.get("tool_choice"), where)
    fmt = (response.get("text") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        assert isinstance(fmt.get("schema"), dict), f"{where}.text.format.schema: not a JSON schema"
        body["text"] = {**response["text"], "format": {**fmt, "schema": None}}
    return body


def _spec_tool_choice(choice: Any, where: str) -> Any:
    """The part of a ``tool_choice`` the spec defines; the rest checked as OpenAI's."""
    if not isinstance(choice, dict) or choice.get("type") == "function":
        return choice
    try:
        msgspec.convert(choice, _TOOL_CHOICE)
    except msgspec.ValidationError as e:
        raise AssertionError(f"{where}.tool_choice: not a valid OpenAI tool_choice: {e}") from None
    if choice.get("type") == "allowed_tools":
        return {**choice, "tools": [t for t in choice.get("tools", []) if t.get("type") == "function"]}
    return "auto"


def check_compact(resource: Any) -> None:
    check_schema(resource, "CompactResource")


def check_event(event: Any, transport: str = "sse") -> None:
    """One streamed event (``transport``: ``sse``, ``ws`` — GA mode — or ``longlived``)."""
    assert isinstance(event, dict) and isinstance(event.get("type"), str), f"not an event: {event!r}"
    kind = event["type"]
    if kind == "error" and transport != "sse":
        check_schema(event, "WebSocketErrorEvent")  # the GA envelope: {"type", "status", "error": {...}}
        return
    where = f"{kind} #{event.get('sequence_number')}"
    body = copy.copy(event)
    if isinstance(event.get("response"), dict):
        # OpenAI's items, tools and fields checked here; the envelope's schema validates the rest.
        body["response"] = _spec_part(event["response"], f"{where}.response")
    if kind in EXTENSION_EVENTS:
        if "response" in body:
            check_schema(body["response"], "ResponseResource")
        if "sequence_number" in event:
            assert isinstance(event["sequence_number"], int), f"{where}: sequence_number is not an integer"
        for i, call in enumerate(event.get("pending_calls", [])):
            assert isinstance(call.get("call_id"), str) and isinstance(call.get("name"), str), (
                f"{where}.pending_calls[{i}]: {call!r}"
            )
        return
    assert kind in event_schemas(), (
        f"{where}: {kind!r} is neither an Open Responses event nor a documented extension"
    )
    if "item" in event:
        body["item"] = _split_item(event["item"], f"{where}.item")
    check_schema(body, event_schemas()[kind])


def _minimal_response(response: dict[str, Any]) -> dict[str, Any]:
    return {
        **response,
        "output": [i for i in response.get("output", []) if i.get("type") in _discriminated("ItemField")],
        "tools": [t for t in response.get("tools", []) if t.get("type") in _discriminated("Tool")],
    }


# The Conversations API: the spec has no schema for it, so its objects are checked against OpenAI's own
# types (the ``openai`` SDK's ``types/conversations``, pydantic models that enforce required fields), and
# each item also against the spec's ``ItemField`` where the spec defines its type.
@functools.cache
def _conversation_types() -> dict[str, Any]:
    import pydantic
    from openai.types import conversations as t

    return {
        "conversation": t.Conversation,
        "conversation.deleted": t.ConversationDeletedResource,
        "list": t.ConversationItemList,
        "item": pydantic.TypeAdapter(t.ConversationItem),
    }


def check_conversation_item(item: Any, where: str = "item") -> None:
    assert isinstance(item, dict) and isinstance(item.get("id"), str), f"{where}: no id: {item!r}"
    if item.get("type") in _discriminated("ItemField"):
        check_schema(item, "ItemField")
    try:
        _conversation_types()["item"].validate_python(item)
    except ValueError as e:
        raise AssertionError(f"{where}: not a valid OpenAI ConversationItem: {str(e)[:600]}") from None


def check_conversation_object(value: Any) -> None:
    """A ``conversation``, ``conversation.deleted`` or a (non-empty) conversation items ``list``, exactly
    OpenAI's fields, every item checked."""
    assert isinstance(value, dict), value
    kind = value.get("object")
    fields = {
        "conversation": {"id", "object", "created_at", "metadata"},
        "conversation.deleted": {"id", "object", "deleted"},
        "list": {"object", "data", "first_id", "last_id", "has_more"},
    }
    assert kind in fields and set(value) == fields[str(kind)], value
    if kind == "list" and not value["data"]:  # no ids to name: OpenAI's type has them as strings
        assert value["first_id"] is None and value["last_id"] is None and value["has_more"] is False
        return
    try:
        _conversation_types()[str(kind)].model_validate(value)
    except ValueError as e:
        raise AssertionError(f"not a valid OpenAI {kind}: {str(e)[:600]}") from None
    for index, item in enumerate(value.get("data", [])):
        check_conversation_item(item, f"data[{index}]")
