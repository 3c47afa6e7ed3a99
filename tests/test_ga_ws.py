"""GA WebSocket mode (docs/protocol.md, "GA WebSocket mode") over a real server: each documented behaviour."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import MODEL, ga_events, outputs_for, running
from helpers import ROLLOUT_TOOLS as TOOLS
from virtual import virtual
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server or a process

SCRIPT = 'Go.\n!call grep {"p": 1}\n!call read_file {"path": "a.py"}\n!say done'


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


def create(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "tools": TOOLS, **fields}


async def first_turn(ws: Any, store: bool) -> dict[str, Any]:
    events = await ga_events(ws, create(input=SCRIPT, store=store))
    assert events[-1]["type"] == "response.completed"
    response: dict[str, Any] = events[-1]["response"]
    return response


def continue_from(response: dict[str, Any], store: bool, **extra: Any) -> dict[str, Any]:
    return create(input=outputs_for(response), previous_response_id=response["id"], store=store, **extra)


async def test_cache_hit_tokenizes_only_new_items_and_skips_resolution(srv: ThreadedServer) -> None:
    async with connect(srv.url) as ws:
        first = await first_turn(ws, store=False)
        events = await ga_events(ws, continue_from(first, store=False))
    second = events[-1]["response"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    work = second["lab"]["work"]
    assert work["model_resolutions"] == 0 and work["store_reads"] == 0
    assert work["items_rendered"] == 1  # the one function_call_output, nothing old
    assert second["output"][0]["name"] == "read_file"  # the script's second turn: history was kept


async def test_uncached_store_false_is_previous_response_not_found(srv: ThreadedServer) -> None:
    async with connect(srv.url) as ws:
        first = await first_turn(ws, store=False)
    async with connect(srv.url) as ws:  # a new connection: its cache is empty
        events = await ga_events(ws, continue_from(first, store=False))
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["code"] == "previous_response_not_found"
    assert events[-1]["status"] == 400 and events[-1]["error"]["type"] == "invalid_request_error"  # OpenAI's
    assert events[-1]["error"]["message"] == f"Previous response with id '{first['id']}' not found."


async def test_uncached_store_true_loads_from_the_store(srv: ThreadedServer) -> None:
    async with connect(srv.url) as ws:
        first = await first_turn(ws, store=True)
    async with connect(srv.url) as ws:
        events = await ga_events(ws, continue_from(first, store=True))
    second = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert second["lab"]["work"]["store_reads"] == 1 and second["lab"]["work"]["model_resolutions"] == 1
    assert second["output"][0]["name"] == "read_file"


@pytest.mark.parametrize("store", [False, True])
async def test_failed_continuation_evicts_the_id(srv: ThreadedServer, store: bool) -> None:
    async with connect(srv.url) as ws:
        first = await first_turn(ws, store=store)
        bad = create(
            input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}],
            previous_response_id=first["id"],
            store=store,
        )
        failed = await ga_events(ws, bad)
        assert failed[-1]["error"]["code"] == "unknown_call_id"
        retry = await ga_events(ws, continue_from(first, store=store))
    if store:  # evicted from the cache, still in the store: the slower path
        assert retry[-1]["type"] == "response.completed"
        assert retry[-1]["response"]["lab"]["work"]["store_reads"] == 1
    else:
        assert retry[-1]["error"]["code"] == "previous_response_not_found"


async def test_generate_false_prepares_state_without_sampling(srv: ThreadedServer) -> None:
    async with connect(srv.url) as ws:
        warm = await ga_events(ws, create(input=SCRIPT, store=False, generate=False))
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        response = warm[-1]["response"]
        assert response["output"] == [] and response["usage"]["output_tokens"] == 0
        assert response["lab"]["work"]["tokens_tokenized"] > 0  # the input was rendered and tokenized
        events = await ga_events(ws, create(input=[], previous_response_id=response["id"], store=False))
    sampled = events[-1]["response"]
    assert (
        sampled["lab"]["work"]["tokens_tokenized"] == 0 and sampled["lab"]["work"]["model_resolutions"] == 0
    )
    assert sampled["output"][0]["name"] == "grep"  # the script's first turn


async def test_one_response_in_flight(srv: ThreadedServer) -> None:
    slow = create(model="mock-65tps", input="!tokens 40 !say slow", store=False)
    async with connect(srv.url) as ws:
        await ws.send(json.dumps({"type": "response.create", **slow}))
        await ws.send(json.dumps({"type": "response.create", **slow}))
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["type"] != "response.completed":
            seen.append(json.loads(await ws.recv()))
    errors = [e for e in seen if e["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["response_in_progress"]
    assert sum(e["type"] == "response.created" for e in seen) == 1


async def test_connection_age_limit() -> None:
    async with virtual(connection_max_age_s=0.3) as server, connect(server.url) as ws:
        ok = await ga_events(ws, create(input="hi", store=False))
        assert ok[-1]["type"] == "response.completed"
        await server.advance(0.3)
        frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert frame["type"] == "error" and frame["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)


async def test_only_response_create_is_accepted(srv: ThreadedServer) -> None:
    async with connect(srv.url) as ws:
        await ws.send(json.dumps({"type": "response.append", "input": []}))
        frame = json.loads(await ws.recv())
        assert frame["error"]["code"] == "unknown_event_type"
        await ws.send("{not json")
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_json"
        events = await ga_events(ws, create(input="hi", model="nope"))
        assert events[-1]["error"]["code"] == "model_not_found"
