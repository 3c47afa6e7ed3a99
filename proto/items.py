"""Conversation items and tools in the Responses API's shape (msgspec structs, tagged on ``type``)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class InputText(msgspec.Struct, tag="input_text", tag_field="type"):
    text: str


class OutputText(msgspec.Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


ContentPart = InputText | OutputText

Role = Literal["user", "assistant", "system", "developer"]


class Message(msgspec.Struct, tag="message", tag_field="type", kw_only=True):
    role: Role
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class EasyMessage(msgspec.Struct, kw_only=True):
    """OpenAI accepts ``{"role": ..., "content": ...}`` without ``type``; normalised to ``Message``."""

    role: Role
    content: str | list[ContentPart]


class FunctionCall(msgspec.Struct, tag="function_call", tag_field="type", kw_only=True):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(msgspec.Struct, tag="function_call_output", tag_field="type", kw_only=True):
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


class WebSearchAction(msgspec.Struct, tag="search", tag_field="type", kw_only=True):
    query: str
    sources: list[dict[str, str]] | None = None


class WebSearchCall(msgspec.Struct, tag="web_search_call", tag_field="type", kw_only=True):
    id: str
    status: str
    action: WebSearchAction | None = None


Item = Message | FunctionCall | FunctionCallOutput | WebSearchCall


class FunctionTool(msgspec.Struct, tag="function", tag_field="type", kw_only=True):
    name: str
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class WebSearchTool(msgspec.Struct, tag="web_search", tag_field="type", kw_only=True):
    search_context_size: str | None = None


class WebSearchPreviewTool(msgspec.Struct, tag="web_search_preview", tag_field="type", kw_only=True):
    search_context_size: str | None = None


Tool = FunctionTool | WebSearchTool | WebSearchPreviewTool

HOSTED_TOOL_NAMES = frozenset({"web_search", "web_search_preview"})




def function_tool_names(tools: list[Tool]) -> frozenset[str]:
    return frozenset(tool.name for tool in tools if isinstance(tool, FunctionTool))
