"""Builds one Response and the streaming events that describe it, in OpenAI's order. Sans-IO.

The sampling loop calls these as the model produces output; the transport frames the events. One builder
per response: in the long-lived protocol it spans every turn of the rollout.

Two rules every event obeys:

* **It is a snapshot.** An event holds copies of what it describes as it was when the event was made
  (``output_item.added`` carries the item ``in_progress`` with empty content or arguments), never the live
  object that later events change: events may be encoded in batches, after the item has moved on.
* **Its ``sequence_number`` is stamped here**, the one place events are made, strictly increasing from 0
  over the whole response (over every turn of a long-lived one).
"""

from __future__ import annotations

import secrets
import time

import msgspec

from proto.core import openai_types as oa
from proto.core.caching import breakpoint_of, diagnose
from proto.core.events import (
    CompactionCompacting,
    ContentPartAdded,
    ContentPartDone,
    CreateBody,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    PendingCall,
    ReasoningSummaryPartAdded,
    ReasoningSummaryPartDone,
    ReasoningSummaryTextDelta,
    ReasoningSummaryTextDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
    ServerEvent,
    SummaryPart,
    WebSearchCompleted,
    WebSearchInProgress,
    WebSearchSearching,
)
from proto.core.items import (
    CallItem,
    Compaction,
    CustomToolCall,
    FunctionCall,
    Item,
    ItemReference,
    Message,
    OutputText,
    Reasoning,
    ReasoningSummary,
    WebSearchAction,
    WebSearchCall,
    WebSearchSource,
    item_id_of,
    item_type,
)
from proto.core.response import (
    CacheWriteTokensDetails,
    IncompleteDetails,
    LabInfo,
    Mode,
    Response,
    ResponseError,
    TurnReport,
    Usage,
    echo_reasoning,
    echo_service_tier,
    echo_text,
    echo_tool,
)
from proto.core.work import WorkCounters


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# An item's id prefix by its type, as the builder names the items it makes.
_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
}


def with_item_id(item: Item) -> Item:
    """The item with an id when its type has one and it lacks it (stored input items carry ids, as
    OpenAI's ``input_items`` and conversation items do; the rendering ignores them)."""
    if "id" not in item.__struct_fields__ or item_id_of(item) is not None or isinstance(item, ItemReference):
        return item
    return msgspec.structs.replace(item, id=new_item_id(_PREFIX.get(item_type(item), "item")))


class ResponseBuilder:
    def __init__(
        self, response_id: str, request: CreateBody, mode: Mode, work: WorkCounters | None = None
    ) -> None:
        self.response = Response(
            id=response_id,
            created_at=int(time.time()),
            status="in_progress",
            model=request.model,
            tools=[echo_tool(tool) for tool in request.tools],
            tool_choice=request.tool_choice if request.tool_choice is not None else "auto",
            parallel_tool_calls=request.parallel,
            instructions=request.instructions,
            previous_response_id=request.previous_response_id,
            conversation=(
                oa.ResponseConversation(id=request.conversation)
                if isinstance(request.conversation, str)
                else request.conversation
            ),
            max_output_tokens=request.max_output_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            store=request.stores,
            metadata=dict(request.metadata or {}),
            user=request.user,
            reasoning=echo_reasoning(request.reasoning),
            truncation=request.truncation or "disabled",
            prompt_cache_key=request.prompt_cache_key,
            safety_identifier=request.safety_identifier,
            service_tier=echo_service_tier(request.service_tier),
            max_tool_calls=request.max_tool_calls,
            top_logprobs=0 if request.top_logprobs is None else request.top_logprobs,
            usage=Usage(),
            lab=LabInfo(mode=mode, work=work or WorkCounters()),
        )
        self._segment_start = 0  # index of the first output item of the current turn
        self._turns_sent = 0  # lab.turns already reported on a response.done
        self._flags_sent = 0  # lab.safety_flags likewise
        self._sequence = 0
        self._usage_sent = Usage()  # the running total when the last response.done left
        # Set by the pipeline when the request names a response to compare with: that response (None: not
        # found) and whether this input carries a compaction item (docs/protocol.md, "Prompt caching").
        self.cache_comparison: tuple[Response | None, bool] | None = None
        if request.prompt_cache_options is not None or (
            isinstance(request.input, list) and any(breakpoint_of(item) for item in request.input)
        ):
            self.usage.input_tokens_details.cache_write_tokens_details = CacheWriteTokensDetails()
        if request.prompt_cache_options is not None:
            options = request.prompt_cache_options
            self.response.prompt_cache_options = oa.PromptCacheOptions(
                mode=options.mode or "implicit", ttl=options.ttl or "30m"
            )
        self.lab.usage_total = self.usage  # the live response (stored, the HTTP reply): both are the total
        if request.text is not None:
            self.response.text = echo_text(request.text)

    def next_sequence(self) -> int:
        number = self._sequence
        self._sequence += 1
        return number

    @property
    def lab(self) -> LabInfo:
        assert self.response.lab is not None
        return self.response.lab

    @property
    def usage(self) -> Usage:
        assert self.response.usage is not None
        return self.response.usage

    # ------------------------------------------------------------------------------ lifecycle
    def start(self) -> list[ServerEvent]:
        snapshot = self._snapshot(output=[], lab=self._lab_since_last())
        if self.response.status == "queued":  # a background response: created and queued, then it runs
            self.response.status = "in_progress"
            running = msgspec.structs.replace(snapshot, status="in_progress")
            return [
                ResponseCreated(response=snapshot, sequence_number=self.next_sequence()),
                ResponseQueued(response=snapshot, sequence_number=self.next_sequence()),
                ResponseInProgress(response=running, sequence_number=self.next_sequence()),
            ]
        return [
            ResponseCreated(response=snapshot, sequence_number=self.next_sequence()),
            ResponseInProgress(response=snapshot, sequence_number=self.next_sequence()),
        ]

    def record_turn(self, report: TurnReport) -> None:
        self.lab.turns.append(report)
        self.usage.add(
            report.prompt_tokens,
            report.cached_tokens,
            report.output_tokens,
            report.written_tokens,
            report.written_by_ttl,
        )
        if self.cache_comparison is not None and len(self.lab.turns) == 1:
            compared, compacted = self.cache_comparison
            self.response.prompt_cache_diagnostics = diagnose(self.response, compared, report, compacted)

    def suspend(self, calls: list[CallItem]) -> ResponseDone:
        # Only what is new since the last response.done travels with this one (this segment's output,
        # turn report and usage): re-sending the whole rollout on every suspension would make the
        # long-lived response pay O(turns²) bytes for nothing. The terminal event carries the whole
        # output; its usage is the last segment's, so that the usages of a response's events add up
        # (the total is ``lab.usage_total``, and the stored Response's ``usage``).
        segment = self.response.output[self._segment_start :]
        self._segment_start = len(self.response.output)
        done = ResponseDone(
            response=self._snapshot(output=segment, lab=self._lab_since_last()),
            pending_calls=[PendingCall(call_id=call.call_id, name=call.name) for call in calls],
            sequence_number=self.next_sequence(),
        )
        self._usage_sent = self.usage.copy()
        return done

    def completed(self) -> ResponseCompleted:
        self.response.status = "completed"
        self.response.completed_at = int(time.time())
        return ResponseCompleted(response=self._final(), sequence_number=self.next_sequence())

    def incomplete(self, reason: str) -> ResponseIncomplete:
        self.response.status = "cancelled" if reason == "cancelled" else "incomplete"
        self.response.incomplete_details = IncompleteDetails(reason=reason)
        return ResponseIncomplete(response=self._final(), sequence_number=self.next_sequence())

    def failed(self, code: str, message: str) -> ResponseFailed:
        self.response.status = "failed"
        self.response.error = ResponseError(code=code, message=message)
        return ResponseFailed(response=self._final(), sequence_number=self.next_sequence())

    def reissue(self, terminal: ServerEvent) -> ServerEvent:
        """The same terminal event (same type and number) over the response as it is now: work done
        after the event was made (storing, billing) shows in its counters."""
        assert isinstance(terminal, ResponseCompleted | ResponseIncomplete | ResponseFailed)
        return type(terminal)(response=self._final(), sequence_number=terminal.sequence_number)

    def _final(self) -> Response:
        lab = self.lab
        whole = msgspec.structs.replace(
            lab,
            turns=list(lab.turns),
            phases_ms=dict(lab.phases_ms),
            safety_flags=list(lab.safety_flags),
            work=msgspec.structs.replace(lab.work),
            input_positions=None if lab.input_positions is None else list(lab.input_positions),
            usage_total=self.usage.copy(),
        )
        return self._snapshot(output=list(self.response.output), lab=whole)

    def _lab_since_last(self) -> LabInfo:
        lab = self.lab
        turns, self._turns_sent = lab.turns[self._turns_sent :], len(lab.turns)
        flags, self._flags_sent = lab.safety_flags[self._flags_sent :], len(lab.safety_flags)
        return LabInfo(
            mode=lab.mode,
            turns=turns,
            phases_ms=dict(lab.phases_ms),
            safety_flags=flags,
            work=msgspec.structs.replace(lab.work),
            usage_total=self.usage.copy(),
        )

    def _snapshot(self, output: list[Item], lab: LabInfo) -> Response:
        return msgspec.structs.replace(
            self.response,
            output=output,
            usage=self.usage.minus(self._usage_sent),
            tool_usage=self.response.tool_usage.copy(),
            metadata=dict(self.response.metadata),
            lab=lab,
        )

    # ------------------------------------------------------------------------------ output items
    def message(self) -> MessageStream:
        return MessageStream(self)

    def function_call(self, name: str, call_id: str, namespace: str | None = None) -> CallStream:
        return CallStream(self, name, call_id, namespace)

    def custom_call(self, name: str, call_id: str, namespace: str | None = None) -> CustomCallStream:
        return CustomCallStream(self, name, call_id, namespace)

    def reasoning(self, summary: str | None) -> ReasoningStream:
        return ReasoningStream(self, summary)

    def compaction(self, encrypted: str) -> CompactionStream:
        return CompactionStream(self, encrypted)

    def web_search(self, query: str) -> tuple[WebSearchCall, int, list[ServerEvent]]:
        item = WebSearchCall(id=new_item_id("ws"), status="in_progress", action=WebSearchAction(query=query))
        index = self._add(item)
        events: list[ServerEvent] = [
            OutputItemAdded(
                output_index=index, item=_copy_search(item), sequence_number=self.next_sequence()
            ),
            WebSearchInProgress(item_id=item.id, output_index=index, sequence_number=self.next_sequence()),
            WebSearchSearching(item_id=item.id, output_index=index, sequence_number=self.next_sequence()),
        ]
        return item, index, events

    def web_search_done(
        self, item: WebSearchCall, index: int, sources: list[WebSearchSource]
    ) -> list[ServerEvent]:
        item.status = "completed"
        self.response.tool_usage.web_search.num_requests += 1
        if isinstance(item.action, WebSearchAction):
            item.action.sources = sources
        return [
            WebSearchCompleted(item_id=item.id, output_index=index, sequence_number=self.next_sequence()),
            OutputItemDone(output_index=index, item=_copy_search(item), sequence_number=self.next_sequence()),
        ]

    def _add(self, item: Item) -> int:
        self.response.output.append(item)
        return len(self.response.output) - 1


def _copy_search(item: WebSearchCall) -> WebSearchCall:
    action = item.action
    if isinstance(action, WebSearchAction):
        action = msgspec.structs.replace(
            action, sources=None if action.sources is None else list(action.sources)
        )
    return msgspec.structs.replace(item, action=action)


def _text(text: str) -> OutputText:
    # OpenAI always sends both lists; SDK models read them.
    return OutputText(text=text, annotations=[], logprobs=[])


class MessageStream:
    """An assistant message streamed token by token. ``item`` is the live output item; events carry
    copies of it."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self._builder = builder
        self.item_id = new_item_id("msg")
        self.item = Message(id=self.item_id, role="assistant", content=[], status="in_progress")
        self.index = builder._add(self.item)
        self._parts: list[str] = []

    def added(self) -> list[ServerEvent]:
        seq = self._builder.next_sequence
        return [
            OutputItemAdded(
                output_index=self.index,
                item=Message(id=self.item_id, role="assistant", content=[], status="in_progress"),
                sequence_number=seq(),
            ),
            ContentPartAdded(
                item_id=self.item_id,
                output_index=self.index,
                content_index=0,
                part=_text(""),
                sequence_number=seq(),
            ),
        ]

    def delta(self, text: str) -> OutputTextDelta:
        self._parts.append(text)
        return OutputTextDelta(
            item_id=self.item_id,
            output_index=self.index,
            content_index=0,
            delta=text,
            sequence_number=self._builder.next_sequence(),
        )

    def done(self) -> list[ServerEvent]:
        seq = self._builder.next_sequence
        text = "".join(self._parts)
        self.item.content = [_text(text)]
        self.item.status = "completed"
        return [
            OutputTextDone(
                item_id=self.item_id,
                output_index=self.index,
                content_index=0,
                text=text,
                sequence_number=seq(),
            ),
            ContentPartDone(
                item_id=self.item_id,
                output_index=self.index,
                content_index=0,
                part=_text(text),
                sequence_number=seq(),
            ),
            OutputItemDone(
                output_index=self.index,
                item=Message(id=self.item_id, role="assistant", content=[_text(text)], status="completed"),
                sequence_number=seq(),
            ),
        ]


class CallStream:
    """A function call whose arguments stream token by token. ``item`` is the live output item; events
    carry copies of it."""

    def __init__(
        self, builder: ResponseBuilder, name: str, call_id: str, namespace: str | None = None
    ) -> None:
        self._builder = builder
        self.item_id = new_item_id("fc")
        self.item = FunctionCall(
            id=self.item_id,
            call_id=call_id,
            name=name,
            arguments="",
            status="in_progress",
            namespace=namespace,
        )
        self.index = builder._add(self.item)
        self._parts: list[str] = []

    def added(self) -> list[ServerEvent]:
        return [
            OutputItemAdded(
                output_index=self.index,
                item=msgspec.structs.replace(self.item),
                sequence_number=self._builder.next_sequence(),
            )
        ]

    def delta(self, text: str) -> FunctionCallArgumentsDelta:
        self._parts.append(text)
        return FunctionCallArgumentsDelta(
            item_id=self.item_id,
            output_index=self.index,
            delta=text,
            sequence_number=self._builder.next_sequence(),
        )

    def done(self) -> list[ServerEvent]:
        seq = self._builder.next_sequence
        self.item.arguments = "".join(self._parts)
        self.item.status = "completed"
        return [
            FunctionCallArgumentsDone(
                item_id=self.item_id,
                output_index=self.index,
                arguments=self.item.arguments,
                name=self.item.name,
                sequence_number=seq(),
            ),
            OutputItemDone(
                output_index=self.index, item=msgspec.structs.replace(self.item), sequence_number=seq()
            ),
        ]


class CustomCallStream:
    """A call of a custom (freeform) tool: its ``input`` streams as ``response.custom_tool_call_input.delta``
    (OpenAI's function-calling guide, custom tools). Custom call items carry no status."""

    def __init__(
        self, builder: ResponseBuilder, name: str, call_id: str, namespace: str | None = None
    ) -> None:
        self._builder = builder
        self.item_id = new_item_id("ctc")
        self.item = CustomToolCall(id=self.item_id, call_id=call_id, name=name, input="", namespace=namespace)
        self.index = builder._add(self.item)
        self._parts: list[str] = []

    def added(self) -> list[ServerEvent]:
        return [
            OutputItemAdded(
                output_index=self.index,
                item=msgspec.structs.replace(self.item),
                sequence_number=self._builder.next_sequence(),
            )
        ]

    def delta(self, text: str) -> CustomToolCallInputDelta:
        self._parts.append(text)
        return CustomToolCallInputDelta(
            item_id=self.item_id,
            output_index=self.index,
            delta=text,
            sequence_number=self._builder.next_sequence(),
        )

    def done(self) -> list[ServerEvent]:
        seq = self._builder.next_sequence
        self.item.input = "".join(self._parts)
        return [
            CustomToolCallInputDone(
                item_id=self.item_id, output_index=self.index, input=self.item.input, sequence_number=seq()
            ),
            OutputItemDone(
                output_index=self.index, item=msgspec.structs.replace(self.item), sequence_number=seq()
            ),
        ]


class ReasoningStream:
    """A reasoning item: its tokens are decoded (paced by the GPU) but not shown; when the item is done
    its summary streams (``reasoning.summary`` asked for one) and ``encrypted_content`` is set (``include``
    asked for it), as OpenAI's reasoning guide describes."""

    def __init__(self, builder: ResponseBuilder, summary: str | None) -> None:
        self._builder = builder
        self.item_id = new_item_id("rs")
        self.item = Reasoning(id=self.item_id, summary=[], status="in_progress")
        self.index = builder._add(self.item)
        self._summary = summary
        self._encrypted: str | None = None

    def set_encrypted(self, content: str) -> None:
        self._encrypted = content

    def added(self) -> list[ServerEvent]:
        return [
            OutputItemAdded(
                output_index=self.index,
                item=msgspec.structs.replace(self.item, summary=[]),
                sequence_number=self._builder.next_sequence(),
            )
        ]

    def done(self) -> list[ServerEvent]:
        seq = self._builder.next_sequence
        events: list[ServerEvent] = []
        if self._summary is not None:
            text, item_id, index = self._summary, self.item_id, self.index
            events += [
                ReasoningSummaryPartAdded(
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    part=SummaryPart(text=""),
                    sequence_number=seq(),
                ),
                ReasoningSummaryTextDelta(
                    item_id=item_id, output_index=index, summary_index=0, delta=text, sequence_number=seq()
                ),
                ReasoningSummaryTextDone(
                    item_id=item_id, output_index=index, summary_index=0, text=text, sequence_number=seq()
                ),
                ReasoningSummaryPartDone(
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    part=SummaryPart(text=text),
                    sequence_number=seq(),
                ),
            ]
            self.item.summary = [ReasoningSummary(text=text)]
        self.item.encrypted_content = self._encrypted
        self.item.status = "completed"
        copy = msgspec.structs.replace(self.item, summary=list(self.item.summary))
        events.append(OutputItemDone(output_index=self.index, item=copy, sequence_number=seq()))
        return events


class CompactionStream:
    """A ``compaction`` item, the answer to a ``compaction_trigger`` (docs/protocol.md, "Compaction"): its
    tokens (the summary) are decoded, paced by the GPU, but not shown; the item carries its opaque
    ``encrypted_content`` from the start, as it is known before the first token."""

    def __init__(self, builder: ResponseBuilder, encrypted: str) -> None:
        self._builder = builder
        self.item = Compaction(id=new_item_id("cmp"), encrypted_content=encrypted)
        self.index = builder._add(self.item)

    def added(self) -> list[ServerEvent]:
        item = msgspec.structs.replace(self.item)
        seq = self._builder.next_sequence
        return [
            OutputItemAdded(output_index=self.index, item=item, sequence_number=seq()),
            CompactionCompacting(item_id=item.id or "", output_index=self.index, sequence_number=seq()),
        ]

    def done(self) -> list[ServerEvent]:
        item = msgspec.structs.replace(self.item)
        return [
            OutputItemDone(output_index=self.index, item=item, sequence_number=self._builder.next_sequence())
        ]
