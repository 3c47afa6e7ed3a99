"""The unmodified ``openai`` SDK against our server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import MODEL, running
from openai import AsyncOpenAI, NotFoundError

from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server or a process

KEY = "sk-test-sdk-0001"
SCRIPT = 'Go.\n!call grep {"pattern": "def mean"}\n!call read_file {"path": "a.py"}\n!say All good.'
SDK_TOOLS = [
    {"type": "function", "name": "grep", "parameters": {"type": "object", "properties": {}}, "strict": False},
    {
        "type": "function",
        "name": "read_file",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    },
]


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running(api_key=[KEY]) as server:
        yield server


def sdk(server: ThreadedServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.http_url + "/v1", api_key=KEY, max_retries=0)


async def test_create_retrieve_delete(srv: ThreadedServer) -> None:
    async with sdk(srv) as client:
        response = await client.responses.create(model=MODEL, input="!say hello")
        assert response.status == "completed" and response.output_text == "hello"
        again = await client.responses.retrieve(response.id)
        assert again.id == response.id and again.output_text == "hello"
        deleted = await client.responses.delete(response.id)
        assert deleted is None
        with pytest.raises(NotFoundError):
            await client.responses.retrieve(response.id)


async def test_stream(srv: ThreadedServer) -> None:
    async with sdk(srv) as client:
        stream = await client.responses.create(model=MODEL, input="!say streamed words", stream=True)
        kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds


async def test_function_call_loop_with_previous_response_id(srv: ThreadedServer) -> None:
    async with sdk(srv) as client:
        # type: ignore[arg-type]
        response = await client.responses.create(model=MODEL, input=SCRIPT, tools=SDK_TOOLS)
        names = []
        while calls := [item for item in response.output if item.type == "function_call"]:
            names += [call.name for call in calls]
            outputs = [
                {"type": "function_call_output", "call_id": call.call_id, "output": "ok"} for call in calls
            ]
            response = await client.responses.create(
                model=MODEL,
                input=outputs,
                tools=SDK_TOOLS,
                previous_response_id=response.id,  # type: ignore[arg-type]
            )
    assert names == ["grep", "read_file"]
    assert response.output_text == "All good."


async def test_websocket_connect_function_call_chain(srv: ThreadedServer) -> None:
    async with sdk(srv) as client, client.responses.connect() as conn:
        # type: ignore[arg-type]
        await conn.response.create(model=MODEL, input=SCRIPT, tools=SDK_TOOLS, store=False)
        names: list[str] = []
        final = ""
        async for event in conn:
            assert event.type != "error", event
            if event.type != "response.completed":
                continue
            response = event.response
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                final = response.output_text
                break
            names += [call.name for call in calls]
            outputs = [
                {"type": "function_call_output", "call_id": call.call_id, "output": "ok"} for call in calls
            ]
            await conn.response.create(
                model=MODEL,
                input=outputs,
                tools=SDK_TOOLS,
                previous_response_id=response.id,
                store=False,  # type: ignore[arg-type]
            )
    assert names == ["grep", "read_file"]
    assert final == "All good."


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_agents_sdk_runs_two_function_tools(srv: ThreadedServer, websocket: bool) -> None:
    import agents
    from agents.models.openai_provider import OpenAIProvider

    agents.set_tracing_disabled(True)  # no trace export: nothing leaves loopback
    calls: list[str] = []

    @agents.function_tool
    def grep(pattern: str) -> str:
        calls.append("grep")
        return f"a.py:1: {pattern}"

    @agents.function_tool
    def read_file(path: str) -> str:
        calls.append("read_file")
        return f"contents of {path}"

    client = sdk(srv)
    provider = OpenAIProvider(openai_client=client, use_responses=True, use_responses_websocket=websocket)
    agent = agents.Agent(name="fixer", instructions="Be brief.", tools=[grep, read_file], model=MODEL)
    config = agents.RunConfig(model_provider=provider, tracing_disabled=True)
    try:
        result = await agents.Runner.run(agent, SCRIPT, run_config=config)
    finally:
        await provider.aclose()
        await client.close()
    assert calls == ["grep", "read_file"]
    assert result.final_output == "All good."


def _agents_provider(srv: ThreadedServer, websocket: bool) -> tuple[Any, AsyncOpenAI]:
    import agents
    from agents.models.openai_provider import OpenAIProvider

    agents.set_tracing_disabled(True)  # no trace export: nothing leaves loopback
    client = sdk(srv)
    return OpenAIProvider(openai_client=client, use_responses=True, use_responses_websocket=websocket), client


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
@pytest.mark.parametrize("script", ["How is the weather in Oslo?", '!json {"city": "Oslo", "celsius": -3}'])
async def test_agents_sdk_output_type_gets_a_schema_valid_object(
    srv: ThreadedServer, websocket: bool, script: str
) -> None:
    import agents
    import pydantic

    class Forecast(pydantic.BaseModel):
        city: str
        celsius: int
        tags: list[str]

    class Weather(pydantic.BaseModel):
        city: str
        celsius: int

    output_type: type[pydantic.BaseModel] = Weather if script.startswith("!json") else Forecast
    provider, client = _agents_provider(srv, websocket)
    agent = agents.Agent(name="forecaster", instructions="Be brief.", output_type=output_type, model=MODEL)
    try:
        result = await agents.Runner.run(agent, script, run_config=agents.RunConfig(model_provider=provider))
    finally:
        await provider.aclose()
        await client.close()
    assert isinstance(result.final_output, output_type)
    if output_type is Weather:  # a `!json` reply that validates is what the model says
        assert result.final_output == Weather(city="Oslo", celsius=-3)


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_agents_sdk_tool_choice_required_calls_its_tool(srv: ThreadedServer, websocket: bool) -> None:
    import agents

    calls: list[str] = []

    @agents.function_tool
    def lookup(city: str, days: int) -> str:
        calls.append(city)
        return f"{city}: sunny for {days} days"

    provider, client = _agents_provider(srv, websocket)
    agent = agents.Agent(
        name="forecaster",
        instructions="Be brief.",
        tools=[lookup],
        model=MODEL,
        model_settings=agents.ModelSettings(tool_choice="required"),
    )
    try:  # "hello" shares no word with the tool: only `required` makes the model call it
        result = await agents.Runner.run(agent, "hello", run_config=agents.RunConfig(model_provider=provider))
    finally:
        await provider.aclose()
        await client.close()
    assert len(calls) == 1  # the SDK resets tool_choice after the call (reset_tool_choice), then the answer
    assert result.final_output == "hello"
