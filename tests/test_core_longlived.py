"""The long-lived connection core with no sockets: frames in, actions / state / frames out (after h11's
tests).

``Pipe`` plays both ends in memory: ``client`` feeds a JSON event to ``LongLivedCore.receive`` as the
WebSocket
adapter would, ``server`` frames the events a sampler would produce (with the real ``ResponseBuilder``), and
every frame the client would have received is kept in ``wire`` so the tests can read the whole conversation.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from helpers import CORE_MODEL, output, user_message

from proto.core import codec
from proto.core.builder import ResponseBuilder
from proto.core.errors import ClientError, LocalProtocolError
from proto.core.events import (
    AnyServerEvent,
    ErrorDetail,
    ErrorEvent,
    InjectCreated,
    InjectFailed,
    OutputTextDelta,
    PendingCall,
    ResponseCompleted,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
)
from proto.core.items import FunctionCall, FunctionCallOutput, Message
from proto.core.longlived import Action, Cancel, EventLimits, LongLivedCore, OpenNext, Reply, Resume, Start
from proto.core.state import CLIENT_EVENTS, REFUSALS, TRANSITIONS, Event, State


class Pipe:
    """One connection core with a scripted server behind it."""

    def __init__(self, limits: EventLimits | None = None) -> None:
        ids = itertools.count(1)
        self.core = LongLivedCore({CORE_MODEL}, limits, new_id=lambda: f"resp_{next(ids)}")
        self.wire: list[AnyServerEvent] = []
        self.builder: ResponseBuilder | None = None
        self.calls = itertools.count(1)

    # ------------------------------------------------------------------------------------ client side
    def client(self, **event: Any) -> list[Action]:
        return self.send(json.dumps(event))

    def send(self, data: str | bytes) -> list[Action]:
        actions = self.core.receive(data)
        self.wire.extend(codec.decode_server_event(a.data) for a in actions if isinstance(a, Reply))
        return actions

    def create(self, **body: Any) -> Start:
        actions = self.client(type="response.create", model=CORE_MODEL, input=body.pop("input", "go"), **body)
        assert len(actions) == 1 and isinstance(actions[0], Start), actions
        return actions[0]

    def append(self, *items: Any, **extra: Any) -> list[Action]:
        return self.client(type="response.append", input=list(items), **extra)

    # ------------------------------------------------------------------------------------ server side
    def server(self, events: list[ServerEvent]) -> None:
        self.wire.extend(codec.decode_server_event(self.core.frame(event)) for event in events)

    def open(self, **body: Any) -> Start:
        start = self.create(**body)
        self.core.opened()
        self.builder = ResponseBuilder(start.response_id, start.request, "longlived", start.work)
        self.server(self.builder.start())
        return start

    def say(self, text: str) -> None:
        assert self.builder is not None
        stream = self.builder.message()
        self.server([*stream.added(), *(stream.delta(part) for part in text.split()), *stream.done()])

    def suspend(self, *names: str) -> list[str]:
        """The model calls these tools in parallel; the response suspends on them."""
        assert self.builder is not None
        calls: list[FunctionCall] = []
        for name in names:
            stream = self.builder.function_call(name, f"call_{next(self.calls)}")
            self.server([*stream.added(), stream.delta('{"q":'), stream.delta('"x"}'), *stream.done()])
            calls.append(stream.item)
        self.server([self.builder.suspend(calls)])
        return [call.call_id for call in calls]

    def web_search(self, query: str) -> None:
        assert self.builder is not None
        item, index, events = self.builder.web_search(query)
        self.server([*events, *self.builder.web_search_done(item, index, [{"url": "u", "title": "t"}])])

    def complete(self) -> None:
        assert self.builder is not None
        self.server([self.builder.completed()])
        self.builder = None

    def stream_of(self, response_id: str) -> list[ServerEvent]:
        """The stamped events of one response, in wire order."""
        events: list[ServerEvent] = []
        for event in self.wire:
            if isinstance(event, ServerEvent):
                if isinstance(event, ResponseCreated) and event.response.id == response_id:
                    events = []
                events.append(event)
        return events


def error_event(actions: list[Action]) -> ErrorEvent:
    assert len(actions) == 1 and isinstance(actions[0], Reply), actions
    event = codec.decode_server_event(actions[0].data)
    assert isinstance(event, ErrorEvent), event
    return event


def error_of(actions: list[Action]) -> ErrorDetail:
    return error_event(actions).error


def status_of(actions: list[Action]) -> int:
    return error_event(actions).status


def code_of(actions: list[Action]) -> str | None:
    return error_of(actions).code


def state_of(pipe: Pipe) -> State:
    # A call, not an attribute: the state changes under mypy's narrowing as the pipe is driven.
    return pipe.core.state


# ================================================================================================ transitions


def pipe_in(state: State) -> Pipe:
    """A connection driven to ``state`` by the ordinary route; SUSPENDED waits on two calls."""
    pipe = Pipe()
    if state is State.IDLE:
        return pipe
    if state is State.CLOSED:
        pipe.core.close()
        return pipe
    if state is State.OPENING:
        pipe.create()
        return pipe
    pipe.open()
    if state is State.SUSPENDED:
        pipe.suspend("read_file", "grep")
    elif state is State.ENDED:
        pipe.complete()
    assert pipe.core.state is state
    return pipe


def apply(pipe: Pipe, event: Event) -> list[Action]:
    """Make ``event`` happen to the core the way the adapter or the sampler would."""
    core = pipe.core
    open_id = core.response_id or "resp_1"
    builder = ResponseBuilder(open_id, ResponseCreate(model=CORE_MODEL), "longlived")
    match event:
        case Event.CREATE:
            return pipe.client(type="response.create", model=CORE_MODEL, input="hi")
        case Event.OPENED:
            core.opened()
        case Event.ABORT:
            return [Reply(core.abort(ClientError("model_not_found", "refused by the pipeline")))]
        case Event.APPEND:
            pending = core.pending_calls
            # While suspended on two calls, one output is a partial append: the response stays suspended.
            return pipe.append(output(pending[0]) if pending else user_message("also this"))
        case Event.RESUME:
            pending = core.pending_calls or ["call_nobody_made"]
            return pipe.append(*(output(call_id) for call_id in pending))
        case Event.CANCEL:
            return pipe.client(type="response.cancel")
        case Event.SUSPEND:
            core.frame(builder.suspend([FunctionCall(call_id="call_9", name="grep", arguments="{}")]))
        case Event.TERMINAL:
            core.frame(builder.completed())
        case Event.CLOSE:
            core.close()
    return []


EVERY_PAIR = [(state, event) for state in State for event in Event]


@pytest.mark.parametrize(("state", "event"), EVERY_PAIR, ids=[f"{s.name}-{e.name}" for s, e in EVERY_PAIR])
def test_every_state_event_pair(state: State, event: Event) -> None:
    pipe = pipe_in(state)
    if (state, event) in TRANSITIONS:
        actions = apply(pipe, event)
        assert pipe.core.state is TRANSITIONS[(state, event)]
        assert not any(isinstance(a, Reply) for a in actions), actions
    elif event is Event.ABORT and state is State.OPENING:
        frame = apply(pipe, event)
        assert code_of(frame) == "model_not_found"
        assert pipe.core.state is State.IDLE  # it came from IDLE: see test_abort_returns_where_it_came_from
    elif event is Event.CLOSE:  # CLOSED: closing again is a no-op
        apply(pipe, event)
        assert pipe.core.state is State.CLOSED
    elif event in CLIENT_EVENTS and state is not State.CLOSED:
        assert code_of(apply(pipe, event)) == REFUSALS[(state, event)]
        assert pipe.core.state is state
    else:  # the server (our code) drove the core where the table does not go
        with pytest.raises(LocalProtocolError):
            apply(pipe, event)
        assert pipe.core.state is state


def test_the_table_refuses_every_client_event_it_does_not_allow() -> None:
    for state in State:
        for event in CLIENT_EVENTS:
            if state is not State.CLOSED and (state, event) not in TRANSITIONS:
                assert (state, event) in REFUSALS, (state, event)
            assert not ((state, event) in TRANSITIONS and (state, event) in REFUSALS)


@pytest.mark.parametrize("before", [State.IDLE, State.ENDED])
def test_abort_returns_where_it_came_from(before: State) -> None:
    pipe = pipe_in(before)
    pipe.create()
    assert state_of(pipe) is State.OPENING
    frame = pipe.core.abort(
        ClientError("previous_response_not_found", "no such response", "$.previous_response_id")
    )
    detail = codec.decode_server_event(frame)
    assert isinstance(detail, ErrorEvent) and detail.error.param == "$.previous_response_id"
    assert state_of(pipe) is before
    assert pipe.core.response_id is None
    assert code_of(pipe.append(user_message("x"))) == (
        "no_open_response" if before is State.IDLE else "response_already_completed"
    )
    pipe.open()  # and the connection serves the next create
    assert state_of(pipe) is State.STREAMING


def test_a_rollout_walks_the_table() -> None:
    pipe = Pipe()
    seen = [pipe.core.state]
    start = pipe.create(input=[user_message("fix the bug")])
    seen.append(pipe.core.state)
    pipe.core.opened()
    pipe.builder = ResponseBuilder(start.response_id, start.request, "longlived", start.work)
    pipe.server(pipe.builder.start())
    seen.append(pipe.core.state)
    [call] = pipe.suspend("read_file")
    seen.append(pipe.core.state)
    [resume] = pipe.append(output(call))
    assert isinstance(resume, Resume)
    seen.append(pipe.core.state)
    pipe.complete()
    seen.append(pipe.core.state)
    pipe.open()
    seen.append(pipe.core.state)
    pipe.core.close()
    seen.append(pipe.core.state)
    assert seen == [
        State.IDLE, State.OPENING, State.STREAMING, State.SUSPENDED, State.STREAMING, State.ENDED,
        State.STREAMING, State.CLOSED,
    ]  # fmt: skip
    assert start.items == [Message(role="user", content="fix the bug")]
    # One validation per event, one per item, on the response's own counters (the append's output too).
    assert start.work.requests_validated == 1 and start.work.items_validated == 2


# ================================================================================================ cancel


@pytest.mark.parametrize("state", [State.OPENING, State.STREAMING, State.SUSPENDED])
def test_cancel_asks_the_adapter_to_stop_then_the_terminal_event_ends(state: State) -> None:
    pipe = pipe_in(state)
    response_id = pipe.core.response_id
    assert response_id is not None
    actions = pipe.client(type="response.cancel", response_id=response_id)
    assert pipe.core.cancelling == Cancel(response_id)
    if state is State.OPENING:
        assert actions == []  # the pre-inference pipeline runs to its end, then ``opened`` says "cancelled"
        assert pipe.core.opened() is False
    else:
        assert actions == [Cancel(response_id)]
    assert pipe.client(type="response.cancel", response_id=response_id) == []  # once is enough
    # nothing ends until the terminal event
    assert pipe.core.state is (State.STREAMING if state is State.OPENING else state)
    builder = ResponseBuilder(response_id, ResponseCreate(model=CORE_MODEL), "longlived")
    ended = codec.decode_server_event(pipe.core.frame(builder.incomplete("cancelled")))
    assert ended.response.status == "cancelled"  # type: ignore[union-attr]
    assert pipe.core.state is State.ENDED
    assert code_of(pipe.client(type="response.cancel")) == "response_already_completed"
    assert (
        code_of(pipe.client(type="response.cancel", response_id=response_id)) == "response_already_completed"
    )


def test_cancel_names_the_open_response_or_is_refused() -> None:
    pipe = pipe_in(State.STREAMING)
    actions = pipe.client(type="response.cancel", response_id="resp_other")
    assert code_of(actions) == "response_not_found"
    assert error_of(actions).param == "$.response_id"
    assert pipe.core.state is State.STREAMING


@pytest.mark.parametrize("state", [State.IDLE, State.ENDED])
def test_cancel_of_a_response_never_seen_is_not_found(state: State) -> None:
    assert (
        code_of(pipe_in(state).client(type="response.cancel", response_id="resp_nope"))
        == "response_not_found"
    )


# ================================================================================================ error codes


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "{",
        '{"type": "response.cancel",}',
        "1 2",
        '[1] {"type": "response.cancel"}',
        b"\xff\xfe{}",
        "\ud800",
        "[" * 100_000 + "]" * 100_000,
        '{"type": "response.create", "model": "m", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"type": "response.append", "input": [{"type": "message", "role": "user", "content": '
        + "[" * 5000
        + "]" * 5000
        + "}]}",
    ],
    ids=[
        "text",
        "truncated",
        "trailing-comma",
        "two-values",
        "wrong-shape-then-junk",
        "invalid-utf8",
        "lone-surrogate",
        "deep-array",
        "deep-field",
        "deep-item",
    ],
)
def test_invalid_json(frame: str | bytes) -> None:
    detail = error_of(Pipe().send(frame))
    assert (detail.code, detail.type, detail.param) == ("invalid_json", "invalid_request_error", None)


# The event's own envelope is ``invalid_event``; the body a create carries, and any item, is
# ``invalid_request`` as in an HTTP body (one fault, one code on every transport).
@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ("[1, 2]", "invalid_event", None),
        ('"response.create"', "invalid_event", None),
        ("42", "invalid_event", None),
        ("null", "invalid_event", None),
        ('{"input": []}', "invalid_event", "$.type"),
        ('{"type": 7}', "invalid_event", "$.type"),
        ('{"type": "response.append"}', "invalid_event", "$.input"),
        ('{"type": "response.append", "input": "text"}', "invalid_event", "$.input"),
        ('{"type": "response.append", "input": [], "response_id": 5}', "invalid_event", "$.response_id"),
        ('{"type": "response.inject", "input": []}', "invalid_event", "$.response_id"),
        ('{"type": "response.create"}', "invalid_request", "$.model"),
        ('{"type": "response.create", "model": 3}', "invalid_request", "$.model"),
        (
            '{"type": "response.create", "model": "m", "tools": [{"type": "function"}]}',
            "invalid_request",
            "$.tools[0].name",
        ),
        (
            '{"type": "response.create", "model": "m", "tools": [{"type": "frobnicate"}]}',
            "invalid_request",
            "$.tools[0].type",
        ),
        (
            '{"type": "response.create", "model": "m", "max_output_tokens": "many"}',
            "invalid_request",
            "$.max_output_tokens",
        ),
        (
            '{"type": "response.create", "model": "m", "max_output_tokens": 1e400}',
            "invalid_request",
            "$.max_output_tokens",
        ),
        ('{"type": "response.create", "model": "m", "input": 5}', "invalid_request", "$.input"),
        (
            '{"type": "response.create", "model": "mock-1000tps", "input": [5]}',
            "invalid_request",
            "$.input[0]",
        ),
        (
            '{"type": "response.create", "model": "mock-1000tps", "input": [{"type": "message", "role": '
            '"robot", "content": "x"}]}',
            "invalid_request",
            "$.input[0].role",
        ),
        (
            '{"type": "response.create", "model": "mock-1000tps", "input": [{"content": "typeless, '
            'roleless"}]}',
            "invalid_request",
            "$.input[0].role",
        ),
        (
            '{"type": "response.append", "input": [{"type": "function_call_output", "call_id": 1, "output": '
            '"x"}]}',
            "invalid_request",
            "$.input[0].call_id",
        ),
        (
            '{"type": "response.append", "input": [{"type": "message", "role": "user", "content": "ok"}, '
            '{"type": "function_call_output", "call_id": "c"}]}',
            "invalid_request",
            "$.input[1].output",
        ),
        ('{"type": "response.append", "input": [{"type": "mystery"}]}', "invalid_request", "$.input[0].type"),
    ],
)
def test_invalid_event_names_the_failing_path(frame: str, code: str, param: str | None) -> None:
    # A create is checked in IDLE (elsewhere it is refused before its body is read), the rest mid-rollout.
    state = State.IDLE if '"response.create"' in frame else State.SUSPENDED
    pipe = pipe_in(state)
    detail = error_of(pipe.send(frame))
    assert (detail.code, detail.param) == (code, param), detail.message
    assert pipe.core.state is state


@pytest.mark.parametrize("kind", ["response.frobnicate", "session.update", "", "response.done"])
def test_unknown_event_type(kind: str) -> None:
    detail = error_of(Pipe().client(type=kind, input=[]))
    assert (detail.code, detail.param) == ("unknown_event_type", "$.type")


def test_binary_frame_not_supported_in_any_live_state() -> None:
    for state in [State.IDLE, State.OPENING, State.STREAMING, State.SUSPENDED, State.ENDED]:
        pipe = pipe_in(state)
        assert (
            code_of(pipe.core.receive_binary(b'{"type":"response.cancel"}')) == "binary_frame_not_supported"
        )
        assert pipe.core.state is state


def test_no_open_response() -> None:
    pipe = Pipe()
    assert code_of(pipe.append(user_message("hello?"))) == "no_open_response"
    assert code_of(pipe.append(output("call_1"))) == "no_open_response"
    assert code_of(pipe.client(type="response.cancel")) == "no_open_response"


@pytest.mark.parametrize("state", [State.OPENING, State.STREAMING])
def test_response_in_progress(state: State) -> None:
    pipe = pipe_in(state)
    before = pipe.core.response_id
    actions = pipe.client(type="response.create", model=CORE_MODEL, input="again")
    assert (code_of(actions), status_of(actions)) == ("response_in_progress", 409)
    assert (pipe.core.state, pipe.core.response_id) == (state, before)


def test_unknown_call_id_in_an_append() -> None:
    pipe = pipe_in(State.SUSPENDED)
    first, _ = pipe.core.pending_calls
    actions = pipe.append(output(first), output("call_made_up"))
    assert (code_of(actions), error_of(actions).param) == ("unknown_call_id", "$.input[1].call_id")


@pytest.mark.parametrize("state", [State.OPENING, State.STREAMING])
def test_an_output_nobody_waits_for_is_unknown(state: State) -> None:
    assert code_of(pipe_in(state).append(output("call_1"))) == "unknown_call_id"


def test_unknown_call_id_in_a_full_history() -> None:
    pipe = Pipe()
    actions = pipe.client(
        type="response.create", model=CORE_MODEL, input=[user_message("hi"), output("call_x")]
    )
    assert (code_of(actions), error_of(actions).param) == ("unknown_call_id", "$.input[1].call_id")
    assert pipe.core.state is State.IDLE
    call = {"type": "function_call", "call_id": "call_x", "name": "grep", "arguments": "{}"}
    [start] = pipe.client(
        type="response.create", model=CORE_MODEL, input=[user_message("hi"), call, output("call_x")]
    )
    assert isinstance(start, Start) and len(start.items) == 3
    # A continuation answers calls of the stored response: checked where that response is loaded, not here.
    pipe = Pipe()
    [start] = pipe.client(
        type="response.create", model=CORE_MODEL, previous_response_id="resp_0", input=[output("call_x")]
    )
    assert isinstance(start, Start)


def test_duplicate_call_output() -> None:
    pipe = pipe_in(State.SUSPENDED)
    first, second = pipe.core.pending_calls
    within = pipe.append(output(first), output(first))
    assert (code_of(within), error_of(within).param) == ("duplicate_call_output", "$.input[1].call_id")
    assert pipe.append(output(first)) == []
    again = pipe.append(output(first, "second answer"))
    assert (code_of(again), error_of(again).param) == ("duplicate_call_output", "$.input[0].call_id")
    [resume] = pipe.append(output(second))
    assert isinstance(resume, Resume)
    # Already answered in an earlier turn: a duplicate, not an unknown call.
    assert code_of(pipe.append(output(first))) == "duplicate_call_output"


def test_response_already_completed() -> None:
    pipe = pipe_in(State.ENDED)
    ended = pipe.core.response_id
    assert ended is None
    last = pipe.wire[-1].response.id  # type: ignore[union-attr]
    assert code_of(pipe.append(output("call_1"))) == "response_already_completed"
    assert code_of(pipe.append(user_message("more"), response_id=last)) == "response_already_completed"
    pipe.open()
    # The old response, named while a new one is open, is still "completed" and not "not found".
    actions = pipe.append(user_message("more"), response_id=last)
    assert (code_of(actions), error_of(actions).param) == ("response_already_completed", "$.response_id")
    assert pipe.core.state is State.STREAMING


def test_response_not_found() -> None:
    pipe = pipe_in(State.SUSPENDED)
    actions = pipe.append(output(pipe.core.pending_calls[0]), response_id="resp_elsewhere")
    assert (code_of(actions), status_of(actions)) == ("response_not_found", 404)
    assert len(pipe.core.pending_calls) == 2


def test_append_may_name_the_open_response() -> None:
    pipe = pipe_in(State.SUSPENDED)
    first, second = pipe.core.pending_calls
    assert pipe.append(output(first), response_id=pipe.core.response_id) == []
    assert isinstance(pipe.append(output(second), response_id=pipe.core.response_id)[0], Resume)


def test_model_not_found() -> None:
    pipe = Pipe()
    actions = pipe.client(type="response.create", model="gpt-nope")
    assert (code_of(actions), status_of(actions), error_of(actions).param) == (
        "model_not_found",
        404,
        "$.model",
    )
    assert pipe.core.state is State.IDLE


def test_too_many_items() -> None:
    pipe = Pipe(EventLimits(max_input_items=2))
    actions = pipe.client(
        type="response.create",
        model=CORE_MODEL,
        input=[user_message("a"), user_message("b"), user_message("c")],
    )
    assert (code_of(actions), error_of(actions).param) == ("too_many_items", "$.input")
    assert pipe.core.state is State.IDLE
    pipe.open(input=[user_message("a"), user_message("b")])
    [call] = pipe.suspend("grep")
    assert code_of(pipe.append(output(call), user_message("b"), user_message("c"))) == "too_many_items"
    assert pipe.core.pending_calls == [call]


def test_strings_past_openais_limits_are_refused_in_its_words() -> None:
    """A ``prompt_cache_key`` or an input ``call_id`` of 65 characters: OpenAI's code and message; 64 fits."""
    pipe = Pipe()
    actions = pipe.client(type="response.create", model=CORE_MODEL, prompt_cache_key="k" * 65)
    error = error_of(actions)
    assert (error.code, error.param) == ("string_above_max_length", "$.prompt_cache_key")
    assert error.message == (
        "Invalid '$.prompt_cache_key': string too long. Expected a string with maximum length 64, but got a "
        "string with length 65 instead."
    )
    call = {"type": "function_call", "call_id": "c" * 65, "name": "grep", "arguments": "{}"}
    actions = pipe.client(type="response.create", model=CORE_MODEL, input=[user_message("a"), call])
    assert (code_of(actions), error_of(actions).param) == ("string_above_max_length", "$.input[1].call_id")
    empty = {"type": "function_call_output", "call_id": "", "output": "x"}
    actions = pipe.client(type="response.create", model=CORE_MODEL, input=[user_message("a"), empty])
    assert error_of(actions).code == "empty_string" and error_of(actions).message == (
        "Invalid '$.input[1].call_id': empty string. Expected a string with minimum length 1, but got an "
        "empty string instead."
    )
    fits = {**call, "call_id": "c" * 64}
    answer = {"type": "function_call_output", "call_id": "c" * 64, "output": "x"}
    actions = pipe.client(
        type="response.create", model=CORE_MODEL, prompt_cache_key="k" * 64, input=[fits, answer]
    )
    assert isinstance(actions[0], Start)


def test_too_many_tools() -> None:
    tools = [{"type": "function", "name": f"t{i}"} for i in range(3)]
    pipe = Pipe(EventLimits(max_tools=2))
    actions = pipe.client(type="response.create", model=CORE_MODEL, tools=tools)
    assert (code_of(actions), error_of(actions).param) == ("too_many_tools", "$.tools")
    assert isinstance(pipe.client(type="response.create", model=CORE_MODEL, tools=tools[:2])[0], Start)


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        ({"type": "message", "role": "assistant", "content": "I said"}, "invalid_request", "$.input[0].role"),
        ({"type": "reasoning", "id": "rs_1", "summary": []}, "invalid_request", "$.input[0].type"),
        # An echo of the model's own call is accepted only for a call the response made.
        (
            {"type": "function_call", "call_id": "c", "name": "n", "arguments": "{}"},
            "unknown_call_id",
            "$.input[0].call_id",
        ),
    ],
)
def test_append_accepts_only_outputs_and_user_side_messages(
    item: dict[str, Any], code: str, param: str
) -> None:
    actions = pipe_in(State.STREAMING).append(item)
    assert (code_of(actions), error_of(actions).param) == (code, param)


# ================================================================================================ inject


def test_inject_is_acknowledged_then_acts_like_append() -> None:
    pipe = pipe_in(State.SUSPENDED)
    response_id = pipe.core.response_id
    first, second = pipe.core.pending_calls
    actions = pipe.client(
        type="response.inject", response_id=response_id, event_id="ev_1", input=[output(second)]
    )
    assert actions == [Reply(codec.encode(InjectCreated(response_id=response_id or "", event_id="ev_1")))]
    actions = pipe.client(type="response.inject", response_id=response_id, input=[output(first)])
    assert isinstance(actions[0], Reply) and isinstance(actions[1], Resume)
    assert [item.call_id for item in actions[1].items] == [first, second]  # type: ignore[union-attr]


def test_inject_while_streaming_enqueues_user_messages() -> None:
    pipe = pipe_in(State.STREAMING)
    actions = pipe.client(
        type="response.inject", response_id=pipe.core.response_id, input=[user_message("also")]
    )
    assert isinstance(codec.decode_server_event(actions[0].data), InjectCreated)  # type: ignore[union-attr]
    assert len(actions) == 1  # the core keeps the message for the next turn boundary
    assert pipe.core.take_queued() == [Message(role="user", content="also")]


@pytest.mark.parametrize(
    ("state", "target", "code"),
    [
        (State.IDLE, "resp_1", "response_not_found"),
        (State.STREAMING, "resp_other", "response_not_found"),
        (State.ENDED, "resp_1", "response_already_completed"),
        (State.ENDED, "resp_other", "response_not_found"),
        (State.SUSPENDED, "resp_1", "unknown_call_id"),  # refused by append's own checks
    ],
)
def test_inject_failed(state: State, target: str, code: str) -> None:
    pipe = pipe_in(state)
    actions = pipe.client(
        type="response.inject", response_id=target, event_id="ev_9", input=[output("call_zz")]
    )
    assert len(actions) == 1 and isinstance(actions[0], Reply)
    failed = codec.decode_server_event(actions[0].data)
    assert isinstance(failed, InjectFailed)
    assert (failed.code, failed.response_id, failed.event_id) == (code, target, "ev_9")
    assert pipe.core.state is state


# ================================================================================================ resuming


def test_parallel_outputs_over_two_appends_resume_once_in_call_order() -> None:
    pipe = pipe_in(State.STREAMING)
    calls = pipe.suspend("read_file", "grep", "run_tests")
    assert pipe.core.pending_calls == calls
    done = pipe.wire[-1]
    assert isinstance(done, ResponseDone) and done.can_append
    assert done.pending_calls == [
        PendingCall(call_id=calls[0], name="read_file"),
        PendingCall(call_id=calls[1], name="grep"),
        PendingCall(call_id=calls[2], name="run_tests"),
    ]
    assert pipe.append(output(calls[2], "third"), user_message("and hurry")) == []
    assert pipe.core.state is State.SUSPENDED
    actions = pipe.append(output(calls[0], "first"), output(calls[1], "second"))
    assert len(actions) == 1 and isinstance(actions[0], Resume)
    items = actions[0].items
    assert [(i.call_id, i.output) for i in items[:3] if isinstance(i, FunctionCallOutput)] == [
        (calls[0], "first"),
        (calls[1], "second"),
        (calls[2], "third"),
    ]
    assert items[3:] == [Message(role="user", content="and hurry")]  # user messages after the outputs
    assert state_of(pipe) is State.STREAMING and pipe.core.pending_calls == []
    assert code_of(pipe.append(output(calls[1]))) == "duplicate_call_output"  # no second resume


def test_user_messages_while_streaming_wait_for_the_next_turn() -> None:
    pipe = pipe_in(State.OPENING)
    assert pipe.append(user_message("before the first token")) == []
    assert pipe.core.opened()
    assert pipe.core.take_queued() == [Message(role="user", content="before the first token")]
    actions = pipe.append(user_message("one"), {"role": "developer", "content": "two"})
    assert actions == []
    assert pipe.core.take_queued() == [
        Message(role="user", content="one"),
        Message(role="developer", content="two"),
    ]
    assert pipe.core.take_queued() == []  # each is handed over once
    assert pipe.core.state is State.STREAMING
    empty = pipe.append()  # answered typed, nothing changes
    assert (code_of(empty), error_of(empty).param) == ("empty_array", "$.input")
    assert pipe.core.state is State.STREAMING


def test_an_empty_append_while_suspended_is_answered_typed_and_changes_nothing() -> None:
    pipe = pipe_in(State.SUSPENDED)
    pending = pipe.core.outstanding_calls
    empty = pipe.append()
    assert (code_of(empty), status_of(empty), error_of(empty).param) == ("empty_array", 400, "$.input")
    assert pipe.core.state is State.SUSPENDED and pipe.core.outstanding_calls == pending
    inject = pipe.client(type="response.inject", response_id=pipe.core.response_id, input=[])
    assert [codec.decode_server_event(a.data).code for a in inject if isinstance(a, Reply)] == ["empty_array"]


def test_a_suspension_with_user_messages_only_resumes_when_no_call_is_pending() -> None:
    pipe = pipe_in(State.STREAMING)
    [call] = pipe.suspend("grep")
    assert pipe.append(user_message("waiting")) == []
    [resume] = pipe.append(output(call))
    assert isinstance(resume, Resume)
    assert [type(item).__name__ for item in resume.items] == ["FunctionCallOutput", "Message"]


def test_sequence_numbers_increase_over_a_whole_multi_suspension_response() -> None:
    pipe = Pipe()
    first = pipe.open(input=[user_message("fix the bug")])
    pipe.say("let me look")
    [grep] = pipe.suspend("grep")
    pipe.append(output(grep, "a.py:3"))
    pipe.web_search("python off by one")
    pair = pipe.suspend("read_file", "run_tests")
    pipe.append(output(pair[1], "1 failed"))
    pipe.append(user_message("keep going"))
    pipe.append(output(pair[0], "def f(): ..."))
    pipe.say("patched and green")
    pipe.complete()
    events = pipe.stream_of(first.response_id)
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(numbers)))
    assert sum(isinstance(event, ResponseDone) for event in events) == 2
    assert isinstance(events[-1], ResponseCompleted)
    # The next response on the same connection numbers its own stream from the start.
    second = pipe.open()
    pipe.complete()
    assert [e.sequence_number for e in pipe.stream_of(second.response_id)] == [0, 1, 2]


# ================================================================================================ atomicity


def _snapshot(core: LongLivedCore) -> tuple[object, ...]:
    open_ = core._open
    inner = (
        None
        if open_ is None
        else (
            open_.id,
            dict(open_.pending),
            dict(open_.received),
            set(open_.answered),
            list(open_.extra),
            open_.work.items_validated,
        )
    )
    return core.state, inner, core._last_id


BAD_FRAMES = [
    "garbage",
    '{"type": "response.append", "input": [{"type": "function_call_output", "call_id": "CALL0", "output": '
    '"x"}, {"oops": 1}]}',
    '{"type": "response.append", "input": [{"type": "function_call_output", "call_id": "CALL0", "output": '
    '"x"}, {"type": "function_call_output", "call_id": "nope", "output": "x"}]}',
    '{"type": "response.append", "input": [{"type": "function_call_output", "call_id": "CALL0", "output": '
    '"x"}, {"type": "function_call_output", "call_id": "CALL0", "output": "x"}]}',
    '{"type": "response.append", "input": [{"type": "message", "role": "user", "content": "hi"}, {"type": '
    '"message", "role": "assistant", "content": "x"}]}',
    '{"type": "response.append", "response_id": "resp_zz", "input": [{"type": "function_call_output", '
    '"call_id": "CALL0", "output": "x"}]}',
    '{"type": "response.inject", "response_id": "RESP", "input": [{"type": "function_call_output", '
    '"call_id": "CALL0", "output": "x"}, {}]}',
    # (a valid one supersedes: test_create_supersedes_a_suspended_response)
    '{"type": "response.create", "model": "gpt-nope"}',
    '{"type": "response.cancel", "response_id": "resp_zz"}',
]


def test_create_supersedes_a_suspended_response() -> None:
    pipe = pipe_in(State.SUSPENDED)
    old = pipe.core.response_id
    cancel, follow = pipe.client(type="response.create", model=CORE_MODEL, input="anew")
    assert cancel == Cancel(old or "", "superseded") and isinstance(follow, OpenNext)
    assert pipe.core.cancelling == cancel
    again = pipe.client(type="response.create", model=CORE_MODEL, input="and again")  # one at a time
    assert code_of(again) == "response_in_progress"
    with pytest.raises(LocalProtocolError):
        pipe.core.open_next()  # not before the superseded response's terminal event
    pipe.complete()
    [start] = pipe.core.open_next()
    assert isinstance(start, Start) and start.response_id != old and pipe.core.state is State.OPENING


@pytest.mark.parametrize("frame", BAD_FRAMES)
def test_a_bad_frame_changes_nothing(frame: str) -> None:
    pipe = pipe_in(State.SUSPENDED)
    first, second = pipe.core.pending_calls
    assert pipe.append(output(second, "early")) == []
    before = _snapshot(pipe.core)
    actions = pipe.send(frame.replace("CALL0", first).replace("RESP", pipe.core.response_id or ""))
    assert len(actions) == 1 and isinstance(actions[0], Reply)
    assert _snapshot(pipe.core) == before
    [resume] = pipe.append(output(first, "late"))  # the connection carries on as if the frame never came
    assert isinstance(resume, Resume)
    # type: ignore[union-attr]
    assert [(i.call_id, i.output) for i in resume.items] == [(first, "late"), (second, "early")]


@pytest.mark.parametrize(
    "frame",
    [
        '{"type": "response.create", "model": "gpt-nope"}',
        '{"type": "response.create", "model": "mock-1000tps", "input": [{}]}',
    ],
)
def test_a_refused_create_leaves_an_ended_connection_ended(frame: str) -> None:
    pipe = pipe_in(State.ENDED)
    before = _snapshot(pipe.core)
    assert isinstance(pipe.send(frame)[0], Reply)
    assert _snapshot(pipe.core) == before


# ================================================================================================ our misuse


def _delta() -> OutputTextDelta:
    return OutputTextDelta(item_id="msg_1", output_index=0, content_index=0, delta="x")


@pytest.mark.parametrize("state", [State.IDLE, State.ENDED])
def test_framing_with_no_open_response_is_our_bug(state: State) -> None:
    with pytest.raises(LocalProtocolError, match="no open response"):
        pipe_in(state).core.frame(_delta())


@pytest.mark.parametrize("state", [State.OPENING, State.SUSPENDED, State.CLOSED])
def test_streaming_output_outside_streaming_is_our_bug(state: State) -> None:
    pipe = pipe_in(State.STREAMING if state is State.CLOSED else state)
    if state is State.CLOSED:
        pipe.core.close()
    with pytest.raises(LocalProtocolError):
        pipe.core.frame(_delta())
    assert pipe.core.state is state


@pytest.mark.parametrize("state", [State.IDLE, State.STREAMING, State.SUSPENDED, State.ENDED, State.CLOSED])
def test_abort_outside_opening_is_our_bug(state: State) -> None:
    pipe = pipe_in(state)
    with pytest.raises(LocalProtocolError, match="abort"):
        pipe.core.abort(ClientError("model_not_found", "x"))
    assert pipe.core.state is state


def test_more_pending_calls_than_the_limit_is_refused_typed_and_changes_nothing() -> None:
    pipe = Pipe(EventLimits(max_pending_calls=1))
    pipe.open()
    assert pipe.builder is not None
    calls = [FunctionCall(call_id=f"c{i}", name="grep", arguments="{}") for i in range(2)]
    with pytest.raises(ClientError) as refused:
        pipe.core.frame(pipe.builder.suspend(calls))
    assert refused.value.code == "too_many_pending_calls"
    assert pipe.core.state is State.STREAMING and pipe.core.pending_calls == []
    pipe.complete()  # the response still ends, with its one terminal event


def test_receive_after_close_is_our_bug() -> None:
    pipe = pipe_in(State.SUSPENDED)
    pipe.core.close()
    with pytest.raises(LocalProtocolError, match="after close"):
        pipe.core.receive('{"type": "response.cancel"}')


def test_client_errors_use_registered_codes_only() -> None:
    with pytest.raises(LocalProtocolError):
        ClientError("not_a_code", "x")


def test_error_frames_carry_no_sequence_number() -> None:
    pipe = pipe_in(State.STREAMING)
    for frame in BAD_FRAMES:
        for action in pipe.send(frame):
            if isinstance(action, Reply):
                assert b"sequence_number" not in action.data


def test_queued_user_messages_are_capped_typed_and_the_refused_append_keeps_nothing() -> None:
    pipe = Pipe(EventLimits(max_queued_items=2))
    pipe.open()
    assert pipe.append(user_message("one")) == []
    assert code_of(pipe.append(user_message("two"), user_message("three"))) == "too_many_queued_items"
    assert pipe.append(user_message("two")) == []  # within the cap again
    assert pipe.core.take_queued() == [
        Message(role="user", content="one"),
        Message(role="user", content="two"),
    ]
    assert pipe.append(user_message("after the turn boundary")) == []  # taking them makes room


@pytest.mark.parametrize("name", ["read.file", "grep\n", "", "t" * 65])
def test_a_function_tool_name_off_openais_pattern_is_refused(name: str) -> None:
    tool = {"type": "function", "name": name, "parameters": {}}
    actions = Pipe().client(type="response.create", model=CORE_MODEL, tools=[tool])
    assert error_of(actions).code in ("invalid_value", "empty_string", "string_above_max_length")
    assert error_of(actions).param == "$.tools[0].name"
