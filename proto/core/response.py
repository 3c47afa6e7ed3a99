"""The Response object in OpenAI's shape, plus the lab's per-turn report (a documented extra field)."""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from proto.core import openai_types as oa
from proto.core.items import Item, Tool
from proto.core.work import WorkCounters

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
# How a response reached the server: the designs the lab compares, in the seed's order (each removes work
# the one before redoes; NOTES.md, "the transports", NOTES.md (Issue 11) for ``http-cached``).
Mode = Literal["http", "http-cached", "http-prev", "ws", "longlived"]
MODES: tuple[Mode, ...] = get_args(Mode)


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int = 0

    def add(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.input_tokens_details.cached_tokens += cached_tokens
        self.output_tokens += output_tokens
        self.total_tokens = self.input_tokens + self.output_tokens

    def copy(self) -> Usage:
        return self.minus(Usage())

    def minus(self, earlier: Usage) -> Usage:
        """What was used since ``earlier`` (a copy taken from this same running total)."""
        spent = Usage(
            input_tokens=self.input_tokens - earlier.input_tokens,
            input_tokens_details=InputTokensDetails(self.input_tokens_details.cached_tokens - earlier.input_tokens_details.cached_tokens),
            output_tokens=self.output_tokens - earlier.output_tokens,
            output_tokens_details=OutputTokensDetails(self.output_tokens_details.reasoning_tokens - earlier.output_tokens_details.reasoning_tokens),
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


class Response(msgspec.Struct, kw_only=True):
    id: str
    object: str = "response"
    created_at: int
    status: Status
    model: str
    output: list[Item] = msgspec.field(default_factory=list)
    tools: list[Tool] = msgspec.field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool = True
    background: bool = False
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    usage: Usage | None = None
    text: oa.ResponseTextConfig = msgspec.field(default_factory=lambda: oa.ResponseTextConfig(format=oa.Text()))
    truncation: str = "disabled"
    reasoning: oa.ReasoningReasoning | None = None
    user: str | None = None
    # Carried through from the request as OpenAI echoes them on the Response object.
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    lab: LabInfo | None = None
