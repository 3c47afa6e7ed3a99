"""Builds one Response and the streaming events that describe it, in OpenAI's order. Sans-IO.

The sampling loop calls these as the model produces output; the connection core stamps and frames the
events. One builder per response: in the long-lived protocol it spans every turn of the rollout.
"""

from __future__ import annotations

import secrets
import time

import msgspec

from proto.events import (
    ContentPartAdded,
    ContentPartDone,
    CreateBody,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    PendingCall,
    ResponseCompleted,
    ResponseCreated,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ServerEvent,
    WebSearchCompleted,
    WebSearchInProgress,
    WebSearchSearching,
)
from proto.items import FunctionCall, Item, Message, OutputText, WebSearchAction, WebSearchCall
from proto.response import IncompleteDetails, LabInfo, Response, ResponseError, TurnReport, Usage
from proto.work import WorkCounters


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseBuilder:
    def __init__(self, response_id: str, request: CreateBody, mode: str, work: WorkCounters | None = None) -> None:
        self.response = Response(
            id=response_id,
            created_at=int(time.time()),
            status="in_progress",
            model=request.model,
            tools=list(request.tools),
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            instructions=request.instructions,
            previous_response_id=request.previous_response_id,
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            store=request.store,
            metadata=dict(request.metadata or {}),
            user=request.user,
            usage=Usage(),
            lab=LabInfo(mode=mode, work=work or WorkCounters()),
        )
        self._segment_start = 0  # index of the first output item of the current turn

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
        snapshot = self._snapshot(output=[])
        return [ResponseCreated(response=snapshot), ResponseInProgress(response=snapshot)]

    def record_turn(self, report: TurnReport) -> None:
        self.lab.turns.append(report)
        self.usage.add(report.prompt_tokens, report.cached_tokens, report.output_tokens)

    def suspend(self, calls: list[FunctionCall]) -> ResponseDone:
        # Only this turn's output travels with response.done: re-sending the whole rollout on every
        # suspension would make the long-lived response pay O(turns²) bytes for nothing.
        segment = self.response.output[self._segment_start :]
        self._segment_start = len(self.response.output)
        return ResponseDone(
            response=self._snapshot(output=segment),
            pending_calls=[PendingCall(call_id=call.call_id, name=call.name) for call in calls],
        )

    def completed(self) -> ResponseCompleted:
        self.response.status = "completed"
        return ResponseCompleted(response=self.response)

    def incomplete(self, reason: str) -> ResponseIncomplete:
        self.response.status = "cancelled" if reason == "cancelled" else "incomplete"
        self.response.incomplete_details = IncompleteDetails(reason=reason)
        return ResponseIncomplete(response=self.response)

    def failed(self, code: str, message: str) -> ResponseFailed:
        self.response.status = "failed"
        self.response.error = ResponseError(code=code, message=message)
        return ResponseFailed(response=self.response)

    def _snapshot(self, output: list[Item]) -> Response:
        return msgspec.structs.replace(self.response, output=output)

    # ------------------------------------------------------------------------------ output items
    def message(self) -> MessageStream:
        return MessageStream(self)

    def function_call(self, name: str, call_id: str) -> CallStream:
        return CallStream(self, name, call_id)

    def web_search(self, query: str) -> tuple[WebSearchCall, int, list[ServerEvent]]:
        item = WebSearchCall(id=new_item_id("ws"), status="in_progress", action=WebSearchAction(query=query))
        index = self._add(item)
        events: list[ServerEvent] = [
            OutputItemAdded(output_index=index, item=item),
            WebSearchInProgress(item_id=item.id, output_index=index),
            WebSearchSearching(item_id=item.id, output_index=index),
        ]
        return item, index, events

    def web_search_done(self, item: WebSearchCall, index: int, sources: list[dict[str, str]]) -> list[ServerEvent]:
        item.status = "completed"
        if item.action is not None:
            item.action.sources = sources
        return [WebSearchCompleted(item_id=item.id, output_index=index), OutputItemDone(output_index=index, item=item)]

    def _add(self, item: Item) -> int:
        self.response.output.append(item)
        return len(self.response.output) - 1


class MessageStream:
    """An assistant message streamed token by token."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.item = Message(id=new_item_id("msg"), role="assistant", content=[], status="in_progress")
        self.index = builder._add(self.item)
        self._parts: list[str] = []

    def added(self) -> list[ServerEvent]:
        assert self.item.id is not None
        return [
            OutputItemAdded(output_index=self.index, item=self.item),
            ContentPartAdded(item_id=self.item.id, output_index=self.index, content_index=0, part=OutputText(text="")),
        ]

    def delta(self, text: str) -> OutputTextDelta:
        assert self.item.id is not None
        self._parts.append(text)
        return OutputTextDelta(item_id=self.item.id, output_index=self.index, content_index=0, delta=text)

    def done(self) -> list[ServerEvent]:
        assert self.item.id is not None
        text = "".join(self._parts)
        part = OutputText(text=text)
        self.item.content = [part]
        self.item.status = "completed"
        return [
            OutputTextDone(item_id=self.item.id, output_index=self.index, content_index=0, text=text),
            ContentPartDone(item_id=self.item.id, output_index=self.index, content_index=0, part=part),
            OutputItemDone(output_index=self.index, item=self.item),
        ]


class CallStream:
    """A function call whose arguments stream token by token."""

    def __init__(self, builder: ResponseBuilder, name: str, call_id: str) -> None:
        self.item = FunctionCall(id=new_item_id("fc"), call_id=call_id, name=name, arguments="", status="in_progress")
        self.index = builder._add(self.item)
        self._parts: list[str] = []

    def added(self) -> list[ServerEvent]:
        return [OutputItemAdded(output_index=self.index, item=self.item)]

    def delta(self, text: str) -> FunctionCallArgumentsDelta:
        assert self.item.id is not None
        self._parts.append(text)
        return FunctionCallArgumentsDelta(item_id=self.item.id, output_index=self.index, delta=text)

    def done(self) -> list[ServerEvent]:
        assert self.item.id is not None
        self.item.arguments = "".join(self._parts)
        self.item.status = "completed"
        return [
            FunctionCallArgumentsDone(item_id=self.item.id, output_index=self.index, arguments=self.item.arguments, name=self.item.name),
            OutputItemDone(output_index=self.index, item=self.item),
        ]
