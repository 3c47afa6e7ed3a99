"""Compaction over the wire (docs/protocol.md, "Compaction"): the window ``POST /v1/responses/compact``
returns stands for the history it replaced on every transport — the directive script goes on where the
history left it, ``usage.input_tokens`` is what ``POST /v1/responses/input_tokens`` counts for the window,
the prefix cache keeps it — and a tampered one is refused as OpenAI refuses it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import (
    MODEL,
    TERMINAL_OR_ERROR,
    assert_error,
    ga_events,
    outputs,
    tools_decl,
    until,
    user_message,
)
from plain_server import srv  # noqa: F401  (the module's server)
from websockets.asyncio.client import connect

from proto.client import messages
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server

SCRIPT = (
    'Fix it.\n!call grep {"q": 1}\n!call read_file {"path": "a.py"}\n!call run_tests {}\n'
    "!tokens 40 !say All green."
)
TOOLS = tools_decl()


@pytest.fixture
async def http(srv: ThreadedServer) -> AsyncIterator[httpx.AsyncClient]:  # noqa: F811
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as client:
        yield client


def body(items: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return messages.body(MODEL, items, tools=TOOLS, **fields)


def calls(response: dict[str, Any]) -> list[str]:
    return [item["name"] for item in response["output"] if item["type"] == "function_call"]


def text(response: dict[str, Any]) -> str:
    return "".join(
        p["text"] for item in response["output"] if item["type"] == "message" for p in item["content"]
    )


async def create(http: httpx.AsyncClient, payload: dict[str, Any]) -> dict[str, Any]:
    reply = await http.post("/v1/responses", json=payload)
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()
    return response


async def two_turns_then_compact(http: httpx.AsyncClient) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Two call turns over HTTP (full history), then the history compacted: (history, compacted)."""
    history: list[dict[str, Any]] = [user_message(SCRIPT)]
    for expected in (["grep"], ["read_file"]):
        response = await create(http, body(history))
        assert calls(response) == expected, response["output"]
        history += [*response["output"], *outputs(response["output"])]
    reply = await http.post("/v1/responses/compact", json=body(history))
    assert reply.status_code == 200, reply.text
    return history, reply.json()


async def counted(http: httpx.AsyncClient, payload: dict[str, Any]) -> int:
    reply = await http.post("/v1/responses/input_tokens", json=payload)
    assert reply.status_code == 200, reply.text
    count: int = reply.json()["input_tokens"]
    return count


async def test_http_full_history_goes_on_from_a_compacted_window(http: httpx.AsyncClient) -> None:
    history, compacted = await two_turns_then_compact(http)
    window = compacted["output"]
    # OpenAI's shape: the user's messages kept, the rest one compaction item
    assert [(i["type"], i.get("role")) for i in window] == [("message", "user"), ("compaction", None)]
    assert window[0]["content"][0]["text"] == SCRIPT
    # the script goes on at its third line: the compaction item stands for the two segments it replaced
    third = await create(http, body(window))
    assert calls(third) == ["run_tests"], third["output"]
    # usage is what the compacted window counts, fewer than the history it replaced
    assert third["usage"]["input_tokens"] == await counted(http, body(window))
    assert third["usage"]["input_tokens"] < await counted(http, body(history))
    # the whole history sent again from the window: the answer, as on the uncompacted history
    after = [*window, *third["output"], *outputs(third["output"])]
    last = await create(http, body(after))
    assert text(last).startswith("All green.")
    assert last["usage"]["input_tokens"] == await counted(http, body(after))
    # the window renders to the same tokens every time: the prefix cache keeps it
    again = await create(http, body(window))
    assert calls(again) == ["run_tests"]
    assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0, again["usage"]


async def test_ga_chain_from_a_compacted_window(srv: ThreadedServer, http: httpx.AsyncClient) -> None:  # noqa: F811
    _, compacted = await two_turns_then_compact(http)
    window = compacted["output"]
    async with connect(srv.url) as ws:
        first = (await ga_events(ws, body(window, store=False)))[-1]
        assert first["type"] == "response.completed", first
        assert calls(first["response"]) == ["run_tests"]
        assert first["response"]["usage"]["input_tokens"] == await counted(http, body(window))
        pending = [i for i in first["response"]["output"] if i["type"] == "function_call"]
        follow = messages.continuation(body([], store=False), outputs(pending), first["response"]["id"])
        second = (await ga_events(ws, follow))[-1]
    assert second["type"] == "response.completed", second
    assert text(second["response"]).startswith("All green.")


async def test_longlived_create_from_a_compacted_window(srv: ThreadedServer, http: httpx.AsyncClient) -> None:  # noqa: F811
    _, compacted = await two_turns_then_compact(http)
    window = compacted["output"]
    async with connect(srv.url + "?protocol=longlived") as ws:
        await ws.send(json.dumps(messages.create(body(window))))
        done = (await until(ws, {"response.done", *TERMINAL_OR_ERROR}))[-1]
        assert done["type"] == "response.done", done
        assert [call["name"] for call in done["pending_calls"]] == ["run_tests"]
        assert done["response"]["usage"]["input_tokens"] == await counted(http, body(window))
        await ws.send(json.dumps(messages.append(outputs(done["pending_calls"]))))
        terminal = (await until(ws, TERMINAL_OR_ERROR))[-1]
    assert terminal["type"] == "response.completed", terminal
    assert "All green." in text(terminal["response"])


def tampered(window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The window with one character of the compaction's content changed (still valid base64)."""
    item = dict(window[-1])
    content = item["encrypted_content"]
    middle = len(content) // 2
    item["encrypted_content"] = (
        content[:middle] + ("B" if content[middle] != "B" else "C") + content[middle + 1 :]
    )
    return [*window[:-1], item]


@pytest.mark.parametrize("transport", ["http", "input_tokens", "ga", "longlived"])
async def test_a_tampered_compaction_is_refused(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
) -> None:
    """OpenAI's answer to content it cannot verify: 400 ``invalid_encrypted_content``, "The encrypted
    content … could not be verified."; the connection serves on."""
    _, compacted = await two_turns_then_compact(http)
    bad = body(tampered(compacted["output"]))
    if transport in ("http", "input_tokens"):
        path = "/v1/responses" if transport == "http" else "/v1/responses/input_tokens"
        reply = await http.post(path, json=bad)
        assert reply.status_code == 400, reply.text
        error = {"type": "error", "status": 400, **reply.json()}
        param = "input[1].encrypted_content"
    else:
        url = srv.url + ("?protocol=longlived" if transport == "longlived" else "")
        async with connect(url) as ws:
            error = (await ga_events(ws, bad))[-1]
            assert (await ga_events(ws, body([user_message("!say still here")])))[-1]["type"] == (
                "response.completed"
            )
        param = ("$." if transport == "longlived" else "") + "input[1].encrypted_content"
    assert_error(error, "invalid_encrypted_content", param)
    assert error["error"]["message"].startswith("The encrypted content rlc2")
    assert error["error"]["message"].endswith("could not be verified.")


TRIGGER = {"type": "compaction_trigger"}


def compaction_only(response: dict[str, Any]) -> dict[str, Any]:
    """The one item a ``compaction_trigger`` is answered with (what Codex's remote compaction requires)."""
    assert response["status"] == "completed", response
    assert [item["type"] for item in response["output"]] == ["compaction"], response["output"]
    item: dict[str, Any] = response["output"][0]
    assert item["id"].startswith("cmp_") and item["encrypted_content"].startswith("rlc2:")
    return item


async def test_a_compaction_trigger_is_answered_with_one_compaction_item(http: httpx.AsyncClient) -> None:
    """A create whose input ends with ``compaction_trigger`` (OpenAI's remote compaction, what Codex 0.171
    sends): the answer is one compaction item, its summary decoded like any output (one token per 8 of the
    context); the window of the user's messages and that item goes on where the history was."""
    history: list[dict[str, Any]] = [user_message(SCRIPT)]
    for _ in range(2):
        response = await create(http, body(history))
        history += [*response["output"], *outputs(response["output"])]
    compacting = await create(http, body([*history, TRIGGER]))
    item = compaction_only(compacting)
    usage = compacting["usage"]
    assert usage["output_tokens"] == max(1, usage["input_tokens"] // 8), usage
    window = [user_message(SCRIPT), item]
    third = await create(http, body(window))
    assert calls(third) == ["run_tests"], third["output"]
    assert third["usage"]["input_tokens"] == await counted(http, body(window))
    # the full history, then its compaction: the compaction stands for all before it (counted once)
    assert calls(await create(http, body([*history, item]))) == ["run_tests"]


async def test_a_ga_chain_compacts_and_goes_on(srv: ThreadedServer) -> None:  # noqa: F811
    async with connect(srv.url) as ws:
        first = (await ga_events(ws, body([user_message(SCRIPT)], store=False)))[-1]["response"]
        assert calls(first) == ["grep"]
        pending = [i for i in first["output"] if i["type"] == "function_call"]
        follow = messages.continuation(body([], store=False), [*outputs(pending), TRIGGER], first["id"])
        events = await ga_events(ws, follow)
        item = compaction_only(events[-1]["response"])
        # the openai SDK's lane session documents response.compaction.compacting for a compaction turn: it
        # comes once, after the item is added and before it is done, and names the item
        shown = ("response.output_item", "response.compaction")
        kinds = [e["type"] for e in events if e["type"].startswith(shown)]
        assert kinds == [
            "response.output_item.added",
            "response.compaction.compacting",
            "response.output_item.done",
        ]
        [compacting] = [e for e in events if e["type"] == "response.compaction.compacting"]
        assert (compacting["item_id"], compacting["output_index"]) == (item["id"], 0)
        assert "summary" not in compacting and "delta" not in compacting
        second = (await ga_events(ws, body([user_message(SCRIPT), item], store=False)))[-1]["response"]
    assert calls(second) == ["read_file"], second["output"]


async def test_a_longlived_create_compacts(srv: ThreadedServer) -> None:  # noqa: F811
    async with connect(srv.url + "?protocol=longlived") as ws:
        await ws.send(json.dumps(messages.create(body([user_message(SCRIPT), TRIGGER]))))
        terminal = (await until(ws, {"response.done", *TERMINAL_OR_ERROR}))[-1]
    assert terminal["type"] == "response.completed", terminal
    compaction_only(terminal["response"])


@pytest.mark.parametrize("transport", ["http", "ga", "longlived"])
async def test_a_compaction_trigger_must_come_last(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
) -> None:
    bad = body([TRIGGER, user_message("hi")])
    if transport == "http":
        reply = await http.post("/v1/responses", json=bad)
        assert reply.status_code == 400
        error = {"type": "error", "status": 400, **reply.json()}
    else:
        url = srv.url + ("?protocol=longlived" if transport == "longlived" else "")
        async with connect(url) as ws:
            error = (await ga_events(ws, bad))[-1]
    assert_error(error, "invalid_request", ("$." if transport == "longlived" else "") + "input[0]")
