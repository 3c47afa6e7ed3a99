"""Requests the Open Responses schema allows and openai-python's types do not spell, accepted for what they
mean over HTTP and GA WebSocket mode (docs/protocol.md, "Valid shapes the SDK's types lack"); an input
message listed by ``input_items`` in the SDK's item shape, its ``status`` filled in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import MODEL, running

from proto.client.ga import GaClient
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process

TOOL = {"type": "function", "name": "grep", "parameters": {"type": "object", "properties": {}}}
CALLS = "!call grep {}\n!say done"


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


async def create(srv: ThreadedServer, transport: str, body: dict[str, Any]) -> dict[str, Any]:
    if transport == "http":
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as http:
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            return dict(reply.json())
    async with GaClient(srv.url, ping_interval=None) as ga:
        return await ga.create(body, timeout=30)


def types(response: dict[str, Any]) -> list[str]:
    return [item["type"] for item in response["output"]]


@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_tools_null_is_no_tools(srv: ThreadedServer, transport: str) -> None:
    response = await create(srv, transport, {"model": MODEL, "input": "!say plain", "tools": None})
    assert response["status"] == "completed" and response["tools"] == []
    assert types(response) == ["message"]


@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_a_format_without_type_is_text(srv: ThreadedServer, transport: str) -> None:
    response = await create(srv, transport, {"model": MODEL, "input": "!say plain", "text": {"format": {}}})
    assert response["text"]["format"] == {"type": "text"}
    assert response["output"][0]["content"][0]["text"] == "plain"


@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_a_format_without_type_but_a_schema_is_json_schema(srv: ThreadedServer, transport: str) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {"model": MODEL, "input": "count", "text": {"format": {"name": "count", "schema": schema}}}
    response = await create(srv, transport, body)
    assert response["text"]["format"]["type"] == "json_schema"
    assert isinstance(json.loads(response["output"][0]["content"][0]["text"])["n"], int)


@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_allowed_tools_without_mode_is_auto(srv: ThreadedServer, transport: str) -> None:
    choice = {"type": "allowed_tools", "tools": [{"type": "function", "name": "grep"}]}
    body = {"model": MODEL, "input": CALLS, "tools": [TOOL], "tool_choice": choice}
    response = await create(srv, transport, body)
    assert response["tool_choice"]["mode"] == "auto"
    assert types(response) == ["function_call"]  # the script's call, as auto allows


@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_allowed_tools_mode_none_calls_nothing(srv: ThreadedServer, transport: str) -> None:
    choice = {"type": "allowed_tools", "mode": "none", "tools": [{"type": "function", "name": "grep"}]}
    body = {"model": MODEL, "input": CALLS, "tools": [TOOL], "tool_choice": choice}
    response = await create(srv, transport, body)
    assert response["tool_choice"] == "none"
    assert "function_call" not in types(response)


@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_an_input_status_outside_the_enum_is_dropped(srv: ThreadedServer, transport: str) -> None:
    message = {"type": "message", "role": "user", "content": "!say seen", "status": ""}
    response = await create(srv, transport, {"model": MODEL, "input": [message]})
    assert response["output"][0]["content"][0]["text"] == "seen"


@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_an_ill_typed_field_is_still_refused(srv: ThreadedServer, transport: str) -> None:
    """What the schema does not allow stays ``invalid_request`` with its param, on both transports."""
    body = {"model": MODEL, "input": "hi", "tools": {"type": "function"}}
    if transport == "http":
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as http:
            reply = await http.post("/v1/responses", json=body)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_request"
        assert reply.json()["error"]["param"] == "tools"
        return
    async with GaClient(srv.url, ping_interval=None) as ga:
        with pytest.raises(Exception, match="invalid_request"):
            await ga.create(body, timeout=30)


async def test_input_items_lists_messages_in_the_sdk_shape(srv: ThreadedServer) -> None:
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as http:
        reply = await http.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": [
                    {"role": "user", "content": "!say ok"},
                    {"role": "assistant", "content": "earlier"},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]},
                ],
            },
        )
        listed = (await http.get(f"/v1/responses/{reply.json()['id']}/input_items?order=asc")).json()["data"]
    assert [(item["type"], item["status"]) for item in listed] == [("message", "completed")] * 3
    assert listed[0]["content"] == [{"type": "input_text", "text": "!say ok"}]
    assert listed[1]["content"] == [{"type": "output_text", "text": "earlier", "annotations": []}]
    assert listed[2]["content"] == [{"type": "input_text", "text": "more"}]
