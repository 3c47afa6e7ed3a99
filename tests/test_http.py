"""POST /v1/responses (JSON and SSE), the stored-response endpoints, per-key isolation, error bodies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import MODEL, ROLLOUT_TOOLS, auth, outputs_for, running, state

from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server or a process

SCRIPT = 'Go.\n!call grep {"p": 1}\n!say done'
KEYS = ["sk-test-alice-0001", "sk-test-bob-0002"]


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running(api_key=KEYS) as server:
        yield server


def client(server: ThreadedServer, key: str | None = KEYS[0]) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.http_url, headers=auth(key), timeout=30)


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def test_function_call_loop_with_previous_response_id(srv: ThreadedServer) -> None:
    async with client(srv) as c:
        first = (
            await c.post("/v1/responses", json={"model": MODEL, "input": SCRIPT, "tools": ROLLOUT_TOOLS})
        ).json()
        assert first["status"] == "completed" and first["output"][0]["type"] == "function_call"
        body = {
            "model": MODEL,
            "input": outputs_for(first),
            "tools": ROLLOUT_TOOLS,
            "previous_response_id": first["id"],
        }
        second = (await c.post("/v1/responses", json=body)).json()
    assert second["previous_response_id"] == first["id"]
    assert second["output"][-1]["content"][0]["text"] == "done"
    assert second["lab"]["mode"] == "http-prev" and second["lab"]["work"]["store_reads"] == 1


async def test_sse_follows_openais_event_order(srv: ThreadedServer) -> None:
    async with client(srv) as c:
        reply = await c.post(
            "/v1/responses", json={"model": MODEL, "input": "!say hello there", "stream": True}
        )
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = sse_events(reply.text)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    kinds = [name for name, _ in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "hello there"


async def test_stored_response_get_delete_and_input_items(srv: ThreadedServer) -> None:
    async with client(srv) as c:
        created = (
            await c.post(
                "/v1/responses", json={"model": MODEL, "input": [{"role": "user", "content": "!say hi"}]}
            )
        ).json()
        got = await c.get(f"/v1/responses/{created['id']}")
        assert got.status_code == 200 and got.json()["id"] == created["id"]
        items = (await c.get(f"/v1/responses/{created['id']}/input_items")).json()
        assert items["object"] == "list" and items["has_more"] is False
        assert [i["type"] for i in items["data"]] == ["message"] and items["first_id"] == items["data"][0][
            "id"
        ]
        deleted = await c.delete(f"/v1/responses/{created['id']}")
        assert deleted.json() == {"id": created["id"], "object": "response", "deleted": True}
        gone = await c.get(f"/v1/responses/{created['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"


async def test_store_false_is_never_persisted(srv: ThreadedServer) -> None:
    async with client(srv) as c:
        created = (
            await c.post(
                "/v1/responses",
                json={"model": MODEL, "input": SCRIPT, "tools": ROLLOUT_TOOLS, "store": False},
            )
        ).json()
        assert (await c.get(f"/v1/responses/{created['id']}")).status_code == 404
        body = {"model": MODEL, "input": outputs_for(created), "previous_response_id": created["id"]}
        follow = await c.post("/v1/responses", json=body)
    assert follow.status_code == 400 and follow.json()["error"] == {  # OpenAI's status, code and wording
        "type": "invalid_request_error",
        "code": "previous_response_not_found",
        "message": f"Previous response with id '{created['id']}' not found.",
        "param": "previous_response_id",
    }


async def test_stored_responses_are_isolated_per_key(srv: ThreadedServer) -> None:
    async with client(srv, KEYS[0]) as alice, client(srv, KEYS[1]) as bob:
        mine = (
            await alice.post("/v1/responses", json={"model": MODEL, "input": SCRIPT, "tools": ROLLOUT_TOOLS})
        ).json()
        for reply in (
            await bob.get(f"/v1/responses/{mine['id']}"),
            await bob.get(f"/v1/responses/{mine['id']}/input_items"),
            await bob.delete(f"/v1/responses/{mine['id']}"),
        ):
            assert reply.status_code == 404 and reply.json()["error"]["code"] == "response_not_found"
        chained = await bob.post(
            "/v1/responses",
            json={"model": MODEL, "input": outputs_for(mine), "previous_response_id": mine["id"]},
        )
        assert chained.json()["error"]["code"] == "previous_response_not_found"
        assert (await alice.get(f"/v1/responses/{mine['id']}")).status_code == 200


async def test_errors_use_openais_body(srv: ThreadedServer) -> None:
    async with client(srv, None) as anonymous:
        refused = await anonymous.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    async with client(srv) as c:
        unknown = await c.post("/v1/responses", json={"model": "nope", "input": "hi"})
        assert unknown.status_code == 404 and unknown.json()["error"] == {
            "type": "invalid_request_error",
            "code": "model_not_found",
            "message": "the model 'nope' does not exist",
            "param": "model",
        }
        bad = await c.post(
            "/v1/responses", json={"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]}
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("input[0]")
        orphan = await c.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}],
            },
        )
        assert orphan.json()["error"]["code"] == "unknown_call_id"
        broken = await c.post("/v1/responses", content=b"{oops", headers={"content-type": "application/json"})
        assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"


async def test_each_response_billed_once(srv: ThreadedServer) -> None:
    async with client(srv) as c:
        ids = [
            (await c.post("/v1/responses", json={"model": MODEL, "input": "!say x", "stream": stream}))
            for stream in (False, True)
        ]
    ledger = state(srv).pipeline.ledger
    ledger.flush()
    assert ledger.duplicates == 0
    first = ids[0].json()["id"]
    row = ledger.get(first)
    assert row is not None and row.mode == "http"
