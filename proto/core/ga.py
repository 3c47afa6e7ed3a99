"""GA WebSocket mode's connection core (the default protocol on ``/v1/responses``), sans-IO.

As OpenAI documents the mode (the WebSocket mode guide and the WebSocket events reference): the client
sends flat ``response.create`` events (the body of ``POST /v1/responses`` plus ``type``); each response
streams the same events as SSE and ends at its first local call; the client continues with
``previous_response_id`` and only the new items; the connection has a maximum age.

Lanes (``stream_id``). A create names its lane; every event of that response, and a lane's errors, echo
the lane's ``stream_id``. Lanes run in parallel on one socket; within a lane, one response is in flight
and further creates wait their turn, first in first out. The limits are the service's, as the openai SDK's
lane session documents them (``openai/lib/responses_websocket/README.md``, "Lanes, limits and connection
lifetime"): at most ``MAX_ACTIVE`` responses in flight per connection, further creates wait for a slot
(lanes take freed slots in the order they started waiting); at most ``MAX_NAMED_LANES`` distinct
``stream_id`` values per connection, the default lane not counted and a lane never given back
(``websocket_stream_limit_reached``); a malformed ``stream_id`` is ``invalid_stream_id``. The default lane
(no ``stream_id``) keeps this mode's first rule: a second create while one is in flight (or waits for a
slot) is refused ``response_in_progress``. ``previous_response_id`` is lineage, not routing: a lane may
fork a response made on another.

Steering (beta ``response.steer``: ``previous_response_id`` + user input). Input for a response in flight
is accepted (``response.steer.accepted``) and queued; at the response's next turn boundary it ends
``incomplete`` with reason ``steered``, or at its end; then, as the guide says:
* it ended ``steered`` or completed with a final answer: a successor starts by itself on the same lane,
  continuing from it with the queued input and its settings;
* it completed at local tool calls: the input stays queued, ``response.steer.pending`` lists the
  outputs owed (``required_input``), and the client's next ``response.create`` with that
  ``previous_response_id`` gets the queued input prepended to its own;
* it failed or was cut: ``response.steer.failed`` returns the input.
Input for a response not in flight is ``response.steer.failed`` at once (``response_not_found``,
``response_already_completed``), as is input other than user messages (``invalid_input``).

Push frames in with ``receive(data, now)``; it returns the actions to carry out, in order: ``Reply`` (send
these bytes), ``Start`` (run the response on its lane; call ``finished`` once it has ended or was
refused), ``SteerReply`` (stamp with the response's next sequence number, frame, send), ``Close`` (send
nothing more, close the socket). The cache of recent responses lives in the adapter (it holds sampler
objects); this core only decides what a frame means.
"""

from __future__ import annotations

import re
import secrets
from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

import msgspec

from proto.core import codec
from proto.core.actions import Reply, Start, error_reply, new_response_id
from proto.core.create import CreateLimits, validate_create
from proto.core.errors import ClientError, LocalProtocolError
from proto.core.events import (
    RequiredCustomOutput,
    RequiredFunctionOutput,
    ResponseCreate,
    ResponseSteer,
    ServerEvent,
    SteerAccepted,
    SteerError,
    SteerFailed,
    SteerFailure,
    SteerPending,
    SteerRef,
)
from proto.core.items import CustomToolCall, Item, Message
from proto.core.state import LANE_REFUSALS, LANE_TRANSITIONS, LaneEvent, LaneState
from proto.core.work import WorkCounters

CLOSE_LIMIT_REACHED = (
    1000  # a normal closure: the server ends the connection on purpose, the client reconnects
)
STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")  # what the openai SDK's lane router accepts
# The service's limits, from the openai SDK's lane session README: "The service allows 16 active responses
# and queues additional creates. It accepts 32 distinct named IDs per connection; the default lane does
# not count."
MAX_ACTIVE = 16  # responses in flight on one connection, every lane together
MAX_NAMED_LANES = 32  # distinct stream_id values one connection may use (the default lane not counted)
# The lab's own bound on creates waiting on one connection (the service documents none): memory, not
# policy; past it a create is refused ``too_many_queued_items``.
MAX_QUEUED = 256
MAX_STEERS = 16  # accepted steering submissions waiting on one response


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


@dataclass(frozen=True)
class SteerReply:
    """A steering event for the response ``response_id`` (None: no response took it): stamp it with that
    response's next sequence number while it is in flight, frame it on ``stream_id``, send it."""

    event: ServerEvent
    response_id: str | None
    stream_id: str | None


Action = Reply | Start | SteerReply | Close


@dataclass(frozen=True)
class Outcome:
    """How a response ended, as far as its lane and its steering need to know."""

    status: str  # completed | incomplete | failed | cancelled, or "refused" (pre-inference said no)
    reason: str | None = None  # incomplete_details.reason
    owed: tuple[tuple[str, str, str], ...] = ()  # (item type, call_id, name) of the local calls it ended at


@dataclass
class _Steer:
    id: str
    target: str
    items: list[Item]
    raw: Any  # the input as it came, for response.steer.failed


@dataclass
class _Lane:
    stream_id: str | None
    state: LaneState = LaneState.IDLE
    current: Start | None = None
    queue: deque[Start] = field(default_factory=deque)

    def check(self, event: LaneEvent) -> None:
        if (self.state, event) not in LANE_TRANSITIONS:
            code = LANE_REFUSALS.get((self.state, event))
            if code is None:
                raise LocalProtocolError(f"no transition for {event.name} in lane state {self.state.name}")
            raise ClientError(code, f"a response is in flight on this lane ({event.name.lower()} refused)")

    def transition(self, event: LaneEvent) -> None:
        self.check(event)
        self.state = LANE_TRANSITIONS[(self.state, event)]


class GaCore:
    def __init__(
        self,
        known_models: Container[str],
        limits: CreateLimits,
        opened_at: float,
        max_age_s: float,
        new_id: Callable[[], str] = new_response_id,
    ) -> None:
        self.closed = False
        self._models = known_models
        self._limits = limits
        self._new_id = new_id
        self.deadline = opened_at + max_age_s  # same clock as ``now``
        self._lanes: dict[str | None, _Lane] = {None: _Lane(None)}  # every lane used; none is given back
        self._waiting: deque[_Lane] = deque()  # lanes waiting for a slot, in the order they began to wait
        self._ended: set[str] = set()  # responses that ended on this connection (for steering refusals)
        self._steers: dict[str, list[_Steer]] = {}  # accepted, waiting on a response in flight
        self._owed: dict[str, tuple[list[_Steer], str | None]] = {}  # waiting on a response's tool outputs

    # ------------------------------------------------------------------------------------ properties
    @property
    def in_flight(self) -> bool:
        return self.active > 0

    @property
    def active(self) -> int:
        """Responses in flight on this connection (at most ``MAX_ACTIVE``)."""
        return sum(lane.state is LaneState.IN_FLIGHT for lane in self._lanes.values())

    @property
    def queued(self) -> int:
        """Creates waiting on this connection: behind their lane's response, or for a slot."""
        return sum(len(lane.queue) for lane in self._lanes.values())

    def steering_due(self, response_id: str) -> bool:
        """Accepted steering input waits on this response: it should end at its next turn boundary."""
        return bool(self._steers.get(response_id))

    # ------------------------------------------------------------------------------------ peer input
    def receive(self, data: str | bytes, now: float) -> list[Action]:
        """One text frame from the client. Never raises for the peer's bad input."""
        if now >= self.deadline and not self.closed:
            return self.expire()
        lane_id: str | None = None
        try:
            event = codec.decode_client_event(data)
            if isinstance(event, ResponseSteer):
                return self._steer(event)
            if not isinstance(event, ResponseCreate):
                kind = type(event).__struct_config__.tag
                raise ClientError(
                    "unknown_event_type", f"{kind!r} is not an event of GA WebSocket mode", "type"
                )
            lane_id = event.stream_id
            return self._create(event)
        except ClientError as exc:
            exc.param = codec.body_param(exc.param)  # GA names fields as OpenAI does, like HTTP
            return [self.error(exc, lane_id)]

    def receive_binary(self, data: bytes) -> list[Action]:
        del data
        return [self.error(ClientError("binary_frame_not_supported", "send events as text frames"))]

    def _create(self, event: ResponseCreate) -> list[Action]:
        if self.closed:
            raise ClientError(
                "websocket_connection_limit_reached", "the connection reached its maximum age; open a new one"
            )
        lane_id = event.stream_id
        if lane_id is not None and not STREAM_ID.fullmatch(lane_id):
            raise ClientError(
                "invalid_stream_id",
                "stream_id must be 1-256 ASCII letters, digits, '_', '-' or '.'",
                "$.stream_id",
            )
        lane = self._lanes.get(lane_id)
        if lane is None:
            if len(self._lanes) - 1 >= MAX_NAMED_LANES:  # the default lane is always there, not counted
                raise ClientError(
                    "websocket_stream_limit_reached",
                    f"at most {MAX_NAMED_LANES} distinct stream_id values per connection; open a new one",
                    "$.stream_id",
                )
            lane = _Lane(lane_id)
        items, work = validate_create(event, self._models, self._limits)
        if lane_id is None:
            lane.check(LaneEvent.CREATE)  # the default lane refuses a second create, before anything changes
        busy = lane.state is not LaneState.IDLE or self.active >= MAX_ACTIVE
        if busy and self.queued >= MAX_QUEUED:
            raise ClientError(
                "too_many_queued_items", f"at most {MAX_QUEUED} creates may wait on one connection", None
            )
        self._lanes[lane_id] = lane
        owed = self._owed.pop(event.previous_response_id, None) if event.previous_response_id else None
        if owed is not None:  # steering input held for this parent goes first, in submission order
            items = [item for steer in owed[0] for item in steer.items] + items
        start = Start(self._new_id(), event, items, work, lane_id)
        if lane.state is not LaneState.IDLE:  # a named lane: behind its own response, or waiting for a slot
            lane.transition(LaneEvent.QUEUE)
            lane.queue.append(start)
            return []
        if self.active >= MAX_ACTIVE:
            lane.transition(LaneEvent.WAIT)
            lane.queue.append(start)
            self._waiting.append(lane)
            return []
        lane.transition(LaneEvent.CREATE)
        lane.current = start
        return [start]

    def _steer(self, event: ResponseSteer) -> list[Action]:
        target = event.previous_response_id
        lane = next(
            (
                lane
                for lane in self._lanes.values()
                if lane.current is not None and lane.current.response_id == target
            ),
            None,
        )
        failure = SteerFailure(previous_response_id=target, input=_raw_input(event.input))
        if lane is None:
            code = "response_already_completed" if target in self._ended else "response_not_found"
            owed = self._owed.get(target)
            if owed is None:
                return [
                    self._failed(
                        failure, code, f"response {target!r} is not in flight on this connection", None
                    )
                ]
        try:
            items = _steering_items(event.input)
        except ClientError as exc:
            return [self._failed(failure, "invalid_input", exc.message, lane.stream_id if lane else None)]
        steer = _Steer("steer_" + secrets.token_hex(12), target, items, failure.input)
        ref = SteerRef(id=steer.id, previous_response_id=target)
        if lane is None:  # the response waits on its tool outputs: held with what it owes
            held, stream_id = self._owed[target]
            if len(held) >= MAX_STEERS:
                return [
                    self._failed(
                        failure,
                        "too_many_pending_steers",
                        f"at most {MAX_STEERS} steering inputs may wait",
                        stream_id,
                    )
                ]
            held.append(steer)
            return [SteerReply(SteerAccepted(steer=ref), None, stream_id)]
        waiting = self._steers.setdefault(target, [])
        if len(waiting) >= MAX_STEERS:
            return [
                self._failed(
                    failure,
                    "too_many_pending_steers",
                    f"at most {MAX_STEERS} steering inputs may wait",
                    lane.stream_id,
                )
            ]
        waiting.append(steer)
        return [SteerReply(SteerAccepted(steer=ref), target, lane.stream_id)]

    @staticmethod
    def _failed(
        failure: SteerFailure, code: str, message: str, stream_id: str | None, response_id: str | None = None
    ) -> SteerReply:
        return SteerReply(
            SteerFailed(steer=failure, error=SteerError(code=code, message=message)), response_id, stream_id
        )

    # ------------------------------------------------------------------------------------ our side
    def finished(self, start: Start, outcome: Outcome) -> list[Action]:
        """The response ``start`` opened has ended (its terminal event, or its refusal, is framed): what
        its steering becomes, and the lane's next response."""
        lane = self._lanes.get(start.stream_id)
        if lane is None or lane.current is None or lane.current.response_id != start.response_id:
            raise LocalProtocolError(f"finished() for {start.response_id}, which is not in flight")
        self._ended.add(start.response_id)
        actions: list[Action] = []
        steers = self._steers.pop(start.response_id, [])
        successor: Start | None = None
        if steers:
            if outcome.status == "completed" and outcome.owed:
                self._owed[start.response_id] = (steers, start.stream_id)
                stubs = [_stub(kind, call_id, name) for kind, call_id, name in outcome.owed]
                for steer in steers:
                    pending = SteerPending(
                        steer=SteerRef(id=steer.id, previous_response_id=start.response_id),
                        required_input=stubs,
                    )
                    actions.append(SteerReply(pending, None, start.stream_id))
            elif outcome.status == "completed" or (
                outcome.status == "incomplete" and outcome.reason == "steered"
            ):
                successor = self._successor(start, steers)
            else:
                for steer in steers:
                    failure = SteerFailure(
                        previous_response_id=start.response_id, input=steer.raw, id=steer.id
                    )
                    actions.append(
                        self._failed(
                            failure,
                            "response_not_active",
                            f"the response ended {outcome.status}",
                            start.stream_id,
                        )
                    )
        lane.current = None
        if self.closed:  # the connection is going: nothing more starts
            lane.transition(LaneEvent.FINISH)
            return actions
        if successor is not None:  # a steered response's successor keeps its slot: it is the same work
            lane.transition(LaneEvent.NEXT)
            lane.current = successor
            return [*actions, successor]
        if lane.queue and not self._waiting:  # the lane's next create takes the slot: nobody else waits
            lane.transition(LaneEvent.NEXT)
            lane.current = lane.queue.popleft()
            return [*actions, lane.current]
        if lane.queue:  # other lanes wait for a slot: this one goes to the back of the line
            lane.transition(LaneEvent.YIELD)
            self._waiting.append(lane)
        else:
            lane.transition(LaneEvent.FINISH)
        return [*actions, *self._admit()]

    def _admit(self) -> list[Action]:
        """A slot is free: the lane that has waited longest starts its next create."""
        if not self._waiting or self.active >= MAX_ACTIVE:
            return []
        lane = self._waiting.popleft()
        lane.transition(LaneEvent.ADMIT)
        lane.current = lane.queue.popleft()
        return [lane.current]

    def _successor(self, parent: Start, steers: list[_Steer]) -> Start:
        """The automatic successor of a steered response: its settings, continuing from it, with the
        queued input (the guide: "Automatic successors inherit the previous response's settings")."""
        request = msgspec.structs.replace(
            parent.request, previous_response_id=parent.response_id, input=[], generate=True
        )
        work = WorkCounters(requests_validated=1, items_validated=sum(len(s.items) for s in steers))
        return Start(
            self._new_id(),
            request,
            [item for steer in steers for item in steer.items],
            work,
            parent.stream_id,
        )

    def expire(self) -> list[Action]:
        """The connection reached its age limit: one error, then close (the adapter lets responses in
        flight end first)."""
        self.closed = True
        limit = ClientError(
            "websocket_connection_limit_reached", "the connection reached its maximum age; open a new one"
        )
        return [self.error(limit), Close(CLOSE_LIMIT_REACHED, "websocket_connection_limit_reached")]

    def close(self) -> None:
        self.closed = True

    @staticmethod
    def error(exc: ClientError, stream_id: str | None = None) -> Reply:
        return with_lane(error_reply(exc), stream_id)


def with_lane(reply: Reply, stream_id: str | None) -> Reply:
    return Reply(lane_frame(reply.data, stream_id))


def lane_frame(data: bytes, stream_id: str | None) -> bytes:
    """An encoded event with its lane's ``stream_id`` (WebSocket-only envelope metadata, not part of the
    event's own schema): spliced in, so every event type carries it without a field of its own."""
    if stream_id is None:
        return data
    return b'{"stream_id":' + codec.encode(stream_id) + b"," + data[1:]


def _stub(kind: str, call_id: str, name: str) -> RequiredFunctionOutput | RequiredCustomOutput:
    return (
        RequiredCustomOutput(call_id=call_id)
        if kind == CustomToolCall.__struct_config__.tag
        else RequiredFunctionOutput(call_id=call_id, name=name)
    )


def _raw_input(value: str | list[msgspec.Raw]) -> Any:
    return value if isinstance(value, str) else [msgspec.json.decode(raw) for raw in value]


def _steering_items(value: str | list[msgspec.Raw]) -> list[Item]:
    """Only user messages steer (the SDK's ``ResponseSteerInputParam``): a string, or message items."""
    if isinstance(value, list) and not value:
        raise ClientError("invalid_request", "steering input must not be empty", "input")
    items = codec.decode_items(value)
    for index, item in enumerate(items):
        if not isinstance(item, Message) or item.role != "user":
            raise ClientError("invalid_request", "steering accepts only user messages", f"input[{index}]")
    return items
