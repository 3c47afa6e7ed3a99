"""GA WebSocket mode's lane limits in the sans-IO core (``proto/core/ga.py``; docs/protocol.md, "Lanes
(`stream_id`)"): 16 responses in flight per connection, later creates wait for a slot and take freed slots
in the order they began to wait; 32 distinct named lanes, the default lane not counted."""

from __future__ import annotations

import json

from helpers import CORE_MODEL

from proto.core.actions import Reply, Start
from proto.core.create import CreateLimits
from proto.core.ga import MAX_ACTIVE, MAX_NAMED_LANES, GaCore, Outcome


def core() -> GaCore:
    return GaCore({CORE_MODEL}, CreateLimits(), opened_at=0.0, max_age_s=3600.0)


def create(lane: str | None, text: str = "hi") -> str:
    event = {"type": "response.create", "model": CORE_MODEL, "input": text}
    return json.dumps(event if lane is None else {**event, "stream_id": lane})


def started(actions: list[object]) -> list[tuple[str | None, str]]:
    return [(a.stream_id, str(a.request.input)) for a in actions if isinstance(a, Start)]


def code(actions: list[object]) -> str:
    [reply] = actions
    assert isinstance(reply, Reply)
    return str(json.loads(reply.data)["error"]["code"])


def test_past_16_in_flight_creates_wait_and_freed_slots_go_to_the_longest_waiting() -> None:
    ga = core()
    running = [a for n in range(MAX_ACTIVE) for a in ga.receive(create(f"l{n}"), 0.0)]
    assert len(started(running)) == MAX_ACTIVE and ga.active == MAX_ACTIVE
    assert ga.receive(create("w1", "first"), 0.0) == []  # waits: no error
    assert ga.receive(create("w2", "second"), 0.0) == []
    assert ga.receive(create("l0", "l0 again"), 0.0) == []  # behind l0's own response
    assert ga.queued == 3 and ga.active == MAX_ACTIVE
    first = running[0]
    assert isinstance(first, Start)
    # l0 ends: its queued create waits behind w1 and w2, which waited first
    assert started(ga.finished(first, Outcome("completed"))) == [("w1", "first")]
    second = running[1]
    assert isinstance(second, Start)
    assert started(ga.finished(second, Outcome("completed"))) == [("w2", "second")]
    third = running[2]
    assert isinstance(third, Start)
    assert started(ga.finished(third, Outcome("completed"))) == [("l0", "l0 again")]
    assert ga.queued == 0 and ga.active == MAX_ACTIVE


def test_the_default_lane_waits_for_a_slot_but_does_not_queue() -> None:
    ga = core()
    running = [a for n in range(MAX_ACTIVE) for a in ga.receive(create(f"l{n}"), 0.0)]
    assert ga.receive(create(None, "default"), 0.0) == []
    assert code(ga.receive(create(None, "again"), 0.0)) == "response_in_progress"
    first = running[0]
    assert isinstance(first, Start)
    assert started(ga.finished(first, Outcome("completed"))) == [(None, "default")]


def test_32_distinct_named_lanes_then_websocket_stream_limit_reached() -> None:
    ga = core()
    for n in range(MAX_NAMED_LANES):
        [start] = ga.receive(create(f"lane-{n}"), 0.0)
        assert isinstance(start, Start)
        assert ga.finished(start, Outcome("completed")) == []
    assert code(ga.receive(create("lane-32"), 0.0)) == "websocket_stream_limit_reached"
    assert started(ga.receive(create(None), 0.0)) == [(None, "hi")]  # the default lane does not count
    assert started(ga.receive(create("lane-0"), 0.0)) == [("lane-0", "hi")]  # a lane in use goes on


def test_a_malformed_stream_id_is_invalid_stream_id() -> None:
    assert code(core().receive(create("has space"), 0.0)) == "invalid_stream_id"
