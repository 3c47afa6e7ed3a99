"""Conversation items and tools in the Responses API's shape: the structs of ``proto.core.openai_types``
(generated from the ``openai`` SDK's request types, so every documented item and tool type decodes and
validates), under the short names the lab's code uses, plus what the lab reads off them.

Every item type is accepted, stored and rendered into the model's context (``sampler.tokens``); the mock
model produces messages, reasoning, function calls, custom tool calls and web searches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

from proto.core import openai_types as oa

Item = oa.InputItem
Tool = oa.Tool

# Items the lab reads or makes.
Message = oa.Message
FunctionCall = oa.ResponseFunctionToolCall
FunctionCallOutput = oa.FunctionCallOutput
CustomToolCall = oa.ResponseCustomToolCall
CustomToolCallOutput = oa.ResponseCustomToolCallOutput
Reasoning = oa.ResponseReasoningItem
ReasoningSummary = oa.Summary
ReasoningText = oa.Content
WebSearchCall = oa.ResponseFunctionWebSearch
WebSearchAction = oa.ActionSearch
WebSearchSource = oa.ActionSearchSource
WebOpenPage = oa.ActionOpenPage
WebFindInPage = oa.ActionFind
ItemReference = oa.ItemReference
Compaction = oa.ResponseCompactionItem
CompactionTrigger = oa.CompactionTrigger

# Content parts.
InputText = oa.ResponseInputText
InputImage = oa.ResponseInputImage
InputFile = oa.ResponseInputFile
OutputText = oa.ResponseOutputText
Refusal = oa.ResponseOutputRefusal
# (A message's parts and a tool output's list are the same structs: the generator merges the SDK's twins.)
TEXT_PARTS = (oa.ResponseInputText, oa.ResponseOutputText)
IMAGE_PARTS = (oa.ResponseInputImage,)
FILE_PARTS = (oa.ResponseInputFile,)
ImagePart = oa.ResponseInputImage
FilePart = oa.ResponseInputFile

# Tools the mock model calls.
FunctionTool = oa.FunctionTool
NamespaceFunction = oa.ToolFunction
CustomTool = oa.CustomTool
NamespaceTool = oa.NamespaceTool
WebSearchTools = (oa.WebSearchTool, oa.WebSearchPreviewTool)

HOSTED_TOOL_NAMES = frozenset({"web_search", "web_search_preview"})
# The model's own calls: the client (or a hosted service) answers each with an output item.
CALL_ITEMS = (FunctionCall, CustomToolCall)
OUTPUT_ITEMS = (FunctionCallOutput, CustomToolCallOutput)
CallItem = FunctionCall | CustomToolCall
OutputItem = FunctionCallOutput | CustomToolCallOutput


def part_text(part: object) -> str:
    """The text a content part holds ("" for an image or a file: those are counted apart)."""
    if isinstance(part, TEXT_PARTS):
        return part.text
    if isinstance(part, Refusal):
        return part.refusal
    return ""


def message_text(item: Message) -> str:
    if isinstance(item.content, str):
        return item.content
    return "".join(part_text(part) for part in item.content)


def output_text(item: FunctionCallOutput | CustomToolCallOutput) -> str:
    """A tool output's text parts (``output`` is a string or a list of text, image and file parts)."""
    if item.output is None:
        return ""
    if isinstance(item.output, str):
        return item.output
    return "".join(part_text(part) for part in item.output)


def media_parts(item: Item) -> list[ImagePart | FilePart]:
    """The images and files an item carries: in a message's content or a tool output's list."""
    parts: list[object] = []
    if isinstance(item, Message) and not isinstance(item.content, str):
        parts = list(item.content)
    elif isinstance(item, OUTPUT_ITEMS) and isinstance(item.output, list):
        parts = list(item.output)
    return [part for part in parts if isinstance(part, (*IMAGE_PARTS, *FILE_PARTS))]


def function_tool_names(tools: Sequence[Tool]) -> frozenset[str]:
    """Names the model may call as functions: function tools, and the functions inside a namespace
    (called by their own name: docs/protocol.md, "The directive script")."""
    return _names(tools, (FunctionTool, NamespaceFunction))


def custom_tool_names(tools: Sequence[Tool]) -> frozenset[str]:
    """Names of ``custom`` (freeform) tools, top-level or inside a namespace."""
    return _names(tools, (CustomTool,))


class _Named(Protocol):
    name: str


def _names(tools: Sequence[Tool], kinds: tuple[type, ...]) -> frozenset[str]:
    inner = [t for tool in tools if isinstance(tool, NamespaceTool) for t in tool.tools]
    named = [cast(_Named, tool) for tool in (*tools, *inner) if isinstance(tool, kinds)]
    return frozenset(tool.name for tool in named)


def namespace_of(tools: Sequence[Tool], name: str) -> str | None:
    """The namespace a called tool lives in (its call item carries it), or None for a top-level tool."""
    for tool in tools:
        if isinstance(tool, NamespaceTool) and any(inner.name == name for inner in tool.tools):
            return tool.name
    return None


def item_type(item: Item) -> str:
    return str(type(item).__struct_config__.tag)


def item_id_of(item: Item) -> str | None:
    """The item's ``id``, when its type has one and it is set."""
    value = getattr(item, "id", None)
    return value if isinstance(value, str) else None


def async_tool_names(tools: Sequence[Any]) -> frozenset[str]:
    """The function and custom tools declared ``async: true`` (a namespace's by their own names): "the
    model may keep working after issuing the call; its output comes in a later request, by its call_id"
    (docs/protocol.md, "Newer fields")."""
    names: set[str] = set()
    for tool in tools:
        for one in tool.tools if isinstance(tool, NamespaceTool) else [tool]:
            if isinstance(one, (FunctionTool, NamespaceFunction, CustomTool)) and one.async_:
                names.add(one.name)
    return frozenset(names)


def listed(item: dict[str, Any]) -> dict[str, Any]:
    """A stored input item as ``GET /v1/responses/{id}/input_items`` lists it, in openai-python's
    ``ResponseInputMessageItem`` / ``ResponseOutputMessage`` shape for a message: ``type`` named, ``content``
    a list of parts (a string is one ``input_text``, or one ``output_text`` for an assistant), and
    ``status`` "populated when items are returned via API" (``completed``: the item is whole). Other items
    are listed as they were stored (docs/protocol.md, "Stored responses")."""
    if item.get("type", "message") != "message" or "role" not in item:
        return item
    content = item.get("content")
    if isinstance(content, str):
        part: dict[str, Any] = {"type": "input_text", "text": content}
        if item["role"] == "assistant":
            part = {"type": "output_text", "text": content, "annotations": []}
        content = [part]
    return {**item, "type": "message", "content": content, "status": item.get("status") or "completed"}


def earlier_reasoning(items: Sequence[Item], context: str | None) -> list[int]:
    """The positions of the reasoning items ``reasoning.context`` withholds from the model: under
    ``current_turn``, those of earlier turns (before the latest user message: a turn is everything after
    it); none under ``all_turns``, ``auto`` or no setting (the gpt-5.6 family's default, ``all_turns``).
    docs/protocol.md, "Newer fields"."""
    if context != "current_turn":
        return []
    latest = 0
    for i, item in enumerate(items):
        if isinstance(item, Message) and item.role == "user":
            latest = i
    return [i for i in range(latest) if isinstance(items[i], Reasoning)]
