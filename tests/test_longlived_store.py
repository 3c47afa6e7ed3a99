"""The long-lived response and the response store: stored at its end (store: true), retrievable over
HTTP, and able to continue a stored response with ``previous_response_id``."""

from __future__ import annotations

import json

import httpx
from helpers import MODEL, ServerFactory

from proto.client.longlived import LongLivedClient
from proto.server.serve import ThreadedServer

LOOKUP_TOOLS = [{"type": "function", "name": "lookup"}]


async def _lookup(args: dict[str, object]) -> str:
    return json.dumps({"found": args})


async def test_a_completed_long_lived_response_is_stored_with_all_its_input(server: ThreadedServer) -> None:
    script = 'store me\n!call lookup {"k": 1}\n!call lookup {"k": 2}\n!say stored'
    async with LongLivedClient(server.url) as client:
        result = await client.rollout(
            {"model": MODEL, "input": script, "tools": LOOKUP_TOOLS}, {"lookup": _lookup}
        )
    response_id = result.response["id"]
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        stored = (await http.get(f"/v1/responses/{response_id}")).json()
        items = (await http.get(f"/v1/responses/{response_id}/input_items")).json()
    assert stored["status"] == "completed"
    assert [item["type"] for item in stored["output"]] == ["function_call", "function_call", "message"]
    # The create's message and both appended outputs: the whole input of the one response.
    kinds = sorted(item["type"] for item in items["data"])
    assert kinds == ["function_call_output", "function_call_output", "message"]


async def test_store_false_is_never_persisted(server: ThreadedServer) -> None:
    async with LongLivedClient(server.url) as client:
        result = await client.rollout({"model": MODEL, "input": "!say not kept", "store": False}, {})
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        assert (await http.get(f"/v1/responses/{result.response['id']}")).status_code == 404


async def test_a_long_lived_response_continues_a_stored_one(server: ThreadedServer) -> None:
    script = 'first\n!call lookup {"k": 1}\n!say one\n!say two'
    async with LongLivedClient(server.url) as client:
        first = await client.rollout(
            {"model": MODEL, "input": script, "tools": LOOKUP_TOOLS}, {"lookup": _lookup}
        )
        second = await client.rollout(
            {
                "model": MODEL,
                "input": "and then?",
                "previous_response_id": first.response["id"],
                "tools": LOOKUP_TOOLS,
            },
            {"lookup": _lookup},
        )
    assert second.response["status"] == "completed"
    assert second.response["previous_response_id"] == first.response["id"]
    # The stored chain is context: the script's next line (turn 2) is what the model says now.
    assert second.response["output"][-1]["content"][0]["text"] == "two"
    assert second.response["lab"]["work"]["store_reads"] == 1
    assert second.response["lab"]["turns"][0]["turn"] == 2


async def test_an_unknown_previous_response_is_refused_and_the_connection_keeps_serving(
    server: ThreadedServer,
) -> None:
    async with LongLivedClient(server.url) as client:
        await client.send(
            {"type": "response.create", "model": MODEL, "input": "x", "previous_response_id": "resp_nope"}
        )
        error = (await client.recv(timeout=5)).data
        assert error["type"] == "error"
        assert error["error"]["code"] == "previous_response_not_found"
        result = await client.rollout({"model": MODEL, "input": "!say still here"}, {})
    assert result.response["status"] == "completed"


async def test_metrics_show_stage_histograms_and_per_mode_counters(make_server: ServerFactory) -> None:
    with make_server() as fresh:
        async with LongLivedClient(fresh.url) as client:
            await client.rollout(
                {"model": MODEL, "input": '!call lookup {"k": 1}\n!say ok', "tools": LOOKUP_TOOLS},
                {"lookup": _lookup},
            )
        async with httpx.AsyncClient(base_url=fresh.http_url) as http:
            text = (await http.get("/metrics")).text
    assert 'responses_lab_responses_total{mode="longlived",status="completed"} 1.0' in text
    assert 'responses_lab_turns_total{mode="longlived"} 2.0' in text
    assert 'responses_lab_stage_seconds_count{mode="longlived",stage="render_tokenize"} 2.0' in text
    assert 'responses_lab_engine_running{model="mock-4000tps"} 0.0' in text
