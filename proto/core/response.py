"""The Response object in OpenAI's shape, plus the lab's per-turn report (a documented extra field)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import msgspec

from proto.core import openai_types as oa
from proto.core.items import Item, Tool, item_id_of
from proto.core.work import WorkCounters

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
# How a response reached the server: the designs the lab compares, in the seed's order (each removes work
# the one before redoes; docs/architecture.md, "The pipeline"; docs/protocol.md, "The item cache
# (`http-cached`)").
Mode = Literal["http", "http-cached", "http-prev", "ws", "longlived"]
MODES: tuple[Mode, ...] = get_args(Mode)


class CacheWriteTokensDetails(msgspec.Struct):
    """openai-python's ``InputTokensDetailsCacheWriteTokensDetails``: the written tokens by the lifetime they
    were written under (docs/protocol.md, "Prompt caching")."""

    ttl_12h_tokens: int = 0
    ttl_30m_tokens: int = 0

    def add(self, written_by_ttl: dict[str, int]) -> None:
        self.ttl_12h_tokens += written_by_ttl.get("12h", 0)
        self.ttl_30m_tokens += written_by_ttl.get("30m", 0)


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0
    # Prompt tokens the mock GPU stored in its prefix cache (docs/protocol.md, "Prompt caching").
    cache_write_tokens: int = 0
    # Those by lifetime, only for a request that uses the caching surface (prompt_cache_options or a
    # breakpoint): @openai/agents 0.20 reads input_tokens_details as numbers only (docs/protocol.md,
    # "Prompt caching"). Unset: every write was for the default 30 minutes.
    cache_write_tokens_details: CacheWriteTokensDetails | msgspec.UnsetType = msgspec.UNSET

    @property
    def written_12h(self) -> int:
        details = self.cache_write_tokens_details
        return 0 if isinstance(details, msgspec.UnsetType) else details.ttl_12h_tokens


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int = 0

    def add(
        self,
        input_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        written_tokens: int = 0,
        written_by_ttl: dict[str, int] | None = None,
    ) -> None:
        self.input_tokens += input_tokens
        self.input_tokens_details.cached_tokens += cached_tokens
        self.input_tokens_details.cache_write_tokens += written_tokens
        details = self.input_tokens_details.cache_write_tokens_details
        if written_by_ttl and not isinstance(details, msgspec.UnsetType):
            details.add(written_by_ttl)
        self.output_tokens += output_tokens
        self.total_tokens = self.input_tokens + self.output_tokens

    def copy(self) -> Usage:
        return self.minus(Usage())

    def minus(self, earlier: Usage) -> Usage:
        """What was used since ``earlier`` (a copy taken from this same running total)."""
        now = self.input_tokens_details.cache_write_tokens_details
        then = earlier.input_tokens_details.cache_write_tokens_details
        if isinstance(then, msgspec.UnsetType):
            then = CacheWriteTokensDetails()
        spent = Usage(
            input_tokens=self.input_tokens - earlier.input_tokens,
            input_tokens_details=InputTokensDetails(
                self.input_tokens_details.cached_tokens - earlier.input_tokens_details.cached_tokens,
                self.input_tokens_details.cache_write_tokens
                - earlier.input_tokens_details.cache_write_tokens,
                msgspec.UNSET
                if isinstance(now, msgspec.UnsetType)
                else CacheWriteTokensDetails(
                    now.ttl_12h_tokens - then.ttl_12h_tokens, now.ttl_30m_tokens - then.ttl_30m_tokens
                ),
            ),
            output_tokens=self.output_tokens - earlier.output_tokens,
            output_tokens_details=OutputTokensDetails(
                self.output_tokens_details.reasoning_tokens - earlier.output_tokens_details.reasoning_tokens
            ),
        )
        spent.total_tokens = spent.input_tokens + spent.output_tokens
        return spent


class IncompleteDetails(msgspec.Struct):
    reason: str


class ResponseError(msgspec.Struct):
    code: str
    message: str


class TurnReport(msgspec.Struct, kw_only=True):
    """One sampling segment, as the server saw it: the engine's report plus the API phases it ran.

    Exposed on ``response.done`` and terminal events as ``response.lab.turns`` so the latency lab reads
    it without scraping logs (``TTFT - prefill_ms`` is the per-turn API overhead).
    """

    turn: int
    prompt_tokens: int
    cached_tokens: int
    prefill_ms: float
    queue_wait_ms: float
    decode_ms: float
    output_tokens: int
    phases_ms: dict[str, float] = msgspec.field(default_factory=dict)
    written_tokens: int = 0  # prompt tokens the turn stored in the prefix cache
    written_by_ttl: dict[str, int] = msgspec.field(default_factory=dict)  # those, by their lifetime
    expired_tokens: int = 0  # prompt tokens its match found stored but past their lifetime
    block_size: int = 0  # the prefix cache's block (0: the engine does not report it)


class LabInfo(msgspec.Struct, kw_only=True):
    mode: Mode
    turns: list[TurnReport] = msgspec.field(default_factory=list)
    phases_ms: dict[str, float] = msgspec.field(default_factory=dict)
    safety_flags: list[str] = msgspec.field(default_factory=list)
    work: WorkCounters = msgspec.field(default_factory=WorkCounters)
    # Where each input item entered the conversation, as the number of output items before it. All 0
    # for a request/response transport; a long-lived response's appended items interleave with its
    # output, and a stored chain is rebuilt in that order (``respond.load_history``).
    input_positions: list[int] | None = None
    # The response's whole usage so far. An event's ``response.usage`` is what was used since the previous
    # ``response.done`` of the same response, so a client that sums every ``response.done`` and the
    # terminal event (Codex's v1 transport does) gets the total; this is that total, on each of them.
    usage_total: Usage | None = None


class EchoedFunctionTool(oa.FunctionTool, tag="function", tag_field="type", kw_only=True, omit_defaults=True):
    """A function tool as the Response object echoes it: ``description``, ``parameters`` and ``strict``
    always present (``null`` when absent), as OpenAI returns them and as the Open Responses
    ``FunctionTool`` schema requires. A subclass, so whatever reads tools as ``FunctionTool`` reads these."""

    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


# The Response's ``tools``: the request's tools, its function tools as echoed.
EchoedTool = (
    EchoedFunctionTool
    | oa.FileSearchTool
    | oa.ComputerTool
    | oa.ComputerUsePreviewTool
    | oa.WebSearchTool_web_search
    | oa.WebSearchTool_web_search_2025_08_26
    | oa.Mcp
    | oa.CodeInterpreter
    | oa.ProgrammaticToolCalling
    | oa.ImageGeneration
    | oa.LocalShell
    | oa.FunctionShellTool
    | oa.CustomTool
    | oa.NamespaceTool
    | oa.ToolSearchTool
    | oa.WebSearchPreviewTool_web_search_preview
    | oa.WebSearchPreviewTool_web_search_preview_2025_03_11
    | oa.ApplyPatchTool
)


def echo_tool(tool: Tool) -> EchoedTool:
    """OpenAI's function-calling guide ("Strict mode"): a Responses function tool sent without ``strict``
    is strict, and the Response says so (``strict: true``); ``strict: false`` is kept."""
    if isinstance(tool, EchoedFunctionTool):
        return tool
    if isinstance(tool, oa.FunctionTool):
        fields = {name: getattr(tool, name) for name in tool.__struct_fields__}
        fields["strict"] = True if tool.strict is None else tool.strict
        return EchoedFunctionTool(**fields)
    return tool


class EchoedJSONSchemaFormat(
    oa.ResponseFormatTextJSONSchemaConfig,
    tag="json_schema",
    tag_field="type",
    kw_only=True,
    omit_defaults=True,
):
    """``text.format`` ``json_schema`` as the Response object echoes it: ``description`` always present
    (``null`` when absent) and ``strict`` a boolean (``false`` when absent, OpenAI's default), as OpenAI
    returns it and as the Open Responses ``JsonSchemaResponseFormat`` requires."""

    description: str | None
    strict: bool | None


class EchoedReasoning(oa.ReasoningReasoning, kw_only=True, omit_defaults=True):
    """``reasoning`` as the Response object echoes it: ``effort`` and ``summary`` always present (``null``
    when the request left them out), as the Open Responses ``Reasoning`` requires."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None
    summary: Literal["auto", "concise", "detailed"] | None


def echo_reasoning(reasoning: oa.ReasoningReasoning | None) -> oa.ReasoningReasoning | None:
    """The effective settings, as the SDK's ``Reasoning`` says the Response returns them: ``context`` the
    context mode used (``current_turn`` or ``all_turns`` as asked; ``auto`` or none is the gpt-5.6 family's
    default, ``all_turns``: docs/protocol.md, "Newer fields"), ``mode`` the execution mode (``standard``
    unless one was asked; the mock runs every mode alike)."""
    if reasoning is None or isinstance(reasoning, EchoedReasoning):
        return reasoning
    fields = {name: getattr(reasoning, name) for name in reasoning.__struct_fields__}
    fields["context"] = "current_turn" if reasoning.context == "current_turn" else "all_turns"
    fields["mode"] = reasoning.mode or "standard"
    return EchoedReasoning(**fields)


class InputTransformation(msgspec.Struct, kw_only=True):
    """One reasoning input withheld from the model (openai-python 3.63, ``responses.response``
    ``InputTransformation``): the mock withholds for one reason, a turn boundary."""

    id: str
    action: Literal["removed"] = "removed"
    reason: Literal[
        "organization_mismatch", "end_user_mismatch", "model_mismatch", "prefix_mismatch", "turn_boundary"
    ] = "turn_boundary"
    type: Literal["reasoning"] = "reasoning"


def withheld(items: Sequence[Item]) -> list[InputTransformation]:
    """The Response's ``input_transformations`` for the reasoning items withheld (``reasoning.context:
    current_turn``), in input order."""
    return [InputTransformation(id=item_id_of(item) or "") for item in items]


class ImageGenInputDetails(msgspec.Struct):
    image_tokens: int = 0
    text_tokens: int = 0


class ImageGenUsage(msgspec.Struct):
    input_tokens: int = 0
    input_tokens_details: ImageGenInputDetails = msgspec.field(default_factory=ImageGenInputDetails)
    output_tokens: int = 0
    total_tokens: int = 0


class WebSearchUsage(msgspec.Struct):
    num_requests: int = 0


class ToolUsage(msgspec.Struct):
    """The SDK's ``Response.tool_usage``: "Usage reported by hosted tools, separate from base model usage
    … tool families with no recorded usage have zero counts". The mock's hosted tool is its web search
    (each search it ran is one request); it generates no images."""

    image_gen: ImageGenUsage = msgspec.field(default_factory=ImageGenUsage)
    web_search: WebSearchUsage = msgspec.field(default_factory=WebSearchUsage)

    def copy(self) -> ToolUsage:
        return ToolUsage(web_search=WebSearchUsage(self.web_search.num_requests))


def echo_text(text: oa.ResponseTextConfig) -> oa.ResponseTextConfig:
    """``text`` as the Response echoes it: always with a ``format`` (OpenAI fills in ``{"type": "text"}``
    when the request gave only ``verbosity``; the Open Responses ``TextField`` requires it)."""
    fmt = text.format
    if fmt is None:
        return msgspec.structs.replace(text, format=oa.Text())
    if isinstance(fmt, oa.ResponseFormatTextJSONSchemaConfig) and not isinstance(fmt, EchoedJSONSchemaFormat):
        echoed = EchoedJSONSchemaFormat(
            name=fmt.name, schema=fmt.schema, description=fmt.description, strict=bool(fmt.strict)
        )
        return msgspec.structs.replace(text, format=echoed)
    return text


# How the Response spells a requested ``service_tier`` (the SDK's ``Response.service_tier``: "The response
# will show service_tier=priority regardless of if you specify service_tier=fast or priority"; ``auto`` is
# the project's setting, ``default`` here). Which tier actually served it is the server's to say
# (``proto/server/tiers.py``).
ECHOED_TIERS = {"auto": "default", "fast": "priority"}


def echo_service_tier(tier: str | None) -> str:
    return ECHOED_TIERS.get(tier or "auto", tier or "auto")


# ``prompt_cache_diagnostics``, in OpenAI's shapes; ``proto.core.caching`` finds them (docs/protocol.md,
# "Prompt caching").
MissReason = Literal[
    "model_changed",
    "prompt_cache_key_changed",
    "tools_changed",
    "text_format_changed",
    "reasoning_effort_changed",
    "verbosity_changed",
    "context_compacted",
    "input_changed",
    "service_tier_changed",
]


class CacheHit(msgspec.Struct, tag="cache_hit", tag_field="type"):
    pass


class CacheMiss(msgspec.Struct, tag="cache_miss", tag_field="type", kw_only=True):
    cache_missed_tokens: int
    reason: MissReason
    comparison_reusable_tokens: int | None = None


class ComparisonResponseNotFound(msgspec.Struct, tag="comparison_response_not_found", tag_field="type"):
    pass


class Unavailable(msgspec.Struct, tag="unavailable", tag_field="type"):
    pass


Diagnostics = CacheHit | CacheMiss | ComparisonResponseNotFound | Unavailable


class Response(msgspec.Struct, kw_only=True):
    """Every field the Open Responses ``ResponseResource`` requires is always present, with the values
    OpenAI's API returns: defaults are echoed as values (``temperature`` 1.0, ``top_p`` 1.0, penalties 0.0,
    ``top_logprobs`` 0, ``service_tier`` ``"default"``), never ``null``."""

    id: str
    object: str = "response"
    created_at: int
    # Set when the response reaches ``completed`` (``null`` until then, and for any other ending).
    completed_at: int | None = None
    status: Status
    model: str
    output: list[Item] = msgspec.field(default_factory=list)
    tools: list[EchoedTool] = msgspec.field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    instructions: str | None = None
    previous_response_id: str | None = None
    # The conversation whose items the response's input followed, and that its items joined
    # (docs/protocol.md, "Conversations").
    conversation: oa.ResponseConversation | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    store: bool = True
    background: bool = False
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    usage: Usage | None = None
    text: oa.ResponseTextConfig = msgspec.field(
        default_factory=lambda: oa.ResponseTextConfig(format=oa.Text())
    )
    truncation: str = "disabled"
    reasoning: oa.ReasoningReasoning | None = None
    user: str | None = None
    # Carried through from the request as OpenAI echoes them on the Response object.
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # The tier that served the request: ``auto`` (and no request) resolve to ``default``, ``fast`` is
    # ``priority``, as OpenAI's do (``echo_service_tier``; the server sets the tier it used).
    service_tier: str = "default"
    max_tool_calls: int | None = None
    top_logprobs: int = 0
    tool_usage: ToolUsage = msgspec.field(default_factory=ToolUsage)
    # "Reasoning inputs withheld from the model, in input order": those of earlier turns under
    # ``reasoning.context: current_turn`` (``withheld``).
    input_transformations: list[InputTransformation] = msgspec.field(default_factory=list)
    # Echoed when the request set them; the diagnostics when it named a response to compare with
    # (docs/protocol.md, "Prompt caching").
    prompt_cache_options: oa.PromptCacheOptions | None = None
    prompt_cache_diagnostics: Diagnostics | None = None
    lab: LabInfo | None = None


class CompactResource(msgspec.Struct, kw_only=True):
    """The reply of ``POST /v1/responses/compact`` (Open Responses ``CompactResource``): the compacted
    window, to be sent as the input of the next response as it is."""

    id: str
    object: str = "response.compaction"
    created_at: int
    output: list[Item]
    usage: Usage
