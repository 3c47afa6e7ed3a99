"""Validation of one create body (``POST /v1/responses``, a GA or a long-lived ``response.create``), sans-IO.

The checks live here, once, for every transport, with the same code on each (a bad item or field is
``invalid_request`` everywhere); only the spelling of ``param`` differs: HTTP and GA name fields as OpenAI
does (``input[0].call_id``), the long-lived protocol by the event's JSONPath (``$.input[0].call_id``).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from proto.core import codec
from proto.core.compaction import check_compactions
from proto.core.errors import ClientError
from proto.core.events import CreateBody
from proto.core.items import (
    CALL_ITEMS,
    OUTPUT_ITEMS,
    CompactionTrigger,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    Item,
    ItemReference,
    Tool,
    custom_tool_names,
    function_tool_names,
)
from proto.core.limits import (
    MAX_PROMPT_CACHE_KEY,
    MAX_SAFETY_IDENTIFIER,
    MIN_MAX_OUTPUT_TOKENS,
    check_at_least,
    check_length,
    check_metadata,
    check_tool_name,
)
from proto.core.openai_types import (
    Mcp,
    ReasoningReasoning,
    ResponseConfigurationUpdateItem,
    ResponseTextConfig,
    ToolChoiceAllowed,
)
from proto.core.work import WorkCounters


@dataclass(frozen=True)
class CreateLimits:
    """Per-request limits; each is a server flag (``--max-input-items`` …)."""

    max_input_items: int = 2048
    max_tools: int = 128


# ``background_options.completion_window`` (the SDK's ``BackgroundOptions``): "The `2h` and `8h`
# completion windows require `background: true`, Standard processing, and `stream: false` or omitted."
WINDOWS = frozenset({"2h", "8h"})
STANDARD_TIERS = frozenset({None, "auto", "default"})


def check_completion_window(body: CreateBody, root: str) -> None:
    options = body.background_options
    if options is None or options.completion_window not in WINDOWS:
        return  # ``soonest`` (the default) asks for nothing
    if not body.background or body.stream or body.service_tier not in STANDARD_TIERS:
        raise ClientError(
            "invalid_request",
            f"completion_window {options.completion_window!r} requires background: true, the default "
            "service tier, and stream: false",
            f"{root}background_options.completion_window",
        )


def configured(request: CreateBody, items: Sequence[Item]) -> CreateBody:
    """The request with the settings its context's ``configuration_update`` items put in effect: "Supply
    reasoning, text, or both. Each setting stays in effect until a later update replaces it" (the SDK's
    ``ResponseConfigurationUpdateItem``). The latest update of each setting in the context wins over the
    request's own ``text`` / ``reasoning`` (docs/protocol.md, "Newer fields")."""
    text, reasoning = request.text, request.reasoning
    for item in items:
        if isinstance(item, ResponseConfigurationUpdateItem):
            if item.text is not None:
                text = ResponseTextConfig(format=item.text.format)
            if item.reasoning is not None:
                base = msgspec.to_builtins(reasoning) if reasoning is not None else {}
                update = msgspec.to_builtins(item.reasoning)
                reasoning = msgspec.convert({**base, **update}, ReasoningReasoning)
    if text is request.text and reasoning is request.reasoning:
        return request
    return msgspec.structs.replace(request, text=text, reasoning=reasoning)


def validate_create(
    body: CreateBody,
    known_models: Container[str],
    limits: CreateLimits,
    root: str = "",
    item_code: str = "invalid_request",
    refuse_background: bool = True,
) -> tuple[list[Item], WorkCounters]:
    """The body's input items, decoded one by one, and the work counted doing it; ``ClientError`` with
    the failing path as ``param`` otherwise (``root`` prefixes it: ``"$."`` for an event's JSONPath).

    ``background: true`` is refused where it has no meaning (GA WebSocket: the Open Responses spec says it
    MUST NOT be sent there); HTTP runs it (``refuse_background=False``: docs/protocol.md, "Background
    mode") and the long-lived ``response.create`` ignores it ("Client events").

    Without ``previous_response_id`` or ``conversation`` (which cannot both be given) every
    ``function_call_output`` must answer a call in the same input (OpenAI checks this too); a
    continuation's outputs, and an input with ``item_reference`` items, are checked once the history is
    loaded and the references resolved (``check_outputs``), because only then are their calls known.
    """
    if refuse_background and body.background:
        raise ClientError("invalid_request", "background responses are not supported", f"{root}background")
    if body.model not in known_models:
        raise ClientError("model_not_found", f"the model {body.model!r} does not exist", f"{root}model")
    if len(body.tools) > limits.max_tools:
        raise ClientError("too_many_tools", f"at most {limits.max_tools} tools", f"{root}tools")
    if not isinstance(body.input, str) and len(body.input) > limits.max_input_items:
        raise ClientError("too_many_items", f"at most {limits.max_input_items} input items", f"{root}input")
    if body.conversation is not None and body.previous_response_id is not None:  # OpenAI's rule
        raise ClientError(
            "invalid_request",
            "conversation and previous_response_id cannot both be given",
            f"{root}conversation",
        )
    check_length(f"{root}prompt_cache_key", body.prompt_cache_key, MAX_PROMPT_CACHE_KEY)
    check_length(f"{root}safety_identifier", body.safety_identifier, MAX_SAFETY_IDENTIFIER)
    check_metadata(body.metadata, f"{root}metadata")
    check_at_least(f"{root}max_output_tokens", body.max_output_tokens, MIN_MAX_OUTPUT_TOKENS)
    for index, tool in enumerate(body.tools):
        if isinstance(tool, FunctionTool):
            check_tool_name(f"{root}tools[{index}].name", tool.name)
    check_tool_choice(body, root)
    check_completion_window(body, root)
    work = WorkCounters(requests_validated=1)
    items = codec.decode_items(body.input, f"{root}input", item_code)
    work.items_validated += len(items)
    check_compactions(items, f"{root}input")
    for index, item in enumerate(items[:-1]):
        if isinstance(item, CompactionTrigger):  # OpenAI's rule: it compacts what comes before it
            message = "a compaction_trigger must be the final input item"
            raise ClientError("invalid_request", message, f"{root}input[{index}]")
    continues = body.previous_response_id is not None or body.conversation is not None
    if not continues and not any(isinstance(item, ItemReference) for item in items):
        check_outputs([], items, root)
    return items, work


def check_outputs(history: list[Item], items: list[Item], root: str = "") -> None:
    """Each ``function_call_output`` / ``custom_tool_call_output`` in ``items`` answers a call of the
    same kind in ``history + items``, at most once."""
    calls = {(type(item), item.call_id) for item in (*history, *items) if isinstance(item, CALL_ITEMS)}
    answered = {item.call_id for item in history if isinstance(item, OUTPUT_ITEMS)}
    for index, item in enumerate(items):
        if not isinstance(item, OUTPUT_ITEMS):
            continue
        kind = ANSWERS[type(item)]
        if (kind, item.call_id) not in calls:
            raise ClientError(
                "unknown_call_id",
                f"no {_CALL_NAMES[kind]} with call_id {item.call_id!r}",
                f"{root}input[{index}].call_id",
            )
        if item.call_id in answered:
            raise ClientError(
                "duplicate_call_output",
                f"call {item.call_id!r} already has an output",
                f"{root}input[{index}].call_id",
            )
        answered.add(item.call_id)


# Which call an output answers.
ANSWERS: dict[type, type] = {FunctionCallOutput: FunctionCall, CustomToolCallOutput: CustomToolCall}
_CALL_NAMES: dict[type, str] = {FunctionCall: "function_call", CustomToolCall: "custom_tool_call"}


# ``tool_choice`` names a tool the request offers (docs/protocol.md, "Guarantees"), as OpenAI's API checks:
# a forced tool or an ``allowed_tools`` entry that ``tools`` lacks is refused with its message, "Tool
# choice 'NAME' not found in 'tools' parameter." (a hosted tool's NAME is its type). The hosted types
# answer to every spelling of their family (a ``web_search_preview`` choice for a ``web_search`` tool),
# so no request OpenAI accepts is refused.
_FAMILIES = {"web_search_preview": "web_search", "web_search_preview_2025_03_11": "web_search"}
_FAMILIES |= {"web_search_2025_08_26": "web_search", "computer_use_preview": "computer"}
_FAMILIES |= {"computer_use": "computer", "local_shell": "shell"}


def check_tool_choice(body: CreateBody, root: str = "") -> None:
    """A forced ``tool_choice`` (or each ``allowed_tools`` entry) names a tool in ``body.tools``."""
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return
    if isinstance(choice, ToolChoiceAllowed):
        entries = [(entry, f"{root}tool_choice.tools[{index}]") for index, entry in enumerate(choice.tools)]
    else:
        entries = [(msgspec.to_builtins(choice), f"{root}tool_choice")]
    for entry, param in entries:
        missing = _not_offered(entry, body.tools)
        if missing is not None:
            raise ClientError(
                "invalid_request", f"Tool choice '{missing}' not found in 'tools' parameter.", param
            )


def _not_offered(entry: Any, tools: list[Tool]) -> str | None:
    """The name a choice entry gives when ``tools`` has no such tool, else None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        return None  # a malformed allowed_tools entry: the SDK's type leaves it free, so does the check
    kind: str = entry["type"]
    name = entry.get("name")
    if kind == "function":
        return None if name in function_tool_names(tools) else str(name)
    if kind == "custom":
        return None if name in custom_tool_names(tools) else str(name)
    if kind == "mcp":
        labels = {tool.server_label for tool in tools if isinstance(tool, Mcp)}
        return None if entry.get("server_label") in labels else str(entry.get("server_label"))
    offered = {_FAMILIES.get(tag, tag) for tool in tools if isinstance(tag := _tag(tool), str)}
    return None if _FAMILIES.get(kind, kind) in offered else kind


def _tag(tool: Tool) -> object:
    return type(tool).__struct_config__.tag
