"""Property tests of the long-lived core: random client frames interleaved with random server steps.

The machine plays the WebSocket adapter and the sampler as they are meant to behave (a ``Cancel`` is
answered by a terminal event, a cancel during pre-inference by one right after ``opened``), and feeds the
core client frames valid and invalid: structured events about the calls it really waits on, events with
wrong fields, random JSON, garbage text and bytes. Whatever comes, ``receive`` must not raise, and:

* every framed response's ``sequence_number``s strictly increase;
* at most one response is open, and the core's idea of "open" matches its state;
* every response that sent ``response.created`` ends in exactly one terminal event, unless the connection
  closed first.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from helpers import CORE_MODEL, user_message
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from proto.core import codec
from proto.core.builder import ResponseBuilder
from proto.core.errors import ClientError
from proto.core.events import (
    ErrorEvent,
    InjectCreated,
    InjectFailed,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ServerEvent,
)
from proto.core.items import FunctionCall
from proto.core.longlived import Cancel, EventLimits, LongLivedCore, OpenNext, Reply, Resume, Start
from proto.core.state import State

OPEN_STATES = {State.OPENING, State.STREAMING, State.SUSPENDED}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
event_types = st.sampled_from(
    ["response.create", "response.append", "response.inject", "response.cancel", "response.bogus"]
)
fields = st.sampled_from(["input", "model", "response_id", "tools", "x"])
bad_frames = st.one_of(
    st.text(max_size=30),  # garbage text
    st.binary(max_size=30),  # garbage bytes, invalid UTF-8 among them
    json_values.map(json.dumps),  # JSON, mostly not an event
    st.builds(
        lambda kind, junk: json.dumps({"type": kind, **junk}),
        event_types,
        st.dictionaries(fields, json_values, max_size=3),
    ),
)


def live(machine: CoreMachine) -> bool:
    # A closed connection takes no more frames (feeding one is our misuse, tested in test_core_longlived).
    return machine.core.state is not State.CLOSED


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = LongLivedCore(
            {CORE_MODEL}, EventLimits(max_input_items=4, max_tools=2, max_pending_calls=3)
        )
        self.call_ids = (f"call_{n}" for n in itertools.count())
        self.builder: ResponseBuilder | None = None
        self.start: Start | None = None  # a create the pre-inference pipeline is working on
        self.answered: list[str] = []
        self.last_id: str | None = None
        self.sequences: dict[str, list[int]] = {}
        self.created: set[str] = set()
        self.terminals: dict[str, int] = {}

    # ------------------------------------------------------------------------------------ the adapter
    def feed(self, data: str | bytes) -> None:
        for action in self.core.receive(data):  # must never raise: that is the property
            match action:
                case Reply(reply):
                    event = codec.decode_server_event(reply)
                    assert isinstance(event, ErrorEvent | InjectCreated | InjectFailed), event
                    assert b"sequence_number" not in reply
                case Start():
                    assert self.start is None and self.builder is None, "a second response opened"
                    self.start = action
                case Cancel(response_id, reason):
                    # During pre-inference the core keeps the cancel itself (``opened`` reports it).
                    assert response_id == self.core.response_id and self.builder is not None
                    self.end(reason)  # "cancelled", or "superseded" by a create while suspended
                case OpenNext():
                    [start] = self.core.open_next()
                    assert isinstance(start, Start) and self.start is None and self.builder is None
                    self.start = start
                case Resume(items):
                    assert self.core.state is State.STREAMING
                    assert items, "a resume carries the outputs"

    def emit(self, events: list[ServerEvent]) -> None:
        for event in events:
            framed = codec.decode_server_event(self.core.frame(event))
            assert isinstance(framed, ServerEvent)
            assert self.builder is not None
            response_id = self.builder.response.id
            numbers = self.sequences.setdefault(response_id, [])
            assert not numbers or framed.sequence_number > numbers[-1]
            numbers.append(framed.sequence_number)
            if isinstance(framed, ResponseCreated):
                self.created.add(response_id)
            if isinstance(framed, ResponseCompleted | ResponseIncomplete | ResponseFailed):
                self.terminals[response_id] = self.terminals.get(response_id, 0) + 1

    def end(self, reason: str) -> None:
        builder = self.builder
        assert builder is not None
        if reason == "completed":
            self.emit([builder.completed()])
        elif reason == "failed":
            self.emit([builder.failed("engine_failure", "injected")])
        else:
            self.emit([builder.incomplete(reason)])
        self.last_id, self.builder = builder.response.id, None
        assert self.core.state is State.ENDED

    # ------------------------------------------------------------------------------------ client frames
    # Few rules, each a random choice inside: hypothesis' swarm testing switches whole rules off per run,
    # and a run without "suspend" or "resume" would only exercise the refusals.
    @precondition(live)
    @rule(kind=st.sampled_from(["append", "inject", "cancel", "create", "bad", "binary"]), data=st.data())
    def client_frame(self, kind: str, data: st.DataObject) -> None:
        response_id = data.draw(st.sampled_from([self.core.response_id, self.last_id, "resp_unknown", None]))
        event: dict[str, Any]
        match kind:
            case "append" | "inject" | "cancel":
                event = {"type": f"response.{kind}"}
                if kind != "cancel":
                    event["input"] = self.some_items(data)
                if response_id is not None or kind == "inject":
                    event["response_id"] = response_id or "resp_unknown"
            case "create":
                body: Any = data.draw(st.one_of(st.text(max_size=8), st.just(None)))
                tools = data.draw(st.integers(0, 3))
                event = {
                    "type": "response.create",
                    "model": data.draw(st.sampled_from([CORE_MODEL, CORE_MODEL, "gpt-nope"])),
                    "input": self.some_items(data) if body is None else body,
                    "tools": [{"type": "function", "name": f"t{i}"} for i in range(tools)],
                }
            case "bad":
                self.feed(data.draw(bad_frames))
                return
            case _:
                [reply] = self.core.receive_binary(data.draw(st.binary(max_size=30)))
                assert isinstance(reply, Reply)
                return
        self.feed(json.dumps(event))

    def some_items(self, data: st.DataObject) -> list[Any]:
        known = [*self.core.pending_calls, *self.answered[-3:], "call_nobody_made"]
        item = st.one_of(
            st.sampled_from(known).map(
                lambda call_id: {"type": "function_call_output", "call_id": call_id, "output": "ok"}
            ),
            st.text(max_size=6).map(user_message),
            st.just({"type": "message", "role": "assistant", "content": "mine"}),
            st.just({"type": "function_call_output", "output": "no call_id"}),
            json_values,
        )
        return data.draw(st.lists(item, max_size=5))

    @precondition(lambda self: live(self) and self.core.state in {State.IDLE, State.ENDED})
    @rule(text=st.text(max_size=8))
    def open_response(self, text: str) -> None:
        # A valid create where one can open, so that most runs get to stream, suspend and resume.
        self.feed(json.dumps({"type": "response.create", "model": CORE_MODEL, "input": [user_message(text)]}))
        assert self.start is not None

    @precondition(lambda self: live(self) and self.core.state is State.SUSPENDED)
    @rule(data=st.data())
    def answer_every_pending_call(self, data: st.DataObject) -> None:
        # The common case: outputs in a random order, maybe split over two appends, maybe with a message.
        pending = data.draw(st.permutations(self.core.outstanding_calls))
        cut = data.draw(st.integers(0, len(pending)))
        outputs = [
            {"type": "function_call_output", "call_id": call_id, "output": "ok"} for call_id in pending
        ]
        first, second = outputs[:cut], outputs[cut:]
        if data.draw(st.booleans()):
            first.append(user_message("also"))
        self.feed(json.dumps({"type": "response.append", "input": first}))
        self.feed(json.dumps({"type": "response.append", "input": second}))
        assert self.core.state is State.STREAMING

    # ------------------------------------------------------------------------------------ server steps
    @precondition(lambda self: live(self) and self.start is not None)
    @rule(accept=st.sampled_from([True, True, True, False]))
    def pre_inference_done(self, accept: bool) -> None:
        start, self.start = self.start, None
        assert start is not None and self.core.state is State.OPENING
        if not accept:
            self.core.abort(ClientError("previous_response_not_found", "refused"))
            assert self.core.state in {State.IDLE, State.ENDED}
            return
        cancelled = not self.core.opened()
        self.builder = ResponseBuilder(start.response_id, start.request, "longlived", start.work)
        self.emit(self.builder.start())
        if cancelled:
            self.end("cancelled")

    @precondition(lambda self: live(self) and self.builder is not None)
    @rule(step=st.sampled_from(["say", "say", "suspend", "suspend", "suspend", "end"]), data=st.data())
    def sampler_step(self, step: str, data: st.DataObject) -> None:
        builder = self.builder
        assert builder is not None
        if step == "end" or self.core.state is State.SUSPENDED:
            # A suspended response ends only by cancel or tool timeout; a sampling one in any way.
            reasons = (
                ["completed", "failed", "max_output_tokens"]
                if self.core.state is State.STREAMING
                else ["tool_timeout"]
            )
            if step == "end" or data.draw(st.booleans()):
                self.end(data.draw(st.sampled_from(reasons)))
            return
        if step == "say":
            stream = builder.message()
            self.emit([*stream.added(), stream.delta(data.draw(st.text(max_size=10))), *stream.done()])
            return
        calls: list[FunctionCall] = []
        for _ in range(data.draw(st.integers(1, 3))):
            call = builder.function_call("grep", next(self.call_ids))
            self.emit([*call.added(), call.delta("{}"), *call.done()])
            calls.append(call.item)
        self.answered.extend(call.call_id for call in calls)
        self.emit([builder.suspend(calls)])
        assert self.core.pending_calls, "response.done suspended the response"
        assert self.core.pending_calls == [call.call_id for call in calls]

    @precondition(live)
    @rule(now=st.integers(0, 15))
    def close(self, now: int) -> None:
        # Rarely: every step after a close is a no-op, and the run is 40 steps long.
        if now == 0:
            self.core.close()

    @precondition(lambda self: not live(self))
    @rule()
    def close_again(self) -> None:
        self.core.close()
        assert self.core.state is State.CLOSED

    # ------------------------------------------------------------------------------------ invariants
    @invariant()
    def at_most_one_open_response(self) -> None:
        state = self.core.state
        if state is State.CLOSED:
            return  # what was open when the connection went is the adapter's to clean up
        assert (self.core.response_id is not None) == (state in OPEN_STATES)
        assert (self.builder is not None) == (state in {State.STREAMING, State.SUSPENDED})
        assert (self.start is not None) == (state is State.OPENING)
        assert bool(self.core.pending_calls) == (state is State.SUSPENDED)

    @invariant()
    def one_terminal_per_created_response(self) -> None:
        assert all(count == 1 for count in self.terminals.values())
        still_open = self.created - set(self.terminals)
        assert len(still_open) <= 1
        if not live(self):
            return
        assert still_open == ({self.builder.response.id} if self.builder is not None else set())

    def teardown(self) -> None:
        # Unless the connection closed, the open response can still end, exactly once.
        if self.core.state is State.CLOSED:
            return
        if self.start is not None:
            self.pre_inference_done(accept=True)
        if self.builder is not None:
            self.end("completed")
        assert set(self.terminals) == self.created
        assert all(count == 1 for count in self.terminals.values())


CoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCoreProperties = CoreMachine.TestCase
TestCoreProperties.pytestmark = [pytest.mark.slow]  # type: ignore[attr-defined]
