"""The guarantees (docs/protocol.md, "Guarantees") over a real server, on HTTP, GA WebSocket mode and
the long-lived protocol: whatever the script says, the output keeps what the request promises."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from helpers import GUARD, MODEL, TERMINAL_OR_ERROR, ga_events, outputs, running
from websockets.asyncio.client import connect

from proto.client import messages
from proto.client.longlived import LongLivedClient
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server

GREP_SCHEMA = {
    "type": "object",
    "properties": {"pattern": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["pattern", "limit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "name": "grep", "parameters": GREP_SCHEMA, "strict": True},
    {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}},
]
ANSWER = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["pass", "fail"]},
        "lines": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    },
    "required": ["verdict", "lines"],
    "additionalProperties": False,
}
TRANSPORTS = ["http", "ga", "longlived"]


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


async def rollout(
    srv: ThreadedServer, transport: str, script: str, follow: dict[str, Any] | None = None, **fields: Any
) -> list[dict[str, Any]]:
    """The whole rollout, every call answered ``ok``: the responses (one for long-lived). HTTP and GA
    continue with ``follow`` over ``fields`` (an agent resetting ``tool_choice`` after a call)."""
    base = messages.body(MODEL, [messages.user_message(script)], tools=TOOLS, **fields)
    if transport == "longlived":
        async with LongLivedClient(srv.url) as client:
            await client.send(messages.create(base))
            while True:
                event = await client.recv(GUARD)
                if event.type == "response.done":
                    await client.send(messages.append(outputs(event.data["pending_calls"])))
                elif event.type in TERMINAL_OR_ERROR:
                    assert event.type == "response.completed", event.data
                    return [event.data["response"]]
    responses: list[dict[str, Any]] = []
    body = base
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http, connect(srv.url) as ws:
        for _ in range(8):
            if transport == "http":
                reply = await http.post("/v1/responses", json=body)
                assert reply.status_code == 200, reply.text
                response = reply.json()
            else:
                events = await ga_events(ws, body)
                assert events[-1]["type"] == "response.completed", events[-1]
                response = events[-1]["response"]
            responses.append(response)
            calls = calls_of(response)
            if not calls:
                return responses
            body = messages.continuation({**base, **(follow or {})}, outputs(calls), response["id"])
    raise AssertionError("the rollout did not end")


def calls_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


def last_text(responses: list[dict[str, Any]]) -> str:
    message = [item for item in responses[-1]["output"] if item["type"] == "message"][-1]
    return "".join(part["text"] for part in message["content"])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_none_never_calls(srv: ThreadedServer, transport: str) -> None:
    responses = await rollout(srv, transport, '!call grep {"pattern": "x"}\n!say ok', tool_choice="none")
    assert len(responses) == 1 and not calls_of(responses[0])
    assert last_text(responses) == '(not calling grep: tool_choice is "none")'


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_required_calls_with_schema_valid_arguments(srv: ThreadedServer, transport: str) -> None:
    # max_tool_calls bounds the long-lived response, where `required` holds for every segment.
    responses = await rollout(
        srv, transport, "hello", follow={"tool_choice": "auto"}, tool_choice="required", max_tool_calls=1
    )
    calls = calls_of(responses[0])
    assert [call["name"] for call in calls] == ["grep"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), GREP_SCHEMA)
    assert len([c for r in responses for c in calls_of(r)]) == 1  # HTTP and GA: tool_choice reset after it
    assert responses[-1]["output"][-1]["type"] == "message" and responses[-1]["status"] == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_forced_function(srv: ThreadedServer, transport: str) -> None:
    responses = await rollout(
        srv,
        transport,
        '!call grep {"pattern": "x", "limit": 2}\n!say done',
        follow={"tool_choice": "auto"},
        tool_choice={"type": "function", "name": "read_file"},
        max_tool_calls=1,
    )
    assert [call["name"] for call in calls_of(responses[0])] == ["read_file"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_allowed_tools(srv: ThreadedServer, transport: str) -> None:
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "read_file"}]}
    script = '!call grep {"pattern": "x"} | !call read_file {}\n!say done'
    responses = await rollout(srv, transport, script, tool_choice=choice)
    assert [call["name"] for r in responses for call in calls_of(r)] == ["read_file"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_max_tool_calls(srv: ThreadedServer, transport: str) -> None:
    script = "!call grep {} | !call read_file {}\n!call read_file {}\n!say done"
    responses = await rollout(srv, transport, script, max_tool_calls=1)
    assert all(len(calls_of(r)) <= 1 for r in responses)
    assert [call["name"] for call in calls_of(responses[0])] == ["grep"]
    if transport == "longlived":  # one response: the cap holds over its whole life
        assert last_text(responses) == "(not calling read_file: max_tool_calls reached)"
    else:  # a response per request: each has its own cap
        assert [len(calls_of(r)) for r in responses] == [1, 1, 0] and last_text(responses) == "done"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_parallel_false(srv: ThreadedServer, transport: str) -> None:
    script = "!call grep {} | !call read_file {}\n!say done"
    responses = await rollout(srv, transport, script, parallel_tool_calls=False)
    names = [[call["name"] for call in calls_of(r)] for r in responses]
    if transport == "longlived":
        assert [item["name"] for item in responses[0]["output"] if item["type"] == "function_call"] == [
            "grep",
            "read_file",
        ]
    else:
        assert names == [["grep"], ["read_file"], []]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "script", ["Is it fixed?", "!say prose", '!json {"verdict": "maybe"}', "!call grep {}\n!say prose"]
)
async def test_json_schema_validates(srv: ThreadedServer, transport: str, script: str) -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    responses = await rollout(srv, transport, script, text={"format": fmt})
    jsonschema.validate(json.loads(last_text(responses)), ANSWER)
    assert responses[-1]["text"]["format"]["type"] == "json_schema"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_json_schema_takes_a_valid_json_directive(srv: ThreadedServer, transport: str) -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    script = '!json {"verdict": "pass", "lines": [3]}'
    assert (
        last_text(await rollout(srv, transport, script, text={"format": fmt}))
        == '{"verdict":"pass","lines":[3]}'
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_json_object(srv: ThreadedServer, transport: str) -> None:
    responses = await rollout(srv, transport, "hello there", text={"format": {"type": "json_object"}})
    assert json.loads(last_text(responses)) == {"answer": "hello there"}


async def test_generated_output_is_the_same_on_every_transport(srv: ThreadedServer) -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    texts = {last_text(await rollout(srv, t, "Is it fixed?", text={"format": fmt})) for t in TRANSPORTS}
    assert len(texts) == 1
    args = set()
    for transport in TRANSPORTS:
        responses = await rollout(
            srv, transport, "hello", follow={"tool_choice": "auto"}, tool_choice="required", max_tool_calls=1
        )
        args.add(calls_of(responses[0])[0]["arguments"])
    assert len(args) == 1


async def test_max_tool_calls_counts_hosted_calls(srv: ThreadedServer) -> None:
    tools = [*TOOLS, {"type": "web_search"}]
    script = '!call web_search {"query": "x"}\n!call grep {}\n!say done'
    body = messages.body(MODEL, [messages.user_message(script)], tools=tools, max_tool_calls=1)
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
        response = (await http.post("/v1/responses", json=body)).json()
    assert [item["type"] for item in response["output"]] == ["web_search_call", "message"]
    assert last_text([response]) == "(not calling grep: max_tool_calls reached)"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_forced_hosted_search_then_the_answer(srv: ThreadedServer, transport: str) -> None:
    body = messages.body(
        MODEL,
        [messages.user_message("cats")],
        tools=[{"type": "web_search"}],
        tool_choice={"type": "web_search_preview"},
    )
    if transport == "http":
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
            response = (await http.post("/v1/responses", json=body)).json()
    elif transport == "ga":
        async with connect(srv.url) as ws:
            response = (await ga_events(ws, body))[-1]["response"]
    else:
        async with LongLivedClient(srv.url) as client:
            await client.send(messages.create(body))
            while (event := await client.recv(GUARD)).type not in TERMINAL_OR_ERROR:
                pass
            response = event.data["response"]
    assert [item["type"] for item in response["output"]] == ["web_search_call", "message"], response
    assert response["status"] == "completed"


async def refusal(srv: ThreadedServer, transport: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The status and error body of a create refused on ``transport`` (HTTP JSON, SSE, GA WebSocket,
    long-lived); the WebSocket still serves a valid create after it."""
    if transport in ("http", "sse"):
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
            reply = await http.post("/v1/responses", json={**body, "stream": transport == "sse"})
        return reply.status_code, reply.json()["error"]
    url = srv.url + ("?protocol=longlived" if transport == "longlived" else "")
    async with connect(url) as ws:
        frame = (await ga_events(ws, body))[-1]
        assert frame["type"] == "error", frame
        valid = {**body, "tool_choice": "auto"}
        assert (await ga_events(ws, valid))[-1]["type"] == "response.completed"
    return frame["status"], frame["error"]


NOT_OFFERED = [
    ({"type": "function", "name": "write_file"}, "write_file", "tool_choice"),
    ({"type": "custom", "name": "grep"}, "grep", "tool_choice"),  # grep is a function, not a custom tool
    ({"type": "image_generation"}, "image_generation", "tool_choice"),
    (
        {
            "type": "allowed_tools",
            "mode": "auto",
            "tools": [{"type": "function", "name": "grep"}, {"type": "function", "name": "delete_all"}],
        },
        "delete_all",
        "tool_choice.tools[1]",
    ),
]


@pytest.mark.parametrize("transport", ["http", "sse", "ga", "longlived"])
@pytest.mark.parametrize(("choice", "name", "param"), NOT_OFFERED)
async def test_a_choice_of_a_tool_not_offered_is_refused(
    srv: ThreadedServer, transport: str, choice: dict[str, Any], name: str, param: str
) -> None:
    """OpenAI's answer, on every transport: 400, "Tool choice 'NAME' not found in 'tools' parameter."."""
    body = messages.body(MODEL, [messages.user_message("hello")], tools=TOOLS, tool_choice=choice)
    status, error = await refusal(srv, transport, body)
    assert status == 400
    assert error["code"] == "invalid_request" and error["type"] == "invalid_request_error"
    assert error["message"] == f"Tool choice '{name}' not found in 'tools' parameter."
    assert error["param"] == ("$." + param if transport == "longlived" else param)
