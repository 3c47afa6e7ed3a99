"""GA WebSocket mode as OpenAI documents it today (docs/protocol.md, "GA WebSocket mode"): ``stream_id`` lanes
(parallel
conversations on one socket, FIFO within a lane, one response in flight per lane, forks across lanes) and
the beta ``response.steer`` (accepted / pending / failed; a steered response ends ``incomplete``, reason
``steered``, and a successor starts by itself). Over raw frames, and with the openai SDK's own lane
session (``openai.lib.responses_websocket``) and its ``response.steer``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from helpers import MODEL, TOOLS, assert_error, recv, running, until
from openai import AsyncOpenAI
from openai.lib.responses_websocket import AsyncResponsesWebSocketSession, ResponsesWebSocketLimits
from websockets.asyncio.client import ClientConnection, connect

from proto.core.events import TERMINAL_TYPES
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server or a process

LONG = "!tokens 3000"  # ~0.75 s of decode at 4000 tokens/s: long enough to interleave (the text is
# padded with filler words after what the line says)
STEERABLE = (
    "!tokens 8000"  # ~2 s: a steer sent on the first delta arrives while it runs, on a busy machine too
)


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


@pytest.fixture
async def ws(srv: ThreadedServer) -> AsyncIterator[ClientConnection]:
    async with connect(srv.url, max_size=None) as conn:
        yield conn


def create(script: str, lane: str | None = None, **fields: Any) -> str:
    event = {
        "type": "response.create",
        "model": MODEL,
        "input": [{"role": "user", "content": script}],
        "tools": TOOLS,
        "store": False,
        **fields,
    }
    if lane is not None:
        event["stream_id"] = lane
    return json.dumps(event)


def text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"]
    )


async def frames_until(ws: ClientConnection, done: Any) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while not done(frames):
        frames.append(await recv(ws))
    return frames


def terminals(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] in TERMINAL_TYPES]


# ------------------------------------------------------------------------------------ lanes
async def test_two_lanes_run_in_parallel_and_echo_their_stream_id(ws: ClientConnection) -> None:
    await ws.send(create(f"{LONG} !say from a", "a"))
    await ws.send(create(f"{LONG} !say from b", "b"))
    frames = await frames_until(ws, lambda fs: len(terminals(fs)) == 2)
    assert all(f.get("stream_id") in ("a", "b") for f in frames), frames[:3]
    lanes = [f["stream_id"] for f in frames if f["type"] == "response.output_text.delta"]
    first_done = next(i for i, f in enumerate(frames) if f["type"] in TERMINAL_TYPES)
    assert {f["stream_id"] for f in frames[:first_done] if f["type"] == "response.output_text.delta"} == {
        "a",
        "b",
    }  # interleaved
    by_lane = {t["stream_id"]: t for t in terminals(frames)}
    assert text(by_lane["a"]["response"]).startswith("from a") and text(by_lane["b"]["response"]).startswith(
        "from b"
    )
    assert lanes.count("a") > 1 and lanes.count("b") > 1
    # each lane continues its own chain from the connection's cache (no store: store false)
    for lane in ("a", "b"):
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "stream_id": lane,
                    "store": False,
                    "tools": TOOLS,
                    "previous_response_id": by_lane[lane]["response"]["id"],
                    "input": [{"role": "user", "content": "and?"}],
                }
            )
        )
        follow = (await until(ws, TERMINAL_TYPES | {"error"}))[-1]
        assert follow["type"] == "response.completed" and follow["stream_id"] == lane, follow
        assert follow["response"]["lab"]["work"]["model_resolutions"] == 0  # a cache hit


async def test_a_lane_is_fifo(ws: ClientConnection) -> None:
    await ws.send(create(f"{LONG} !say first", "q"))
    await ws.send(create("!say second", "q"))
    frames = await frames_until(ws, lambda fs: len(terminals(fs)) == 2)
    created = [i for i, f in enumerate(frames) if f["type"] == "response.created"]
    ended = [i for i, f in enumerate(frames) if f["type"] in TERMINAL_TYPES]
    assert created[1] > ended[0]  # the second started after the first ended
    assert (
        text(frames[ended[0]]["response"]).startswith("first")
        and text(frames[ended[1]]["response"]) == "second"
    )


async def test_a_lane_forks_a_response_of_another(ws: ClientConnection) -> None:
    await ws.send(create('!call grep {"q": 1}\n!say answered', "main"))
    first = (await until(ws, TERMINAL_TYPES | {"error"}))[-1]["response"]
    call = first["output"][0]
    answer = [{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]
    for lane in ("fork", "main"):  # the fork copies main's rendering; main still continues from its own
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "stream_id": lane,
                    "store": False,
                    "tools": TOOLS,
                    "previous_response_id": first["id"],
                    "input": answer,
                }
            )
        )
        follow = (await until(ws, TERMINAL_TYPES | {"error"}))[-1]
        assert (follow["type"], follow["stream_id"], text(follow["response"])) == (
            "response.completed",
            lane,
            "answered",
        ), follow


async def test_the_default_lane_still_refuses_a_second_create(ws: ClientConnection) -> None:
    await ws.send(create(f"{LONG} !say one"))
    await ws.send(create("!say two"))
    frames = await frames_until(ws, lambda fs: any(f["type"] in TERMINAL_TYPES for f in fs))
    [error] = [f for f in frames if f["type"] == "error"]
    assert_error(error, "response_in_progress", None)


@pytest.mark.parametrize("lane", ["", "has space", "x" * 257])
async def test_bad_stream_id(ws: ClientConnection, lane: str) -> None:
    """The openai SDK's lane session names the code: ``invalid_stream_id``; the connection goes on."""
    await ws.send(create("!say hi", lane))
    assert_error(await recv(ws), "invalid_stream_id", "stream_id")
    await ws.send(create("!say still here"))
    assert (await until(ws, TERMINAL_TYPES | {"error"}))[-1]["type"] == "response.completed"


# ------------------------------------------------------------------------------------ the service's limits
# As the openai SDK's lane session documents them (openai/lib/responses_websocket/README.md, "Lanes, limits
# and connection lifetime"): 16 active responses per connection, more creates queue; 32 distinct named
# lanes, the default lane not counted. The busy responses are slow and short (20 tokens at 65 tokens/s,
# ~0.4 s with its prefill): long enough that every create is read before the first ends, few frames.
SLOW = {"model": "mock-65tps"}


async def test_32_named_lanes_then_websocket_stream_limit_reached(ws: ClientConnection) -> None:
    for n in range(32):
        await ws.send(create("!say ok", f"lane-{n}"))
        done = (await until(ws, TERMINAL_TYPES | {"error"}))[-1]
        assert done["type"] == "response.completed" and done["stream_id"] == f"lane-{n}", done
    await ws.send(create("!say one too many", "lane-32"))
    refused = await recv(ws)
    assert_error(refused, "websocket_stream_limit_reached", "stream_id")
    assert refused["stream_id"] == "lane-32"
    # the default lane does not count, and the 32 lanes in use stay usable (a finished lane is not given back,
    # so the 33rd distinct id is refused again)
    for lane in (None, "lane-0", "lane-31"):
        await ws.send(create("!say ok", lane))
        assert (await until(ws, TERMINAL_TYPES | {"error"}))[-1]["type"] == "response.completed"
    await ws.send(create("!say again", "lane-33"))
    assert_error(await recv(ws), "websocket_stream_limit_reached", "stream_id")


async def test_16_responses_in_flight_then_creates_wait_for_a_slot(ws: ClientConnection) -> None:
    """Seventeen creates on seventeen lanes: sixteen start at once; the seventeenth starts only when one of
    them has ended, and all seventeen complete."""
    for n in range(17):
        await ws.send(create(f"!tokens 20 !say lane {n}", f"slot-{n}", **SLOW))
    frames = await frames_until(ws, lambda fs: len(terminals(fs)) == 17)
    created = [f["stream_id"] for f in frames if f["type"] == "response.created"]
    first_done = next(i for i, f in enumerate(frames) if f["type"] in TERMINAL_TYPES)
    early = [f["stream_id"] for f in frames[:first_done] if f["type"] == "response.created"]
    assert early == [f"slot-{n}" for n in range(16)], early  # in the order sent; the 17th waits
    assert created[16] == "slot-16" and len(created) == 17
    assert all(t["type"] == "response.completed" for t in terminals(frames))
    by_lane = {t["stream_id"]: text(t["response"]) for t in terminals(frames)}
    assert by_lane["slot-16"].startswith("lane 16")


async def test_a_lane_waiting_for_a_slot_keeps_its_order(ws: ClientConnection) -> None:
    """Creates queued on a lane that waits for a slot start in the order sent, one at a time; the default
    lane waiting for a slot still refuses a second create."""
    for n in range(16):
        await ws.send(create(f"!tokens 20 !say busy {n}", f"busy-{n}", **SLOW))
    await ws.send(create("!say w1", "w"))
    await ws.send(create("!say w2", "w"))
    await ws.send(create("!say d1"))
    await ws.send(create("!say d2"))
    frames = await frames_until(ws, lambda fs: len(terminals(fs)) == 19)
    [error] = [f for f in frames if f["type"] == "error"]
    assert_error(error, "response_in_progress", None)  # d2: the default lane does not queue
    first_done = next(i for i, f in enumerate(frames) if f["type"] in TERMINAL_TYPES)
    assert sum(f["type"] == "response.created" for f in frames[:first_done]) == 16
    waited = [text(t["response"]) for t in terminals(frames) if t.get("stream_id") in ("w", None)]
    assert waited.index("w1") < waited.index("w2") and "d1" in waited


# ------------------------------------------------------------------------------------ steering
def steer(response_id: str, content: Any = "Also mention the tests.") -> str:
    return json.dumps({"type": "response.steer", "previous_response_id": response_id, "input": content})


async def started(ws: ClientConnection) -> str:
    created = (await until(ws, {"response.created"}))[-1]
    await until(ws, {"response.output_text.delta"})
    return str(created["response"]["id"])


async def test_steer_ends_the_response_steered_and_a_successor_continues(ws: ClientConnection) -> None:
    # the hosted call runs only because the request offers web_search (docs/protocol.md, "The directive
    # script")
    await ws.send(
        create(
            f'{STEERABLE} !call web_search {{"query": "python"}}\n!say A\n!say B',
            "s",
            tools=[*TOOLS, {"type": "web_search"}],
        )
    )
    first_id = await started(ws)
    await ws.send(steer(first_id))
    frames = await frames_until(ws, lambda fs: len(terminals(fs)) == 2)
    accepted = next(f for f in frames if f["type"] == "response.steer.accepted")
    assert accepted["steer"]["previous_response_id"] == first_id and accepted["stream_id"] == "s"
    first, successor = terminals(frames)
    assert (first["type"], first["response"]["incomplete_details"]["reason"]) == (
        "response.incomplete",
        "steered",
    )
    # the successor's response.created is the commit point: after the steered terminal, on the same lane
    created = [f for f in frames if f["type"] == "response.created"]
    assert created[-1]["response"]["previous_response_id"] == first_id and created[-1]["stream_id"] == "s"
    assert successor["type"] == "response.completed" and text(successor["response"]) == "A"
    assert accepted["sequence_number"] > 0  # numbered within the steered response's stream


async def test_steer_on_a_final_answer_starts_a_successor_after_it(ws: ClientConnection) -> None:
    await ws.send(create(f"{STEERABLE} !say done\n!say noted", "f"))
    first_id = await started(ws)
    await ws.send(steer(first_id))
    frames = await frames_until(ws, lambda fs: len(terminals(fs)) == 2)
    first, successor = terminals(frames)
    assert first["type"] == "response.completed" and text(first["response"]).startswith("done")
    assert (
        successor["response"]["previous_response_id"] == first_id and text(successor["response"]) == "noted"
    )


async def test_steer_waits_for_required_tool_outputs(srv: ThreadedServer, ws: ClientConnection) -> None:
    await ws.send(create(f'{STEERABLE} !call grep {{"q": 1}}\n!say done', "t", store=True))
    first_id = await started(ws)
    await ws.send(steer(first_id, [{"role": "user", "content": "Use the fast path."}]))
    frames = await frames_until(ws, lambda fs: any(f["type"] == "response.steer.pending" for f in fs))
    first = terminals(frames)[0]["response"]
    pending = frames[-1]
    call = first["output"][-1]
    assert pending["required_input"] == [
        {"type": "function_call_output", "call_id": call["call_id"], "name": "grep"}
    ]
    assert pending["reason"] == "waiting_for_required_input" and pending["stream_id"] == "t"
    await ws.send(
        json.dumps(
            {
                "type": "response.create",
                "model": MODEL,
                "stream_id": "t",
                "tools": TOOLS,
                "store": True,
                "previous_response_id": first_id,
                "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}],
            }
        )
    )
    follow = (await until(ws, TERMINAL_TYPES | {"error"}))[-1]
    assert follow["type"] == "response.completed" and text(follow["response"]) == "done"
    import httpx  # the steering input went first in the continuation's input

    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        listed = (
            await http.get(f"/v1/responses/{follow['response']['id']}/input_items", params={"order": "asc"})
        ).json()["data"]
    assert [item["type"] for item in listed] == ["message", "function_call_output"]
    assert listed[0]["content"] == [{"type": "input_text", "text": "Use the fast path."}]


@pytest.mark.parametrize("case", ["unknown", "completed", "not_user"])
async def test_steer_failures_return_the_input(ws: ClientConnection, case: str) -> None:
    content: Any = "more"
    if case == "unknown":
        target = "resp_nobody"
    else:
        await ws.send(create(f"{STEERABLE} !say x" if case == "not_user" else "!say x", "e"))
        if case == "completed":
            target = (await until(ws, TERMINAL_TYPES))[-1]["response"]["id"]
        else:
            target = await started(ws)
            content = [{"role": "assistant", "content": "I say"}]
    await ws.send(steer(target, content))
    failed = (await until(ws, {"response.steer.failed"}))[-1]
    code = {
        "unknown": "response_not_found",
        "completed": "response_already_completed",
        "not_user": "invalid_input",
    }[case]
    assert failed["error"]["code"] == code and failed["error"]["type"] == "invalid_request_error"
    assert failed["steer"]["input"] == content and failed["steer"]["previous_response_id"] == target
    if case == "not_user":  # the response was not disturbed
        terminal = (await until(ws, TERMINAL_TYPES))[-1]
        assert terminal["type"] == "response.completed"


# ------------------------------------------------------------------------------------ the openai SDK's lanes
# Serial: the steer must land while the right lane's tokens run. Beside another worker on 2 busy cores it
# once did not, and the successor's response.created never came (a 30 s TimeoutError at the recv below).
@pytest.mark.serial
async def test_openai_sdk_lane_session_and_steer(srv: ThreadedServer) -> None:
    """The SDK's own router (one reader, events routed by stream_id) over two lanes, and its steer call."""
    client = AsyncOpenAI(base_url=srv.http_url + "/v1", api_key="unused", max_retries=0)
    limits = ResponsesWebSocketLimits(
        max_lanes=4,
        max_events_per_lane=100_000,
        max_events=200_000,
        max_bytes_per_lane=2**26,
        max_bytes=2**27,
    )
    async with (
        client,
        client.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=limits) as session,
    ):
        left, right = session.lane("left"), session.lane("right")
        body = {"type": "response.create", "model": MODEL, "store": False}
        await left.send({**body, "input": f"{LONG} !say left side"})
        # the right lane on the 65 tokens/s model: ~3 s of decode in 200 events, so the steer lands while it
        # runs however slowly the SDK's reader parses the left lane's 3000 deltas (openai 3.63 parses them
        # slower than 3.57 did: at 8000 tokens/s-paced events the steer arrived after the response ended)
        await right.send(
            {**body, "model": "mock-65tps", "input": "!tokens 200 !say right side\n!say steered here"}
        )
        first = await right.recv()
        while first.type != "response.created":
            first = await right.recv()
        await conn.response.steer(previous_response_id=first.response.id, input="one more thing")
        results = await asyncio.wait_for(
            asyncio.gather(left.get_final_response(), right.get_final_response()), 60
        )
        assert results[0].output_text.startswith("left side") and results[1].output_text.startswith(
            "right side"
        )
        event = await asyncio.wait_for(right.recv(), 30)
        while event.type != "response.created":  # the steered successor starts by itself, on the same lane
            assert event.type != "response.steer.failed", event
            event = await asyncio.wait_for(right.recv(), 30)
        successor = await asyncio.wait_for(right.get_final_response(), 30)
        assert successor.previous_response_id == first.response.id and successor.output_text == "steered here"
