"""The create fields and Response fields of the newer SDK (openai-python 3.63, ``types/responses``), on every
transport (docs/protocol.md, "Newer fields"): each is accepted, echoed as OpenAI's types spell it, and does
what the API documents (``async`` tools, ``configuration_update`` items, ``reasoning.context`` / ``mode`` and
the efforts ``xhigh`` / ``max``, ``background_options.completion_window``, ``tool_usage`` and
``input_transformations`` on the Response)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import MODEL, TERMINAL_OR_ERROR, assert_error, tools_decl, until
from openai.types.responses import Response as SdkResponse
from plain_server import srv  # noqa: F401  (the module's server)
from websockets.asyncio.client import connect

from proto.client import messages
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server

TRANSPORTS = ["http", "sse", "ga", "longlived"]


@pytest.fixture
async def http(srv: ThreadedServer) -> AsyncIterator[httpx.AsyncClient]:  # noqa: F811
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=60) as client:
        yield client


def body(script: str, items: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    return messages.body(MODEL, [messages.user_message(script), *(items or [])], store=False, **fields)


async def terminal(
    transport: str,
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    b: dict[str, Any],
) -> dict[str, Any]:
    """The last frame of one create over ``transport``: the terminal event (its ``response``), or the error
    (HTTP errors as the GA envelope, so that every transport reads the same)."""
    if transport == "http":
        reply = await http.post("/v1/responses", json=b)
        if reply.status_code != 200:
            return {"type": "error", "status": reply.status_code, **reply.json()}
        return {"type": "response." + reply.json()["status"], "response": reply.json()}
    if transport == "sse":
        events: list[dict[str, Any]] = []
        async with http.stream("POST", "/v1/responses", json={**b, "stream": True}) as reply:
            if reply.status_code != 200:
                await reply.aread()
                return {"type": "error", "status": reply.status_code, **reply.json()}
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: ") :]))
        return events[-1]
    url = srv.url + ("?protocol=longlived" if transport == "longlived" else "")
    async with connect(url) as ws:
        await ws.send(json.dumps(messages.create(b)))
        frames = await until(ws, {*TERMINAL_OR_ERROR, "response.done"})
    return frames[-1]


def response_of(frame: dict[str, Any]) -> dict[str, Any]:
    assert frame["type"] in ("response.completed", "response.done"), frame
    response: dict[str, Any] = frame["response"]
    # OpenAI's own type reads it (``usage`` aside: its cache-write counts belong to prompt caching)
    SdkResponse.model_validate({key: value for key, value in response.items() if key != "usage"})
    return response


# ------------------------------------------------------------------------------------ async tools
ASYNC_TOOLS = [
    {**tools_decl()[0], "async": True},
    {"type": "custom", "name": "apply_patch", "description": "a patch", "async": True},
]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_async_tools_are_echoed_and_the_model_keeps_working(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
) -> None:
    """An ``async`` call does not stop the response: the script's next line runs in the same response, and
    its output comes later, by call_id, in a create that continues from it."""
    name = ASYNC_TOOLS[0]["name"]
    script = f"!call {name} {{}}\n!say started; the result comes later\n!say got it"
    first = response_of(await terminal(transport, srv, http, body(script, tools=ASYNC_TOOLS)))
    assert [t.get("async") for t in first["tools"]] == [True, True]
    kinds = [item["type"] for item in first["output"]]
    assert kinds == ["function_call", "message"], kinds
    assert first["status"] == "completed" or transport == "longlived"
    call = first["output"][0]
    later = body(
        script,
        [
            call,
            first["output"][1],
            {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"},
        ],
        tools=ASYNC_TOOLS,
    )
    second = response_of(await terminal(transport, srv, http, later))
    assert [item["type"] for item in second["output"]] == ["message"]
    assert second["output"][0]["content"][0]["text"].startswith("got it")


# ------------------------------------------------------------------------------------ reasoning
@pytest.mark.nonconforming("the spec's ReasoningEffortEnum (2026-04-24) predates max")
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("effort", ["xhigh", "max"])
async def test_reasoning_context_mode_and_the_newer_efforts_are_echoed(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
    effort: str,
) -> None:
    """The Response carries the effective settings: the effort asked, the mode asked (``standard`` when
    none), the context mode used (``auto`` and none are ``all_turns``; ``current_turn``:
    tests/test_reasoning_context.py)."""
    reasoning = {"effort": effort, "mode": "pro", "context": "auto"}
    response = response_of(
        await terminal(transport, srv, http, body("!reason 5 !say ok", reasoning=reasoning))
    )
    assert response["reasoning"]["effort"] == effort
    assert response["reasoning"]["mode"] == "pro"
    assert response["reasoning"]["context"] == "all_turns"
    assert response["input_transformations"] == []  # nothing withheld
    plain = response_of(await terminal(transport, srv, http, body("!say ok", reasoning={"effort": "low"})))
    assert plain["reasoning"]["context"] == "all_turns" and plain["reasoning"]["mode"] == "standard"


# ------------------------------------------------------------------------------------ configuration_update
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_configuration_update_stays_in_effect(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
) -> None:
    """A ``configuration_update`` item sets ``text`` (and ``reasoning``) for the responses after it, until a
    later one replaces it: the output follows its format and the Response says so."""
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    update = {
        "type": "configuration_update",
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
        "reasoning": {"effort": "high"},
    }
    response = response_of(await terminal(transport, srv, http, body("answer in JSON", [update])))
    assert response["text"]["format"]["type"] == "json_schema"
    assert response["reasoning"]["effort"] == "high"
    text = response["output"][-1]["content"][0]["text"]
    assert set(json.loads(text)) == {"answer"}
    back = {"type": "configuration_update", "text": {"format": {"type": "text"}}}
    again = response_of(await terminal(transport, srv, http, body("answer in JSON", [update, back])))
    assert again["text"]["format"]["type"] == "text"


# ------------------------------------------------------------------------------------ background_options
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_background_options_soonest_is_accepted_and_the_windows_need_background(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
) -> None:
    """``completion_window`` ``soonest`` (the default) anywhere; ``2h`` / ``8h`` "require ``background:
    true``, Standard processing, and ``stream: false`` or omitted" (the SDK): refused otherwise, one code on
    every transport."""
    ok = await terminal(
        transport, srv, http, body("!say ok", background_options={"completion_window": "soonest"})
    )
    assert "background_options" not in response_of(ok)  # OpenAI's Response has no such field
    refused = await terminal(
        transport, srv, http, body("!say ok", background_options={"completion_window": "2h"})
    )
    param = ("$." if transport == "longlived" else "") + "background_options.completion_window"
    assert_error(refused, "invalid_request", param)


async def test_a_completion_window_runs_in_the_background(http: httpx.AsyncClient) -> None:
    b = {**body("!say later", background=True, background_options={"completion_window": "8h"}), "store": True}
    reply = await http.post("/v1/responses", json=b)
    assert reply.status_code == 200 and reply.json()["background"] is True, reply.text
    fast = body(
        "!say later", background=True, service_tier="priority", background_options={"completion_window": "2h"}
    )
    refused = await http.post("/v1/responses", json={**fast, "store": True})
    assert (
        refused.status_code == 400
        and refused.json()["error"]["param"] == "background_options.completion_window"
    )


# ------------------------------------------------------------------------------------ tool_usage
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tool_usage_counts_the_hosted_searches(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
) -> None:
    script = '!call web_search {"query": "a"} | !call web_search {"query": "b"}\n!say found'
    b = body(script, tools=[{"type": "web_search"}])
    response = response_of(await terminal(transport, srv, http, b))
    assert sum(item["type"] == "web_search_call" for item in response["output"]) == 2
    usage = response["tool_usage"]
    assert usage["web_search"] == {"num_requests": 2}
    assert usage["image_gen"]["total_tokens"] == 0 and usage["image_gen"]["input_tokens"] == 0
    none = response_of(await terminal(transport, srv, http, body("!say nothing hosted")))
    assert none["tool_usage"]["web_search"] == {"num_requests": 0}
