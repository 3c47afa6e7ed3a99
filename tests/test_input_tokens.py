"""``POST /v1/responses/input_tokens`` (docs/protocol.md, "Endpoints"): the input tokens a create of the
same body reports, exactly, and a create's typed errors for a body a create would refuse."""

from __future__ import annotations

from typing import Any

import httpx
import plain_server
import pytest
from helpers import MODEL

from sampler.tokens import reasoning_content

pytestmark = pytest.mark.process  # every test starts a server

SCRIPT = "Start.\n!say one\n!say two\n!say three\n!say four"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
    {"type": "web_search"},
]
HISTORY: list[dict[str, Any]] = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": SCRIPT},
    {"type": "reasoning", "summary": [], "encrypted_content": reasoning_content([5, 6, 7, 8])},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "Rain, 8 degrees."},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It rains."}]},
    {
        "role": "user",
        "content": [{"type": "input_text", "text": "And tomorrow?"}, {"type": "input_text", "text": " Sun?"}],
    },
]


srv, http = plain_server.srv, plain_server.http  # the module's server and its httpx client (fixtures)


async def counted(http: httpx.AsyncClient, body: dict[str, Any]) -> int:
    reply = await http.post("/v1/responses/input_tokens", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert set(answer) == {"object", "input_tokens"} and answer["object"] == "response.input_tokens"
    count: int = answer["input_tokens"]
    return count


async def created(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()
    assert response["status"] == "completed", response
    assert len(response["lab"]["turns"]) == 1, response  # one turn: its input tokens are the body's
    return response


@pytest.mark.parametrize(
    "body",
    [
        {"model": MODEL, "input": "Hello there."},
        {"model": MODEL, "input": HISTORY, "tools": TOOLS, "instructions": "You are a test.", "store": False},
        {
            "model": MODEL,
            "input": HISTORY,
            "tools": TOOLS[:1],
            "conversation": None,
            "truncation": "disabled",
        },
    ],
    ids=["string", "tools-and-history", "one-tool"],
)
async def test_count_equals_a_creates_usage(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
    count = await counted(http, body)
    response = await created(http, body)
    assert count == response["usage"]["input_tokens"]
    assert count > 0


async def test_count_with_previous_response_id(http: httpx.AsyncClient) -> None:
    """The stored chain counts, as a continuation's create renders it."""
    first = await created(http, {"model": MODEL, "input": HISTORY, "tools": TOOLS})
    body = {
        "model": MODEL,
        "input": [{"role": "user", "content": "Next."}],
        "tools": TOOLS,
        "previous_response_id": first["id"],
    }
    count = await counted(http, body)
    assert count == (await created(http, body))["usage"]["input_tokens"]
    assert count > first["usage"]["input_tokens"]


async def test_tools_and_instructions_count(http: httpx.AsyncClient) -> None:
    bare = await counted(http, {"model": MODEL, "input": HISTORY})
    assert await counted(http, {"model": MODEL, "input": HISTORY, "tools": TOOLS}) > bare
    assert await counted(http, {"model": MODEL, "input": HISTORY, "instructions": "Be kind."}) > bare


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"input": "hi"}, 400, "invalid_request", "model"),
        ({"model": "no-such-model", "input": "hi"}, 404, "model_not_found", "model"),
        ({"model": MODEL, "input": [{"type": "frobnicate"}]}, 400, "invalid_request", "input[0].type"),
        (
            {"model": MODEL, "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            400,
            "unknown_call_id",
            "input[0].call_id",
        ),
        (
            {"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"},
            400,
            "previous_response_not_found",
            None,
        ),
        (
            {"model": MODEL, "input": [{"type": "item_reference", "id": "msg_nope"}]},
            404,
            "item_not_found",
            None,
        ),
    ],
    ids=["no-model", "unknown-model", "bad-item", "orphan-output", "no-previous", "no-reference"],
)
async def test_bad_body_is_a_creates_error(
    http: httpx.AsyncClient, body: dict[str, Any], status: int, code: str | None, param: str | None
) -> None:
    reply = await http.post("/v1/responses/input_tokens", json=body)
    same = await http.post("/v1/responses", json=body)
    assert (reply.status_code, reply.json()) == (same.status_code, same.json())
    error = reply.json()["error"]
    assert reply.status_code == status, error
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error


async def test_not_json_is_invalid_json(http: httpx.AsyncClient) -> None:
    reply = await http.post(
        "/v1/responses/input_tokens", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert (reply.status_code, reply.json()["error"]["code"]) == (400, "invalid_json")
