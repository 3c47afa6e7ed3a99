"""pydantic-ai (``pydantic-ai-slim[openai,openai-realtime]``, pinned in pyproject's ``clients`` extra),
unmodified, against ``responses-lab serve`` on loopback: ``OpenAIResponsesModel`` over HTTP and over the
Responses WebSocket (``openai_transport='websocket'``), through its users' common path: a tool loop
continued by a second user turn (``message_history``), structured output (the default tool output and
``NativeOutput``), and a streamed run. The server's log (``response_ended``: ``mode``, ``protocol``,
``conn_id``) says which transport served each response.

pydantic-ai opens named ``stream_id`` lanes only on api.openai.com unless the model's profile says
``openai_responses_supports_websocket_stream_id``; without lanes, concurrent requests beyond the first go
over HTTP. Without the ``openai-realtime`` extra, or when the socket cannot open, it warns
(``UnsupportedSettingWarning``) and uses HTTP: pytest's ``filterwarnings = error`` makes that a failure here.
Configuration, as a user writes it: docs/clients.md."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from client_cases import TWO_TURNS, Weather
from codex import KEY, LabServer, lab_process
from helpers import MODEL
from openai import AsyncOpenAI

pytestmark = pytest.mark.process  # every test starts a server or a process


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with lab_process(tmp_path_factory.mktemp("pydantic-ai")) as server:
        yield server


@pytest.fixture
async def client(srv: LabServer) -> AsyncIterator[AsyncOpenAI]:
    """The SDK client the provider wraps, closed after the case (``OpenAIProvider(base_url=..., api_key=...)``
    would make one on a process-wide cached HTTP client that is never closed)."""
    async with AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def model(client: AsyncOpenAI, websocket: bool) -> Any:
    """The model as a user points it at another OpenAI-compatible server (docs/clients.md)."""
    from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
    from pydantic_ai.profiles.openai import OpenAIModelProfile
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIResponsesModel(
        MODEL,
        provider=OpenAIProvider(openai_client=client),
        profile=OpenAIModelProfile(openai_responses_supports_websocket_stream_id=True),
        settings=OpenAIResponsesModelSettings(openai_transport="websocket" if websocket else "http"),
    )


def agent_with_tools(client: AsyncOpenAI, websocket: bool, calls: list[str]) -> Any:
    from pydantic_ai import Agent

    agent: Any = Agent(model(client, websocket), instructions="Be brief.")

    @agent.tool_plain
    def grep(pattern: str) -> str:
        calls.append(f"grep {pattern}")
        return f"a.py:1: {pattern}"

    @agent.tool_plain
    def read_file(path: str) -> str:
        calls.append(f"read_file {path}")
        return f"contents of {path}"

    return agent


def transport(lines: list[dict[str, Any]], count: int, websocket: bool) -> None:
    """``count`` responses, all over HTTP, or all over GA WebSocket mode on one connection."""
    assert len(lines) == count, lines
    if websocket:
        assert {(line["mode"], line.get("protocol")) for line in lines} == {("ws", "ga")}, lines
        assert len({line["conn_id"] for line in lines}) == 1, lines
    else:
        assert {line["mode"] for line in lines} == {"http"}, lines


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_tool_loop_then_a_second_turn(srv: LabServer, client: AsyncOpenAI, websocket: bool) -> None:
    mark = srv.mark()
    calls: list[str] = []
    agent = agent_with_tools(client, websocket, calls)
    async with agent:  # holds the model's socket across both runs (a no-op over HTTP)
        first = await agent.run(TWO_TURNS)
        second = await agent.run("And the file?", message_history=first.all_messages())
    assert calls == ["grep def mean", "read_file a.py"]
    assert (first.output, second.output) == ("Found it.", "Read it.")
    lines = srv.ended_since(mark)
    transport(lines, 4, websocket)
    assert [line["calls"] for line in lines] == [["grep"], [], ["read_file"], []], lines


async def test_two_runs_at_once_share_the_socket_on_lanes(srv: LabServer, client: AsyncOpenAI) -> None:
    """With the profile's ``stream_id`` lanes, two concurrent runs both go over the one socket (without
    lanes the second would go over HTTP)."""
    mark = srv.mark()
    calls: list[str] = []
    agent = agent_with_tools(client, True, calls)
    async with agent:
        results = await asyncio.wait_for(asyncio.gather(agent.run(TWO_TURNS), agent.run(TWO_TURNS)), 60)
    assert [result.output for result in results] == ["Found it.", "Found it."]
    assert calls == ["grep def mean"] * 2
    transport(srv.ended_since(mark), 4, True)


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
@pytest.mark.parametrize("mode", ["tool", "native"])
async def test_structured_output(srv: LabServer, client: AsyncOpenAI, websocket: bool, mode: str) -> None:
    """The default output mode is a ``final_result`` tool the model calls; ``NativeOutput`` sends
    ``text.format`` json_schema and validates the reply."""
    from pydantic_ai import Agent, NativeOutput

    mark = srv.mark()
    if mode == "tool":
        agent: Any = Agent(model(client, websocket), output_type=Weather)
        prompt = 'Weather?\n!call final_result {"city": "Oslo", "celsius": -3}'
    else:
        agent = Agent(model(client, websocket), output_type=NativeOutput(Weather))
        prompt = 'Weather?\n!json {"city": "Oslo", "celsius": -3}'
    result = await agent.run(prompt)
    assert result.output == Weather(city="Oslo", celsius=-3)
    transport(srv.ended_since(mark), 1, websocket)


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_streamed_run(srv: LabServer, client: AsyncOpenAI, websocket: bool) -> None:
    mark = srv.mark()
    calls: list[str] = []
    agent = agent_with_tools(client, websocket, calls)
    deltas: list[str] = []
    async with agent.run_stream(
        'Look.\n!call grep {"pattern": "def median"}\n!say Streamed answer here.'
    ) as run:
        async for delta in run.stream_text(delta=True, debounce_by=None):
            deltas.append(delta)
    assert calls == ["grep def median"]
    assert len(deltas) > 1 and "".join(deltas) == "Streamed answer here."
    transport(srv.ended_since(mark), 2, websocket)
