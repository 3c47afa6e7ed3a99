"""Every state and every transition of the two WebSocket cores, one table each (after h11's _state.py):
the long-lived connection (``State`` × ``Event``: ``TRANSITIONS``, ``REFUSALS``) and a GA WebSocket lane
(``LaneState`` × ``LaneEvent``: ``LANE_TRANSITIONS``, ``LANE_REFUSALS``).

Everything that changes a connection's or a lane's state lives here: the cores look each (state, event)
pair up in these tables and nowhere else decides. A pair that is not in the table is a ``ClientError`` when
the
client caused it (the code is in ``REFUSALS``) and a ``LocalProtocolError`` when the server did (a bug).

    IDLE ──create──▶ OPENING ──opened──▶ STREAMING ──suspend──▶ SUSPENDED
                      └──abort (pre-inference refused it)──▶ back to IDLE / ENDED
      ▲                │  ▲                  │ append (partial: stays)
      │                │  └────resume────────┘ append (last pending output)
      │           terminal (completed / incomplete / failed / cancelled / superseded by a create)
      │                ▼
      │              ENDED ──create──▶ OPENING …
    any state ──close──▶ CLOSED
"""

from __future__ import annotations

from enum import Enum, auto


class State(Enum):
    IDLE = auto()  # no response opened on this connection yet
    OPENING = auto()  # response.create accepted; the pre-inference pipeline runs (it may still refuse)
    STREAMING = auto()  # a response is open and sampling
    SUSPENDED = auto()  # the open response sent response.done and waits for function_call_outputs
    ENDED = auto()  # the last response sent its terminal event; a new response.create may follow
    CLOSED = auto()  # the connection is gone; nothing more happens


class Event(Enum):
    CREATE = auto()  # client: response.create
    OPENED = auto()  # server: pre-inference done, response.created sent
    ABORT = auto()  # server: pre-inference refused the create (an error event, no response)
    APPEND = auto()  # client: response.append / response.inject (partial, or while streaming)
    RESUME = auto()  # client: the append that brings the last pending output
    CANCEL = auto()  # client: response.cancel
    SUSPEND = auto()  # server: response.done with pending calls
    TERMINAL = auto()  # server: response.completed / .incomplete / .failed
    CLOSE = auto()  # either side: the connection closed


TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.IDLE, Event.CREATE): State.OPENING,
    (State.ENDED, Event.CREATE): State.OPENING,
    (State.OPENING, Event.OPENED): State.STREAMING,
    # (State.OPENING, Event.ABORT) returns to the state the create came from: see ``ABORT_RETURNS``.
    (State.OPENING, Event.APPEND): State.OPENING,  # user messages queue for the first turn
    (State.OPENING, Event.CANCEL): State.OPENING,
    (State.OPENING, Event.TERMINAL): State.ENDED,  # cancelled or failed before the first token
    (State.STREAMING, Event.APPEND): State.STREAMING,  # user messages wait for the next turn boundary
    (State.STREAMING, Event.CANCEL): State.STREAMING,  # the terminal event follows
    (State.STREAMING, Event.SUSPEND): State.SUSPENDED,
    (State.STREAMING, Event.TERMINAL): State.ENDED,
    (State.SUSPENDED, Event.APPEND): State.SUSPENDED,
    # A create on a suspended response supersedes it (Codex's v1 transport sends one when its next input
    # is not an extension): the suspended response is cut (incomplete, reason "superseded"), and once its
    # terminal event is framed the new one opens (``LongLivedCore.open_next``: ENDED --create--> OPENING).
    (State.SUSPENDED, Event.CREATE): State.SUSPENDED,
    (State.SUSPENDED, Event.RESUME): State.STREAMING,
    (State.SUSPENDED, Event.CANCEL): State.SUSPENDED,
    (State.SUSPENDED, Event.TERMINAL): State.ENDED,  # cancel, tool timeout
}
for _state in State:
    if _state is not State.CLOSED:
        TRANSITIONS[(_state, Event.CLOSE)] = State.CLOSED

# What a client gets for a client event its state does not allow.
REFUSALS: dict[tuple[State, Event], str] = {
    (State.IDLE, Event.APPEND): "no_open_response",
    (State.IDLE, Event.RESUME): "no_open_response",
    (State.IDLE, Event.CANCEL): "no_open_response",
    (State.ENDED, Event.APPEND): "response_already_completed",
    (State.ENDED, Event.RESUME): "response_already_completed",
    (State.ENDED, Event.CANCEL): "response_already_completed",
    (State.STREAMING, Event.CREATE): "response_in_progress",
    (State.OPENING, Event.CREATE): "response_in_progress",
    (State.OPENING, Event.RESUME): "unknown_call_id",
    (State.STREAMING, Event.RESUME): "unknown_call_id",
}

# The one transition whose target is not fixed: an aborted create leaves the connection as it found it.
ABORT_RETURNS = frozenset({State.IDLE, State.ENDED})

CLIENT_EVENTS = frozenset({Event.CREATE, Event.APPEND, Event.RESUME, Event.CANCEL})


# ---- GA WebSocket mode: one lane (``stream_id``) of a connection; the default lane is lane "" ----


class LaneState(Enum):
    IDLE = auto()  # no response in flight on this lane and none waiting: a create starts one
    WAITING = auto()  # creates wait on this lane, none in flight: the connection is at its active limit
    IN_FLIGHT = auto()  # a response runs (pre-inference or sampling)


class LaneEvent(Enum):
    CREATE = auto()  # client: a create on an idle lane, a slot free on the connection
    WAIT = auto()  # client: a create on an idle lane while the connection's slots are all taken
    QUEUE = auto()  # client: a create on a busy (or waiting) named lane waits its turn
    ADMIT = auto()  # server: a slot freed and this waiting lane is the first in line: its next create starts
    NEXT = auto()  # server: the response ended and the lane's next one (successor or queued) starts
    YIELD = auto()  # server: the response ended, more wait on this lane, and other lanes wait for a slot
    FINISH = auto()  # server: the response ended (or was refused) and nothing waits


# Every transition of a lane. A pair not here is refused: by the code in ``LANE_REFUSALS`` when the client
# caused it, otherwise it is our bug (``LocalProtocolError`` naming the state and the event).
LANE_TRANSITIONS: dict[tuple[LaneState, LaneEvent], LaneState] = {
    (LaneState.IDLE, LaneEvent.CREATE): LaneState.IN_FLIGHT,
    (LaneState.IDLE, LaneEvent.WAIT): LaneState.WAITING,
    (LaneState.WAITING, LaneEvent.QUEUE): LaneState.WAITING,
    (LaneState.WAITING, LaneEvent.ADMIT): LaneState.IN_FLIGHT,
    (LaneState.IN_FLIGHT, LaneEvent.QUEUE): LaneState.IN_FLIGHT,
    (LaneState.IN_FLIGHT, LaneEvent.NEXT): LaneState.IN_FLIGHT,
    (LaneState.IN_FLIGHT, LaneEvent.YIELD): LaneState.WAITING,
    (LaneState.IN_FLIGHT, LaneEvent.FINISH): LaneState.IDLE,
}
LANE_REFUSALS: dict[tuple[LaneState, LaneEvent], str] = {
    # the default lane does not queue: a create while its response runs or waits for a slot is refused
    (LaneState.IN_FLIGHT, LaneEvent.CREATE): "response_in_progress",
    (LaneState.WAITING, LaneEvent.CREATE): "response_in_progress",
}
