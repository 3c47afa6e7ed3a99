"""The long-lived protocol's connection core (``?protocol=longlived``), sans-IO.

Push frames in with ``receive`` / ``receive_binary``; each returns the actions the caller must carry out,
in order: ``Reply`` (send these bytes), ``Start`` (run the pre-inference pipeline, then call ``opened`` or
``abort``), ``Resume`` (hand the items to the suspended response), ``Cancel`` (stop the response; its
terminal event says ``reason``), ``Close`` (send what is queued, then close the socket). Every server event
of the open response goes out through ``frame``, which applies the server-side transitions
(``response.done`` suspends; a terminal event ends) and encodes it. Peer errors never escape: they come
back as ``Reply`` with an ``error`` frame and leave the state as it was (nothing half-applied).

The core owns every decision about the open response, so the adapter keeps no flags of its own:

* a cancel while the pre-inference pipeline runs is remembered; ``opened`` then says the response must
  end ``cancelled`` at once;
* user messages appended while the model samples wait here (``take_queued``, at the next turn boundary),
  at most ``max_queued_items`` of them (``too_many_queued_items`` past that);
* a ``response.done`` with more calls than ``max_pending_calls`` is refused (``too_many_pending_calls``):
  the response fails with that code and the connection serves on;
* the connection's age limit (``expire``): a suspended response ends ``incomplete``
  (``websocket_connection_limit_reached``), a streaming one is let reach its next suspension or its end,
  then one ``error`` and close 1000 — never a response cut without its terminal event.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field

import msgspec

from proto.core import codec
from proto.core.actions import Reply, Start, error_reply, new_response_id
from proto.core.create import CreateLimits, validate_create
from proto.core.errors import ClientError, LocalProtocolError
from proto.core.events import (
    TERMINAL_EVENTS,
    InjectCreated,
    InjectFailed,
    ResponseAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseDone,
    ResponseInject,
    ResponseSteer,
    ServerEvent,
    WireEvent,
)
from proto.core.items import CALL_ITEMS, OUTPUT_ITEMS, CallItem, Item, Message, OutputItem
from proto.core.state import ABORT_RETURNS, REFUSALS, TRANSITIONS, Event, State
from proto.core.work import WorkCounters

# The events whose framing changes the state (``frame``); every other one just streams.
_TRANSITION_EVENTS = frozenset({ResponseDone, *TERMINAL_EVENTS})
_encode = codec.encode

CLOSE_LIMIT_REACHED = (
    1000  # a normal closure: the server ends the connection on purpose, the client reconnects
)


@dataclass(frozen=True)
class EventLimits:
    """Per-event limits; each is a server flag (``--max-input-items`` …)."""

    max_input_items: int = 2048
    max_tools: int = 128
    max_pending_calls: int = 64
    max_queued_items: int = 2048

    @property
    def create(self) -> CreateLimits:
        return CreateLimits(self.max_input_items, self.max_tools)


@dataclass(frozen=True)
class Resume:
    items: list[Item]  # the outputs in the order the calls were made, then any user messages


@dataclass(frozen=True)
class Cancel:
    response_id: str
    reason: str = "cancelled"  # the terminal event's incomplete_details.reason


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


@dataclass(frozen=True)
class OpenNext:
    """After the ``Cancel`` before it has been carried out (the superseded response's terminal event is
    framed): call ``open_next`` and carry out what it returns."""


Action = Reply | Start | Resume | Cancel | Close | OpenNext


@dataclass
class _Open:
    """The open response, as far as the wire is concerned."""

    id: str
    work: WorkCounters
    pending: dict[str, str] = field(default_factory=dict)  # call_id -> name, in call order
    received: dict[str, OutputItem] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)  # every call answered so far in this response
    calls: dict[str, str] = field(default_factory=dict)  # every call this response made: call_id -> name
    extra: list[Item] = field(default_factory=list)  # user messages appended while suspended
    queued: list[Item] = field(default_factory=list)  # user messages appended while sampling
    cancel: Cancel | None = None  # asked for; the response has not ended yet


class LongLivedCore:
    def __init__(
        self,
        known_models: Container[str],
        limits: EventLimits | None = None,
        new_id: Callable[[], str] = new_response_id,
    ) -> None:
        self.state = State.IDLE
        self._models = known_models
        self._limits = limits or EventLimits()
        self._new_id = new_id
        self._open: _Open | None = None
        self._before_open = State.IDLE
        self._last_id: str | None = None
        self._expiring = False  # the age limit passed: close once no response is open
        self._next: tuple[ResponseCreate, list[Item], WorkCounters] | None = (
            None  # a create superseding the open response
        )

    # ------------------------------------------------------------------------------------ properties
    @property
    def response_id(self) -> str | None:
        return self._open.id if self._open else None

    @property
    def pending_calls(self) -> list[str]:
        """The calls the suspended response waits on, in call order (answered ones included)."""
        return list(self._open.pending) if self._open else []

    @property
    def outstanding_calls(self) -> list[str]:
        """The pending calls that have no output yet."""
        open_ = self._open
        return [call_id for call_id in open_.pending if call_id not in open_.received] if open_ else []

    @property
    def busy(self) -> bool:
        """A response is open (its pre-inference, sampling or suspended): the connection is not idle."""
        return self._open is not None

    @property
    def cancelling(self) -> Cancel | None:
        """The cancel asked for the open response, if any (what its terminal event must say)."""
        return self._open.cancel if self._open else None

    def take_queued(self) -> list[Item]:
        """User messages appended while the model sampled: they join the context at this turn boundary."""
        if self._open is None or not self._open.queued:
            return []
        items, self._open.queued = self._open.queued, []
        return items

    # ------------------------------------------------------------------------------------ peer input
    def receive(self, data: str | bytes) -> list[Action]:
        """One text frame from the client. Never raises for the peer's bad input."""
        try:
            if self.state is State.CLOSED:
                raise LocalProtocolError("receive() after close()")
            event = codec.decode_client_event(data)
            match event:
                case ResponseCreate():
                    return self._create(event)
                case ResponseAppend():
                    return self._append(event.input, event.response_id)
                case ResponseInject():
                    return self._inject(event)
                case ResponseCancel():
                    return self._cancel(event.response_id)
                case ResponseSteer():
                    raise ClientError(
                        "unknown_event_type",
                        "response.steer is GA WebSocket mode's; here response.append steers",
                        "$.type",
                    )
        except ClientError as exc:
            return [self.error(exc)]
        raise LocalProtocolError(f"unhandled event {event!r}")  # pragma: no cover - exhaustive match

    def receive_binary(self, data: bytes) -> list[Action]:
        del data
        return [self.error(ClientError("binary_frame_not_supported", "send events as text frames"))]

    def _create(self, event: ResponseCreate) -> list[Action]:
        self._check(Event.CREATE)
        if self.state is State.SUSPENDED:
            return self._supersede(event)
        items, work = validate_create(
            event, self._models, self._limits.create, root="$.", refuse_background=False
        )
        return self._start(event, items, work)

    def _start(self, event: ResponseCreate, items: list[Item], work: WorkCounters) -> list[Action]:
        self._before_open = self.state
        self._transition(Event.CREATE)
        self._open = _Open(id=self._new_id(), work=work)
        return [Start(self._open.id, event, items, work)]

    def _supersede(self, event: ResponseCreate) -> list[Action]:
        """A create while the open response waits on its calls: it ends ``incomplete`` (reason
        ``superseded``, billed once like any cut) and the new one opens after its terminal event. One
        create at a time: a second, or one after a cancel, is ``response_in_progress``. The create is
        validated first, so a bad one leaves the suspended response as it was."""
        open_ = self._open
        assert open_ is not None
        if self._next is not None or open_.cancel is not None or self._expiring:
            raise ClientError(
                "response_in_progress", "the open response is already ending; wait for its terminal event"
            )
        items, work = validate_create(
            event, self._models, self._limits.create, root="$.", refuse_background=False
        )
        self._transition(Event.CREATE)
        self._next = (event, items, work)
        return [*self._cut(Cancel(open_.id, "superseded")), OpenNext()]

    def open_next(self) -> list[Action]:
        """The superseded response has ended: open the create that superseded it (nothing if the
        connection closed meanwhile)."""
        if self._next is not None and self.state not in (State.ENDED, State.CLOSED):
            raise LocalProtocolError(
                f"open_next() in state {self.state.name}: the superseded response has not ended"
            )
        pending, self._next = self._next, None
        if pending is None or self.state is State.CLOSED:
            return []
        return self._start(*pending)

    def _event_items(self, raw: list[msgspec.Raw]) -> list[Item]:
        """An append's (or inject's) ``input`` checked on its own, before the state is consulted, so a
        malformed event gets the same error whenever it lands (docs/protocol.md, "Append rules": the order).
        An empty one is answered, never silently dropped (OpenAI's code for an empty array)."""
        if not raw:
            raise ClientError(
                "empty_array", "Invalid 'input': empty array. Expected at least one item.", "$.input"
            )
        if len(raw) > self._limits.max_input_items:
            raise ClientError(
                "too_many_items", f"at most {self._limits.max_input_items} input items", "$.input"
            )
        return codec.decode_items(raw)

    def _append(self, raw: list[msgspec.Raw], response_id: str | None) -> list[Action]:
        return self._append_items(self._event_items(raw), response_id)

    def _append_items(self, items: list[Item], response_id: str | None) -> list[Action]:
        if response_id is not None and self._open is not None and response_id != self._open.id:
            code = "response_already_completed" if response_id == self._last_id else "response_not_found"
            raise ClientError(code, f"response {response_id!r} is not the open response", "$.response_id")
        if self._open is None:
            self._check(Event.APPEND)
        assert self._open is not None
        open_ = self._open
        outputs: dict[str, OutputItem] = {}
        messages: list[Item] = []
        for index, item in enumerate(items):
            path = f"$.input[{index}]"
            if isinstance(item, Message):
                if item.role == "assistant":
                    raise ClientError(
                        "invalid_request", "append accepts user, system or developer messages", f"{path}.role"
                    )
                messages.append(item)
            elif isinstance(item, OUTPUT_ITEMS):
                call_id = item.call_id or ""
                if call_id in open_.received or call_id in open_.answered or call_id in outputs:
                    raise ClientError(
                        "duplicate_call_output", f"call {call_id!r} already has an output", f"{path}.call_id"
                    )
                if call_id not in open_.pending:
                    raise ClientError(
                        "unknown_call_id",
                        f"the response is not waiting on call {call_id!r}",
                        f"{path}.call_id",
                    )
                outputs[call_id] = item
            elif isinstance(item, CALL_ITEMS):
                self._check_echo(item, path)  # already in the context: accepted, not added again
            else:
                raise ClientError(
                    "invalid_request",
                    "append accepts function_call_output, custom_tool_call_output, message items and echoes "
                    "of pending calls",
                    f"{path}.type",
                )
        if self.state is not State.SUSPENDED:
            if len(open_.queued) + len(messages) > self._limits.max_queued_items:
                limit = self._limits.max_queued_items
                raise ClientError(
                    "too_many_queued_items",
                    f"at most {limit} messages may wait for the next turn (--max-queued-items)",
                    "$.input",
                )
            open_.work.items_validated += len(items)
            self._transition(Event.APPEND)
            open_.queued.extend(messages)
            return []
        open_.work.items_validated += len(items)
        open_.received.update(outputs)
        open_.extra.extend(messages)
        if len(open_.received) < len(open_.pending):
            self._transition(Event.APPEND)
            return []
        self._transition(Event.RESUME)
        ordered: list[Item] = [open_.received[call_id] for call_id in open_.pending]
        resume = Resume(ordered + open_.extra)
        open_.answered.update(open_.pending)
        open_.pending.clear()
        open_.received.clear()
        open_.extra = []
        return [resume]

    def _check_echo(self, item: CallItem, path: str) -> None:
        """A client may send the model's own call back before its output (Codex 0.87's v1 transport does):
        accepted when it names a call this response made, with the same name; dropped, since the call is
        already in the context."""
        open_ = self._open
        assert open_ is not None
        name = open_.pending.get(item.call_id) or open_.calls.get(item.call_id)
        if name is None:
            raise ClientError(
                "unknown_call_id", f"the response made no call {item.call_id!r}", f"{path}.call_id"
            )
        if name != item.name:
            raise ClientError(
                "invalid_request", f"call {item.call_id!r} is {name!r}, not {item.name!r}", f"{path}.name"
            )

    def _inject(self, event: ResponseInject) -> list[Action]:
        # The beta spelling of append: acknowledged or refused with its own event types, its input checked
        # on its own first, as an append's is.
        try:
            items = self._event_items(event.input)
            if self._open is None or event.response_id != self._open.id:
                code = (
                    "response_already_completed"
                    if event.response_id == self._last_id
                    else "response_not_found"
                )
                raise ClientError(code, f"cannot inject into {event.response_id!r}")
            actions = self._append_items(items, event.response_id)
        except ClientError as exc:
            return [
                self._reply(
                    InjectFailed(
                        response_id=event.response_id,
                        code=exc.code,
                        message=exc.message,
                        event_id=event.event_id,
                    )
                )
            ]
        return [self._reply(InjectCreated(response_id=event.response_id, event_id=event.event_id)), *actions]

    def _cancel(self, response_id: str | None) -> list[Action]:
        if self._open is None:
            if response_id is not None and response_id != self._last_id:
                raise ClientError(
                    "response_not_found", f"no response {response_id!r} on this connection", "$.response_id"
                )
            self._check(Event.CANCEL)
        assert self._open is not None
        if response_id is not None and response_id != self._open.id:
            raise ClientError(
                "response_not_found", f"response {response_id!r} is not the open response", "$.response_id"
            )
        self._transition(Event.CANCEL)
        return self._cut(Cancel(self._open.id))

    def _cut(self, cancel: Cancel) -> list[Action]:
        open_ = self._open
        assert open_ is not None
        if open_.cancel is not None:
            return []  # already ending: the first reason stands
        open_.cancel = cancel
        # Still in the pre-inference pipeline: it runs to its end, then ``opened`` ends the response.
        return [] if self.state is State.OPENING else [cancel]

    def expire(self) -> list[Action]:
        """The connection reached its age limit (call again when the open response has ended)."""
        if self.state is State.CLOSED:
            return []
        self._expiring = True
        if self._open is None:
            limit = ClientError(
                "websocket_connection_limit_reached", "the connection reached its maximum age; open a new one"
            )
            return [self.error(limit), Close(CLOSE_LIMIT_REACHED, "websocket_connection_limit_reached")]
        if self.state is State.SUSPENDED:
            return self._cut(Cancel(self._open.id, "websocket_connection_limit_reached"))
        return []  # streaming: it reaches its next suspension or its end first

    @property
    def expiring(self) -> bool:
        return self._expiring

    # ------------------------------------------------------------------------------------ our output
    def opened(self) -> bool:
        """The pre-inference pipeline accepted the create; the response's events may now be framed.
        False when the client cancelled meanwhile: the response must end ``cancelled`` at once."""
        self._transition(Event.OPENED)
        return self._open is None or self._open.cancel is None

    def abort(self, exc: ClientError) -> bytes:
        """The pre-inference pipeline refused the create: an error frame, and no response was opened."""
        if self.state is not State.OPENING or self._before_open not in ABORT_RETURNS:
            raise LocalProtocolError(f"abort() in state {self.state.name}")
        self.state = self._before_open
        self._open = None
        return self.error(exc).data

    def frame(self, event: ServerEvent) -> bytes:
        """Encode one event of the open response, applying its transition.

        Raises ``ClientError('too_many_pending_calls')`` for a ``response.done`` with more calls than one
        response may hold open; nothing changes, and the response must end with that failure."""
        if self.state is State.STREAMING and type(event) not in _TRANSITION_EVENTS:
            return _encode(event)  # an output event of a sampling response (one per token): no transition
        open_ = self._open
        if open_ is None:
            raise LocalProtocolError(
                f"frame({type(event).__name__}) with no open response (state {self.state.name})"
            )
        if isinstance(event, ResponseDone):
            limit = self._limits.max_pending_calls
            if len(event.pending_calls) > limit:
                count = len(event.pending_calls)
                raise ClientError(
                    "too_many_pending_calls",
                    f"the model made {count} parallel calls; at most {limit} may be pending "
                    f"(--max-pending-calls)",
                )
            self._transition(Event.SUSPEND)
            open_.pending = {call.call_id: call.name for call in event.pending_calls}
            open_.calls.update(open_.pending)
        elif isinstance(event, TERMINAL_EVENTS):
            self._transition(Event.TERMINAL)
            self._last_id = open_.id
            self._open = None
        elif self.state is State.OPENING:
            raise LocalProtocolError(f"frame({type(event).__name__}) before opened()")
        elif self.state is not State.STREAMING:
            # Only a sampling response has output to stream: not one waiting on its calls, not a closed one.
            raise LocalProtocolError(f"frame({type(event).__name__}) in state {self.state.name}")
        return codec.encode(event)

    def error(self, exc: ClientError) -> Reply:
        return error_reply(exc)

    def close(self) -> None:
        if self.state is not State.CLOSED:
            self._transition(Event.CLOSE)

    # ------------------------------------------------------------------------------------ the table
    def _check(self, event: Event) -> None:
        if (self.state, event) not in TRANSITIONS:
            code = REFUSALS.get((self.state, event))
            if code is None:
                raise LocalProtocolError(f"no transition for {event.name} in state {self.state.name}")
            raise ClientError(
                code, f"{event.name.lower()} is not allowed: connection is {self.state.name.lower()}"
            )

    def _transition(self, event: Event) -> None:
        self._check(event)
        self.state = TRANSITIONS[(self.state, event)]

    @staticmethod
    def _reply(event: WireEvent) -> Reply:
        return Reply(codec.encode(event))
