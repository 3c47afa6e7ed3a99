"""Input items OpenAI accepts without the fields its SDK marks required (docs/protocol.md, "The create body,
items and tools"): a ``reasoning`` item without ``id`` (opencode, the AI SDK's Responses provider, with
``store: false`` and ``include: ["reasoning.encrypted_content"]``), messages and function calls without
``id`` / ``status``, an output item sent back without its ``status``.

Each is accepted over HTTP, GA WebSocket mode and the long-lived protocol, and renders and counts exactly
like the same item with its ids; the server's own output sent back without ids round-trips.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import plain_server
import pytest
from helpers import MODEL, TERMINAL_OR_ERROR, until
from websockets.asyncio.client import connect

from proto.core import openai_types as oa
from proto.server.serve import ThreadedServer
from sampler.tokens import reasoning_content

SCRIPT = "!reason 8 !say first\n!say second"
ENCRYPTED = reasoning_content([11, 12, 13, 14, 15, 16, 17, 18])
INCLUDE = ["reasoning.encrypted_content"]


def opencode_input(with_ids: bool) -> list[dict[str, Any]]:
    """What opencode re-sends on its second turn (input[2] is the reasoning item)."""
    reasoning: dict[str, Any] = {"type": "reasoning", "summary": [], "encrypted_content": ENCRYPTED}
    message: dict[str, Any] = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "first"}],
    }
    if with_ids:
        reasoning["id"] = "rs_1"
        message.update(id="msg_1", status="completed")
    return [
        {"role": "system", "content": "You are opencode."},
        {"role": "user", "content": SCRIPT},
        reasoning,
        message,
        {"role": "user", "content": "go on"},
    ]


def body(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": MODEL, "input": items, "store": False, "include": INCLUDE}


def without_ids(item: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if key not in ("id", "status")}


srv, http = plain_server.srv, plain_server.http  # the module's server and its httpx client (fixtures)


def test_reasoning_without_id_decodes() -> None:
    """The generated schema (RELAXED in scripts/gen_openai_types.py) leaves these fields optional."""
    decoder = msgspec.json.Decoder(oa.InputItem)
    for item in [
        *opencode_input(with_ids=False)[2:4],
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "web_search_call", "id": "ws_1", "action": {"type": "search", "query": "q"}},
    ]:
        decoder.decode(json.dumps(item))


@pytest.mark.process
async def test_reasoning_without_id_over_http(http: httpx.AsyncClient) -> None:
    """Accepted, and counted exactly as the same items with their ids."""
    usage = []
    for with_ids in (True, False):
        reply = await http.post("/v1/responses", json=body(opencode_input(with_ids)))
        assert reply.status_code == 200, reply.text
        response = reply.json()
        assert response["status"] == "completed", response
        assert response["output"][-1]["content"][0]["text"] == "second"
        usage.append(response["usage"]["input_tokens"])
    assert usage[0] == usage[1]


@pytest.mark.process
@pytest.mark.parametrize("protocol", ["ga", "longlived"])
async def test_reasoning_without_id_over_websockets(
    srv: ThreadedServer, http: httpx.AsyncClient, protocol: str
) -> None:
    expected = (await http.post("/v1/responses", json=body(opencode_input(True)))).json()
    async with connect(f"{srv.url}?protocol={protocol}") as ws:
        await ws.send(json.dumps({"type": "response.create", **body(opencode_input(False))}))
        frame = (await until(ws, {"response.done", *TERMINAL_OR_ERROR}))[-1]
    assert frame["type"] == "response.completed", frame
    assert frame["response"]["output"][-1]["content"][0]["text"] == "second"
    assert frame["response"]["usage"]["input_tokens"] == expected["usage"]["input_tokens"]


@pytest.mark.process
async def test_own_output_round_trips_without_ids(http: httpx.AsyncClient) -> None:
    """The server's reasoning (with its encrypted_content) and message, sent back without id or status,
    render as the same tokens as sent back whole."""
    first = (await http.post("/v1/responses", json=body([{"role": "user", "content": SCRIPT}]))).json()
    assert first["status"] == "completed", first
    output = first["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["encrypted_content"]
    usage = []
    for items in (output, [without_ids(item) for item in output]):
        history = [{"role": "user", "content": SCRIPT}, *items, {"role": "user", "content": "go on"}]
        reply = await http.post("/v1/responses", json=body(history))
        assert reply.status_code == 200, reply.text
        assert reply.json()["output"][-1]["content"][0]["text"] == "second"
        usage.append(reply.json()["usage"]["input_tokens"])
    assert usage[0] == usage[1]


@pytest.mark.process
async def test_web_search_call_without_status(http: httpx.AsyncClient) -> None:
    call = {"type": "web_search_call", "id": "ws_1", "action": {"type": "search", "query": "weather"}}
    reply = await http.post("/v1/responses", json=body([{"role": "user", "content": "hi"}, call]))
    assert reply.status_code == 200, reply.text
