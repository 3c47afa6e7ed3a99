"""The openai SDK's own WebSocket clients, unmodified, against ``responses-lab serve`` on loopback, each
through its users' common path: a tool loop, a structured output, streaming, and a multi-turn run on the
same socket. The server runs as a process and its log (one ``response_ended`` line per response, with
``mode``, ``protocol`` and ``conn_id``) says which transport served each response.

- openai-agents 0.24's WebSocket model: ``OpenAIProvider(..., use_responses_websocket=True)``.
- openai 3.x's managed session over ``client.responses.connect()``: ``AsyncResponsesWebSocketSession``
  with named lanes (two tool loops at once on one socket, each continued with ``previous_response_id``).

Configuration, as a user writes it: docs/clients.md."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from client_cases import TWO_TURNS, Weather
from codex import KEY, LabServer, lab_process
from helpers import MODEL
from openai import AsyncOpenAI
from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketLane,
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketAccumulator,
    ResponsesWebSocketLimits,
)

pytestmark = pytest.mark.process  # every test starts a server or a process

# Two user turns, each a tool call and an answer (one script line per model turn, over the whole chain).
WEATHER = {"city": "Oslo", "celsius": -3}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with lab_process(tmp_path_factory.mktemp("openai-ws")) as server:
        yield server


def sdk(server: LabServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def on_one_socket(lines: list[dict[str, Any]], count: int) -> None:
    """``count`` responses, every one served over GA WebSocket mode, all on one connection."""
    assert len(lines) == count, lines
    assert {(line["mode"], line.get("protocol")) for line in lines} == {("ws", "ga")}, lines
    assert len({line["conn_id"] for line in lines}) == 1, lines


# ------------------------------------------------------------------------------------ openai-agents
def agent_tools(calls: list[str]) -> list[Any]:
    import agents

    @agents.function_tool
    def grep(pattern: str) -> str:
        calls.append(f"grep {pattern}")
        return f"a.py:1: {pattern}"

    @agents.function_tool
    def read_file(path: str) -> str:
        calls.append(f"read_file {path}")
        return f"contents of {path}"

    return [grep, read_file]


def provider(server: LabServer) -> tuple[Any, AsyncOpenAI]:
    import agents
    from agents.models.openai_provider import OpenAIProvider

    agents.set_tracing_disabled(True)  # no trace export: nothing leaves loopback
    client = sdk(server)
    return OpenAIProvider(openai_client=client, use_responses=True, use_responses_websocket=True), client


async def test_agents_tool_loop_then_a_second_turn_on_one_socket(srv: LabServer) -> None:
    import agents

    mark = srv.mark()
    calls: list[str] = []
    model_provider, client = provider(srv)
    agent = agents.Agent(name="finder", instructions="Be brief.", tools=agent_tools(calls), model=MODEL)
    config = agents.RunConfig(model_provider=model_provider)
    try:
        first = await agents.Runner.run(agent, TWO_TURNS, run_config=config)
        second = await agents.Runner.run(
            agent, "And the file?", run_config=config, previous_response_id=first.last_response_id
        )
    finally:
        await model_provider.aclose()
        await client.close()
    assert calls == ["grep def mean", "read_file a.py"]
    assert (first.final_output, second.final_output) == ("Found it.", "Read it.")
    lines = srv.ended_since(mark)
    on_one_socket(lines, 4)  # the provider keeps its socket across runs
    assert [line["calls"] for line in lines] == [["grep"], [], ["read_file"], []], lines


async def test_agents_streamed_run(srv: LabServer) -> None:
    import agents

    mark = srv.mark()
    calls: list[str] = []
    model_provider, client = provider(srv)
    agent = agents.Agent(name="finder", instructions="Be brief.", tools=agent_tools(calls), model=MODEL)
    deltas: list[str] = []
    try:
        result = agents.Runner.run_streamed(
            agent,
            'Look.\n!call grep {"pattern": "def median"}\n!say Streamed answer here.',
            run_config=agents.RunConfig(model_provider=model_provider),
        )
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                deltas.append(event.data.delta)
    finally:
        await model_provider.aclose()
        await client.close()
    assert calls == ["grep def median"]
    assert len(deltas) > 1 and "".join(deltas) == result.final_output == "Streamed answer here."
    on_one_socket(srv.ended_since(mark), 2)


async def test_agents_output_type(srv: LabServer) -> None:
    import agents

    mark = srv.mark()
    model_provider, client = provider(srv)
    agent = agents.Agent(name="forecaster", instructions="Be brief.", output_type=Weather, model=MODEL)
    try:
        result = await agents.Runner.run(
            agent,
            f"Weather?\n!json {json.dumps(WEATHER)}",
            run_config=agents.RunConfig(model_provider=model_provider),
        )
    finally:
        await model_provider.aclose()
        await client.close()
    assert result.final_output == Weather(**WEATHER)
    on_one_socket(srv.ended_since(mark), 1)


# ------------------------------------------------------------------------------------ the SDK's lane session
LIMITS = ResponsesWebSocketLimits(
    max_lanes=4, max_events_per_lane=100_000, max_events=200_000, max_bytes_per_lane=2**26, max_bytes=2**27
)
FUNCTIONS = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}, "strict": False}
    for name in ("grep", "read_file")
]


async def lane_rollout(
    lane: AsyncResponsesWebSocketLane, name: str, script: str, ran: list[str]
) -> list[str]:
    """A tool loop on one lane, then a second user turn continuing it (``previous_response_id``); the
    answer of each user turn. The text of every response is rebuilt from its streamed deltas
    (``ResponsesWebSocketAccumulator``) and must equal the terminal response's."""
    answers: list[str] = []
    accumulator = ResponsesWebSocketAccumulator()
    body: dict[str, Any] = {"type": "response.create", "model": MODEL, "tools": FUNCTIONS, "store": False}
    await lane.send({**body, "input": script})
    for follow_up in ("And the file?", None):
        while True:
            accumulator.reset()
            while True:
                event = await lane.recv()
                assert event.type != "error", event
                accumulator.add_event(event)
                if event.type in ("response.completed", "response.failed", "response.incomplete"):
                    break
            response = accumulator.get_final_response()
            assert response.status == "completed", response
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                break
            ran += [f"{name}:{call.name}" for call in calls]
            outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls]
            await lane.send({**body, "input": outputs, "previous_response_id": response.id})
        answers.append(response.output_text)
        if follow_up is not None:
            await lane.send({**body, "input": follow_up, "previous_response_id": response.id})
    return answers


async def test_sdk_session_two_lanes_run_tool_loops_at_once(srv: LabServer) -> None:
    mark = srv.mark()
    ran: list[str] = []
    client = sdk(srv)
    async with (
        client,
        client.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session,
    ):
        left, right = session.lane("left"), session.lane("right")
        answers = await asyncio.wait_for(
            asyncio.gather(
                lane_rollout(left, "left", TWO_TURNS, ran), lane_rollout(right, "right", TWO_TURNS, ran)
            ),
            60,
        )
    assert answers == [["Found it.", "Read it."]] * 2
    assert sorted(ran) == sorted(
        ["left:grep", "left:read_file", "right:grep", "right:read_file"]
    ) and ran.index("left:grep") < ran.index("left:read_file")
    on_one_socket(srv.ended_since(mark), 8)  # two lanes × (call, answer, call, answer)


async def test_sdk_session_structured_output(srv: LabServer) -> None:
    mark = srv.mark()
    client = sdk(srv)
    text_format = {
        "format": {
            "type": "json_schema",
            "name": "weather",
            "strict": True,
            "schema": {**Weather.model_json_schema(), "additionalProperties": False},
        }
    }
    async with (
        client,
        client.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session,
    ):
        lane = session.lane("weather")
        await lane.send(
            {
                "type": "response.create",
                "model": MODEL,
                "input": f"Weather?\n!json {json.dumps(WEATHER)}",
                "text": text_format,
                "store": False,
            }
        )
        response = await asyncio.wait_for(lane.get_final_response(), 30)
    assert Weather.model_validate_json(response.output_text) == Weather(**WEATHER)
    on_one_socket(srv.ended_since(mark), 1)
