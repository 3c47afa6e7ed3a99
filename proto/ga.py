"""GA WebSocket mode's connection core (the default protocol on ``/v1/responses``), sans-IO.

As OpenAI documents the mode: the client sends flat ``response.create`` events (the body of
``POST /v1/responses`` plus ``type``); each response streams the same events as SSE and ends at its first
local call; the client continues with ``previous_response_id`` and only the new items. One response is in
flight per connection; the connection has a maximum age.

Push frames in with ``receive(data, now)``; it returns the actions to carry out, in order: ``Reply`` (send
these bytes), ``Start`` (run the response; call ``finished`` once its terminal event, or its error, is
framed), ``Close`` (send nothing more, close the socket). The connection-local cache of the previous
response lives in the adapter (it holds sampler objects); this core only decides what a frame means.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from enum import Enum, auto

from proto import codec
from proto.actions import Reply, Start, error_reply, new_response_id
from proto.create import CreateLimits, validate_create
from proto.errors import ClientError, LocalProtocolError
from proto.events import ResponseCreate

CLOSE_LIMIT_REACHED = 1000  # a normal closure: the server ends the connection on purpose, the client reconnects


class GaState(Enum):
    IDLE = auto()  # no response in flight: a response.create may start one
    IN_FLIGHT = auto()  # a response runs (pre-inference or sampling); another create is refused
    CLOSED = auto()  # age limit reached or the socket is gone; nothing more happens


class GaEvent(Enum):
    CREATE = auto()  # client: response.create accepted by validation
    FINISH = auto()  # server: the response's terminal event (or its pre-inference error) was framed
    EXPIRE = auto()  # server: connection_max_age_s reached
    CLOSE = auto()  # either side closed the socket


# Every transition of a GA connection. A pair not here is refused: by the code in ``REFUSALS`` when the
# client caused it, otherwise it is our bug (``LocalProtocolError`` naming the state and the event).
TRANSITIONS: dict[tuple[GaState, GaEvent], GaState] = {
    (GaState.IDLE, GaEvent.CREATE): GaState.IN_FLIGHT,
    (GaState.IN_FLIGHT, GaEvent.FINISH): GaState.IDLE,
    (GaState.IDLE, GaEvent.EXPIRE): GaState.CLOSED,
    (GaState.IN_FLIGHT, GaEvent.EXPIRE): GaState.CLOSED,  # the adapter lets the response end first
    (GaState.IDLE, GaEvent.CLOSE): GaState.CLOSED,
    (GaState.IN_FLIGHT, GaEvent.CLOSE): GaState.CLOSED,
}
REFUSALS: dict[tuple[GaState, GaEvent], str] = {
    (GaState.IN_FLIGHT, GaEvent.CREATE): "response_in_progress",
    (GaState.CLOSED, GaEvent.CREATE): "websocket_connection_limit_reached",
}


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


Action = Reply | Start | Close


class GaCore:
    def __init__(
        self,
        known_models: Container[str],
        limits: CreateLimits,
        opened_at: float,
        max_age_s: float,
        new_id: Callable[[], str] = new_response_id,
    ) -> None:
        self.state = GaState.IDLE
        self._models = known_models
        self._limits = limits
        self._new_id = new_id
        self.deadline = opened_at + max_age_s  # same clock as ``now`` (the adapter uses time.monotonic)

    def receive(self, data: str | bytes, now: float) -> list[Action]:
        """One text frame from the client. Never raises for the peer's bad input."""
        if now >= self.deadline and self.state is not GaState.CLOSED:
            return self.expire()
        try:
            event = codec.decode_client_event(data)
            if not isinstance(event, ResponseCreate):
                kind = type(event).__struct_config__.tag
                raise ClientError("unknown_event_type", f"{kind!r} is not an event of GA WebSocket mode (only response.create)", "type")
            self._check(GaEvent.CREATE)
            items, work = validate_create(event, self._models, self._limits)
        except ClientError as exc:
            exc.param = codec.body_param(exc.param)  # GA names fields as OpenAI does, like HTTP
            return [self.error(exc)]
        self._transition(GaEvent.CREATE)
        return [Start(self._new_id(), event, items, work)]

    def receive_binary(self, data: bytes) -> list[Action]:
        del data
        return [self.error(ClientError("binary_frame_not_supported", "send events as text frames"))]

    def finished(self) -> None:
        """The in-flight response's terminal event (or its error) has been framed."""
        if self.state is GaState.IN_FLIGHT:
            self._transition(GaEvent.FINISH)
        elif self.state is not GaState.CLOSED:
            raise LocalProtocolError(f"finished() in state {self.state.name}")

    def expire(self) -> list[Action]:
        """The connection reached its age limit: one error, then close."""
        self._transition(GaEvent.EXPIRE)
        limit = ClientError("websocket_connection_limit_reached", "the connection reached its maximum age; open a new one")
        return [self.error(limit), Close(CLOSE_LIMIT_REACHED, "websocket_connection_limit_reached")]

    def close(self) -> None:
        if self.state is not GaState.CLOSED:
            self._transition(GaEvent.CLOSE)

    @staticmethod
    def error(exc: ClientError) -> Reply:
        return error_reply(exc)

    def _check(self, event: GaEvent) -> None:
        if (self.state, event) not in TRANSITIONS:
            code = REFUSALS.get((self.state, event))
            if code is None:
                raise LocalProtocolError(f"no transition for {event.name} in state {self.state.name}")
            raise ClientError(code, f"{event.name.lower()} is not allowed: connection is {self.state.name.lower()}")

    def _transition(self, event: GaEvent) -> None:
        self._check(event)
        self.state = TRANSITIONS[(self.state, event)]
