"""Client and server events: small structs tagged on ``type``, one union decoded in one call.

Client event bodies carry their items as ``msgspec.Raw`` so the core can decode each item on its own and
report the failing path as ``$.input[3].call_id`` (and accept OpenAI's type-less ``{"role", "content"}``).
"""

from __future__ import annotations

import typing
from typing import Annotated, Any

import msgspec

from proto.core import openai_types as oa
from proto.core.items import Item, OutputText, Tool
from proto.core.limits import INT64_MAX, MAX_TOP_LOGPROBS, MIN_MAX_TOOL_CALLS
from proto.core.response import Response

# ----------------------------------------------------------------------------------------------- client


class CreateBody(oa.ResponseCreateParamsBase, kw_only=True):
    """The body of ``POST /v1/responses``; also the flat ``response.create`` event of both WS protocols.

    Every field OpenAI documents, typed as the SDK spells it (``proto.core.openai_types``); here only what the
    lab narrows: ``input`` kept raw so each item decodes on its own (its error names its index), the
    defaults OpenAI applies, the documented ranges, and GA WebSocket mode's ``generate``."""

    model: str
    input: str | list[msgspec.Raw] = msgspec.field(default_factory=list)
    tools: list[Tool] = msgspec.field(default_factory=list)
    # ``null`` is valid for these (the SDK types them Optional): it means the default.
    parallel_tool_calls: bool | None = True
    store: bool | None = True
    stream: bool | None = False
    background: bool | None = False
    generate: bool = True
    # Ranges as OpenAI documents them; out of range is the peer's error, not a number we carry along.
    # An integer past its bound is refused in OpenAI's code and words (``integer_above_max_value`` …:
    # ``codec``, ``proto/core/limits.py``); ``max_output_tokens`` ≥ 16 is checked there too.
    max_output_tokens: Annotated[int, msgspec.Meta(le=2**31 - 1)] | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    max_tool_calls: Annotated[int, msgspec.Meta(ge=MIN_MAX_TOOL_CALLS, le=INT64_MAX)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None

    @property
    def stores(self) -> bool:
        return self.store is not False

    @property
    def parallel(self) -> bool:
        return self.parallel_tool_calls is not False

    def includes(self, what: str) -> bool:
        return what in (self.include or ())


class ResponseCreate(CreateBody, tag="response.create", tag_field="type", kw_only=True):
    event_id: str | None = None
    stream_id: str | None = (
        None  # GA WebSocket mode's lane (docs/protocol.md, "Lanes (`stream_id`)"); not part of the HTTP body
    )


class ClientEventBase(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str | None = None


class ResponseAppend(ClientEventBase, tag="response.append"):
    input: list[msgspec.Raw]
    response_id: str | None = None


class ResponseInject(ClientEventBase, tag="response.inject"):
    response_id: str
    input: list[msgspec.Raw]


class ResponseCancel(ClientEventBase, tag="response.cancel"):
    response_id: str | None = None


class ResponseSteer(ClientEventBase, tag="response.steer"):
    """GA WebSocket mode's beta steering (SDK: ``ResponseSteerEventParam``): user input queued for the
    response ``previous_response_id``; a string or message items, decoded on their own."""

    previous_response_id: str
    input: str | list[msgspec.Raw]


ClientEvent = ResponseCreate | ResponseAppend | ResponseInject | ResponseCancel | ResponseSteer
CLIENT_EVENT_TYPES = frozenset(str(kind.__struct_config__.tag) for kind in typing.get_args(ClientEvent))

# ----------------------------------------------------------------------------------------------- server


class WireEvent(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Anything the server sends: immutable, a snapshot of what it describes when it was made. Replies
    outside a response's stream (errors, inject acks) carry no ``sequence_number``, as in the GA error
    envelope."""


class ServerEvent(WireEvent, kw_only=True, frozen=True):
    # Stamped by the response's builder when the event is made; strictly increasing per response.
    sequence_number: int = 0


class ResponseCreated(ServerEvent, tag="response.created", frozen=True):
    response: Response


class ResponseInProgress(ServerEvent, tag="response.in_progress", frozen=True):
    response: Response


class ResponseQueued(ServerEvent, tag="response.queued", frozen=True):
    """A background response's second event (docs/protocol.md, "Background mode")."""

    response: Response


class OutputItemAdded(ServerEvent, tag="response.output_item.added", frozen=True):
    output_index: int
    item: Item


class OutputItemDone(ServerEvent, tag="response.output_item.done", frozen=True):
    output_index: int
    item: Item


class ContentPartAdded(ServerEvent, tag="response.content_part.added", frozen=True):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class ContentPartDone(ServerEvent, tag="response.content_part.done", frozen=True):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDelta(ServerEvent, tag="response.output_text.delta", frozen=True):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class OutputTextDone(ServerEvent, tag="response.output_text.done", frozen=True):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class FunctionCallArgumentsDelta(ServerEvent, tag="response.function_call_arguments.delta", frozen=True):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(ServerEvent, tag="response.function_call_arguments.done", frozen=True):
    item_id: str
    output_index: int
    arguments: str
    name: str | None = None


class CustomToolCallInputDelta(ServerEvent, tag="response.custom_tool_call_input.delta", frozen=True):
    item_id: str
    output_index: int
    delta: str


class CustomToolCallInputDone(ServerEvent, tag="response.custom_tool_call_input.done", frozen=True):
    item_id: str
    output_index: int
    input: str


class SummaryPart(msgspec.Struct, tag="summary_text", tag_field="type"):
    text: str


class ReasoningSummaryPartAdded(ServerEvent, tag="response.reasoning_summary_part.added", frozen=True):
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryPart


class ReasoningSummaryTextDelta(ServerEvent, tag="response.reasoning_summary_text.delta", frozen=True):
    item_id: str
    output_index: int
    summary_index: int
    delta: str


class ReasoningSummaryTextDone(ServerEvent, tag="response.reasoning_summary_text.done", frozen=True):
    item_id: str
    output_index: int
    summary_index: int
    text: str


class ReasoningSummaryPartDone(ServerEvent, tag="response.reasoning_summary_part.done", frozen=True):
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryPart


class WebSearchInProgress(ServerEvent, tag="response.web_search_call.in_progress", frozen=True):
    item_id: str
    output_index: int


class WebSearchSearching(ServerEvent, tag="response.web_search_call.searching", frozen=True):
    item_id: str
    output_index: int


class WebSearchCompleted(ServerEvent, tag="response.web_search_call.completed", frozen=True):
    item_id: str
    output_index: int


class CompactionCompacting(ServerEvent, tag="response.compaction.compacting", frozen=True):
    """A compaction turn samples its summary (the SDK's ``ResponseCompactionCompactingEvent``: "Contains no
    summary content"); after the item's ``output_item.added``, before its tokens are decoded."""

    item_id: str
    output_index: int


class PendingCall(msgspec.Struct):
    call_id: str
    name: str


class ResponseDone(ServerEvent, tag="response.done", frozen=True):
    """The long-lived response is suspended: it waits for ``pending_calls``' outputs (``can_append``)."""

    response: Response
    can_append: bool = True
    pending_calls: list[PendingCall] = msgspec.field(default_factory=list)


class ResponseCompleted(ServerEvent, tag="response.completed", frozen=True):
    response: Response


class ResponseIncomplete(ServerEvent, tag="response.incomplete", frozen=True):
    response: Response


class ResponseFailed(ServerEvent, tag="response.failed", frozen=True):
    response: Response


class InjectCreated(WireEvent, tag="response.inject.created", frozen=True):
    response_id: str
    event_id: str | None = None


class InjectFailed(WireEvent, tag="response.inject.failed", frozen=True):
    response_id: str
    code: str
    message: str
    event_id: str | None = None


class SteerRef(msgspec.Struct, kw_only=True):
    id: str
    previous_response_id: str


class SteerFailure(msgspec.Struct, kw_only=True, omit_defaults=True):
    previous_response_id: str
    input: Any  # the submission as it came, returned so the client can carry it into a response.create
    id: str | None = None


class SteerError(msgspec.Struct, kw_only=True):
    # response_not_found, invalid_input, too_many_pending_steers, response_already_completed,
    # response_not_active
    code: str
    message: str
    type: str = "invalid_request_error"


class RequiredInput(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """A stub of an output the client owes (SDK: ``ResponseSteerRequiredInput``)."""

    call_id: str


class RequiredFunctionOutput(RequiredInput, tag="function_call_output"):
    name: str


class RequiredCustomOutput(RequiredInput, tag="custom_tool_call_output"):
    pass


class SteerAccepted(ServerEvent, tag="response.steer.accepted", frozen=True):
    steer: SteerRef


class SteerPending(ServerEvent, tag="response.steer.pending", frozen=True):
    steer: SteerRef
    required_input: list[RequiredFunctionOutput | RequiredCustomOutput]
    reason: str = "waiting_for_required_input"


class SteerFailed(ServerEvent, tag="response.steer.failed", frozen=True):
    steer: SteerFailure
    error: SteerError


class ErrorDetail(msgspec.Struct, kw_only=True):
    type: str
    code: str | None
    message: str
    param: str | None = None


class ErrorEvent(WireEvent, tag="error", frozen=True, omit_defaults=True):
    status: int
    error: ErrorDetail
    # The HTTP headers the same refusal carries over HTTP (a retry hint: ``retry-after-ms``, ``retry-after``),
    # as Codex's ``WrappedWebsocketErrorEvent`` reads them; absent when there are none.
    headers: dict[str, str] | None = None


class StreamError(msgspec.Struct, kw_only=True, frozen=True):
    """An SSE stream's ``error`` event, the last of a stream cut short (docs/protocol.md, "SSE"): the
    stream's next ``sequence_number`` and the error both as OpenAI's ``ResponseErrorEvent`` has it
    (``code``, ``message``, ``param`` at the top) and as the Open Responses ``ErrorStreamingEvent`` does
    (an ``error`` object). Not a ``WireEvent``: the ``error`` tag is the WebSocket envelope's."""

    type: str = "error"
    sequence_number: int
    code: str | None
    message: str
    param: str | None
    error: ErrorDetail


TERMINAL_EVENTS = (ResponseCompleted, ResponseIncomplete, ResponseFailed)
# Their wire names, for code that reads events as JSON (clients, the lab, the load tools).
TERMINAL_TYPES: frozenset[str] = frozenset(str(c.__struct_config__.tag) for c in TERMINAL_EVENTS)
TerminalEvent = ResponseCompleted | ResponseIncomplete | ResponseFailed

AnyServerEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseQueued
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone
    | ReasoningSummaryPartAdded
    | ReasoningSummaryTextDelta
    | ReasoningSummaryTextDone
    | ReasoningSummaryPartDone
    | WebSearchInProgress
    | WebSearchSearching
    | WebSearchCompleted
    | CompactionCompacting
    | ResponseDone
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | InjectCreated
    | InjectFailed
    | SteerAccepted
    | SteerPending
    | SteerFailed
    | ErrorEvent
)
