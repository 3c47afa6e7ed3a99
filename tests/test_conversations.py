"""The Conversations API (docs/protocol.md, "Conversations") over a real server on loopback, on SQLite and
on PostgreSQL: every endpoint and its refusals, API-key isolation, nothing half-written, and
``conversation`` on a create over HTTP (JSON and SSE), GA WebSocket mode and the long-lived protocol; then
the real openai-agents SDK's ``OpenAIConversationsSession`` and its server-managed ``conversation_id``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from databases import Backend, PostgresServer
from helpers import MODEL, TOOLS, assert_error, auth, ga_events, running, sse_read
from openai import AsyncOpenAI
from spec import check_conversation_item, check_conversation_object, check_response
from websockets.asyncio.client import connect

from proto.client.longlived import LongLivedClient
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server (and PostgreSQL on its half)

KEY, OTHER = "sk-test-conv-alice", "sk-test-conv-mallory"
CALL = 'Look it up.\n!call grep {"q": "x"}\n!say found it\n!say as I said, found it'


class Served:
    def __init__(self, server: ThreadedServer, backend: Backend) -> None:
        self.server = server
        self.backend = backend

    def rows(self, table: str) -> int:
        return int(self.backend.query(f"SELECT COUNT(*) FROM {table}")[0][0])


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server per database for the module; each test makes its own conversations."""
    if request.param == "sqlite":
        backend = Backend("sqlite", str(Path(tmp_path_factory.mktemp("conv")) / "lab.sqlite3"))
    else:
        pg: PostgresServer = request.getfixturevalue("pg")
        backend = Backend("postgresql", pg.fresh(), pg)
    with running(db=backend.url, api_key=[KEY, OTHER]) as server:
        yield Served(server, backend)


@pytest.fixture
async def http(srv: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=srv.server.http_url, headers=auth(KEY), timeout=30) as client:
        yield client


def message(text: str, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


async def ok(reply: httpx.Response) -> Any:
    assert reply.status_code == 200, reply.text
    return reply.json()


async def new_conversation(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    conversation: dict[str, Any] = await ok(await http.post("/v1/conversations", json=body))
    check_conversation_object(conversation)
    return conversation


async def all_items(http: httpx.AsyncClient, conversation_id: str) -> list[dict[str, Any]]:
    listed = await ok(await http.get(f"/v1/conversations/{conversation_id}/items?order=asc&limit=100"))
    if listed["data"]:
        check_conversation_object(listed)
    assert not listed["has_more"]
    data: list[dict[str, Any]] = listed["data"]
    return data


def texts(items: list[dict[str, Any]]) -> list[str]:
    """Each message's text, each call's name, each output's output: the conversation at a glance."""
    shown = []
    for item in items:
        if item["type"] == "message":
            shown.append("".join(part["text"] for part in item["content"]))
        elif item["type"] == "function_call":
            shown.append(f"call {item['name']}")
        else:
            shown.append(f"{item['type']} {item.get('output')}")
    return shown


# ------------------------------------------------------------------------------------ the endpoints
async def test_create_retrieve_update_list_and_delete(http: httpx.AsyncClient, srv: Served) -> None:
    conversation = await new_conversation(
        http,
        items=[message("hello"), message("hi there", "assistant"), message("how are you?")],
        metadata={"topic": "demo"},
    )
    cid = conversation["id"]
    assert cid.startswith("conv_") and conversation["metadata"] == {"topic": "demo"}
    assert await ok(await http.get(f"/v1/conversations/{cid}")) == conversation
    updated = await ok(await http.post(f"/v1/conversations/{cid}", json={"metadata": {"topic": "billing"}}))
    assert updated == {**conversation, "metadata": {"topic": "billing"}}

    items = await all_items(http, cid)
    assert texts(items) == ["hello", "hi there", "how are you?"]
    assert [item["content"][0]["type"] for item in items] == ["input_text", "output_text", "input_text"]
    assert all(item["status"] == "completed" and item["id"].startswith("msg_") for item in items)

    added = await ok(
        await http.post(f"/v1/conversations/{cid}/items", json={"items": [message("one"), message("two")]})
    )
    check_conversation_object(added)
    assert texts(added["data"]) == ["one", "two"] and added["has_more"] is False
    assert (added["first_id"], added["last_id"]) == (added["data"][0]["id"], added["data"][1]["id"])

    # Pages: desc by default, `after` an item id, `limit`, `has_more`.
    ids = [item["id"] for item in await all_items(http, cid)]
    first = await ok(await http.get(f"/v1/conversations/{cid}/items?limit=2"))
    assert [item["id"] for item in first["data"]] == ids[::-1][:2] and first["has_more"] is True
    rest = await ok(await http.get(f"/v1/conversations/{cid}/items?limit=10&after={first['last_id']}"))
    assert [item["id"] for item in rest["data"]] == ids[::-1][2:] and rest["has_more"] is False
    ascending = await ok(await http.get(f"/v1/conversations/{cid}/items?order=asc&after={ids[1]}&limit=2"))
    assert [item["id"] for item in ascending["data"]] == ids[2:4] and ascending["has_more"] is True

    one = await ok(await http.get(f"/v1/conversations/{cid}/items/{ids[3]}"))
    check_conversation_item(one)
    assert one["id"] == ids[3] and texts([one]) == ["one"]
    after_delete = await ok(await http.delete(f"/v1/conversations/{cid}/items/{ids[3]}"))
    assert after_delete == {**conversation, "metadata": {"topic": "billing"}}
    assert [item["id"] for item in await all_items(http, cid)] == ids[:3] + ids[4:]

    assert srv.backend.query("SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", (cid,)) == [
        (4,)
    ]
    deleted = await ok(await http.delete(f"/v1/conversations/{cid}"))
    check_conversation_object(deleted)
    assert deleted == {"id": cid, "object": "conversation.deleted", "deleted": True}
    for path in (f"/v1/conversations/{cid}", f"/v1/conversations/{cid}/items"):
        reply = await http.get(path)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "conversation_not_found"
    # Its items went with it.
    assert srv.backend.query("SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", (cid,)) == [
        (0,)
    ]


async def test_an_empty_conversation_and_the_sdk_calls(srv: Served) -> None:
    """The openai SDK's own calls (``client.conversations…``) parse every reply."""
    async with AsyncOpenAI(base_url=srv.server.http_url + "/v1", api_key=KEY, max_retries=0) as client:
        conversation = await client.conversations.create(items=[], metadata={"user": "u1"})
        empty = await client.conversations.items.list(conversation.id)
        assert empty.data == [] and empty.has_more is False
        added = await client.conversations.items.create(
            conversation.id, items=[{"type": "message", "role": "user", "content": "hi"}]
        )
        item = await client.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
        assert item.type == "message" and item.role == "user"
        listed = [entry.id async for entry in client.conversations.items.list(conversation.id, include=[])]
        assert listed == [item.id]
        updated = await client.conversations.update(conversation.id, metadata={"user": "u2"})
        assert updated.metadata == {"user": "u2"}
        after = await client.conversations.items.delete(item.id, conversation_id=conversation.id)
        assert after.id == conversation.id
        deleted = await client.conversations.delete(conversation.id)
        assert deleted.deleted is True and deleted.object == "conversation.deleted"


def _bad(n: int) -> list[dict[str, Any]]:
    return [message(f"m{i}") for i in range(n)]


BAD_CREATES = [
    # body, status, code, param
    (
        {"items": [message("ok"), {"type": "message", "role": "user"}]},
        400,
        "invalid_request",
        "items[1].content",
    ),
    ({"items": [message("ok"), {"type": "nonsense"}]}, 400, "invalid_request", "items[1].type"),
    ({"items": _bad(21)}, 400, "too_many_items", "items"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "object_above_max_properties", "metadata"),
    ({"metadata": {"k" * 65: "v"}}, 400, "invalid_request", "metadata"),
    ({"metadata": {"k": "v" * 513}}, 400, "string_above_max_length", "metadata.k"),
    ({"metadata": {"k": 1}}, 400, "invalid_request", "metadata.k"),
    ({"items": [{"type": "item_reference", "id": "msg_missing"}]}, 404, "item_not_found", "items[0].id"),
    (
        {"items": [dict(message("a"), id="msg_1"), dict(message("b"), id="msg_1")]},
        400,
        "invalid_request",
        "items[1].id",
    ),
    ({"unknown": 1}, 400, "invalid_request", "unknown"),
]


@pytest.mark.parametrize(("body", "status", "code", "param"), BAD_CREATES)
async def test_a_refused_create_writes_nothing(
    http: httpx.AsyncClient, srv: Served, body: dict[str, Any], status: int, code: str, param: str
) -> None:
    before = (srv.rows("conversations"), srv.rows("conversation_items"))
    reply = await http.post("/v1/conversations", json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error"), error
    assert (srv.rows("conversations"), srv.rows("conversation_items")) == before


async def test_bad_input_on_every_endpoint(http: httpx.AsyncClient, srv: Served) -> None:
    cid = (await new_conversation(http, items=[message("kept")]))["id"]
    kept = await all_items(http, cid)
    base = f"/v1/conversations/{cid}"
    cases: list[tuple[str, str, Any, int, str, str | None]] = [
        ("POST", "/v1/conversations", b"{not json", 400, "invalid_json", None),
        ("GET", "/v1/conversations/conv_missing", None, 404, "conversation_not_found", "conversation_id"),
        (
            "POST",
            "/v1/conversations/conv_missing",
            {"metadata": {}},
            404,
            "conversation_not_found",
            "conversation_id",
        ),
        ("DELETE", "/v1/conversations/conv_missing", None, 404, "conversation_not_found", "conversation_id"),
        ("POST", base, {}, 400, "invalid_request", "metadata"),
        (
            "POST",
            base,
            {"metadata": {f"k{i}": "v" for i in range(17)}},
            400,
            "object_above_max_properties",
            "metadata",
        ),
        ("POST", base + "/items", {"items": _bad(21)}, 400, "too_many_items", "items"),
        (
            "POST",
            base + "/items",
            {"items": [message("a"), {"role": "user"}]},
            400,
            "invalid_request",
            "items[1].content",
        ),
        ("POST", base + "/items", {"items": [kept[0]]}, 400, "invalid_request", "items[0].id"),
        ("POST", base + "/items", {}, 400, "invalid_request", "items"),
        ("POST", base + "/items?include=nonsense", {"items": []}, 400, "invalid_request", "include[0]"),
        (
            "POST",
            "/v1/conversations/conv_missing/items",
            {"items": []},
            404,
            "conversation_not_found",
            "conversation_id",
        ),
        ("GET", base + "/items?limit=0", None, 400, "invalid_request", "limit"),
        ("GET", base + "/items?limit=101", None, 400, "invalid_request", "limit"),
        ("GET", base + "/items?limit=many", None, 400, "invalid_request", "limit"),
        ("GET", base + "/items?order=sideways", None, 400, "invalid_request", "order"),
        ("GET", base + "/items?include[]=nonsense", None, 400, "invalid_request", "include[0]"),
        ("GET", base + "/items/msg_missing", None, 404, "item_not_found", "item_id"),
        ("DELETE", base + "/items/msg_missing", None, 404, "item_not_found", "item_id"),
        (
            "GET",
            "/v1/conversations/conv_missing/items/x",
            None,
            404,
            "conversation_not_found",
            "conversation_id",
        ),
    ]
    for method, path, body, status, code, param in cases:
        content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        reply = await http.request(
            method, path, content=content, headers={"content-type": "application/json"}
        )
        assert reply.status_code == status, (method, path, reply.text)
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == (code, param), (method, path, error)
        assert error["type"] == "invalid_request_error" and error["message"], error
    assert await all_items(http, cid) == kept  # nothing refused changed it
    assert (await ok(await http.get(base)))["metadata"] == {}


async def test_another_key_finds_nothing(http: httpx.AsyncClient, srv: Served) -> None:
    conversation = await new_conversation(http, items=[message("mine")], metadata={"owner": "alice"})
    cid = conversation["id"]
    item_id = (await all_items(http, cid))[0]["id"]
    async with httpx.AsyncClient(base_url=srv.server.http_url, headers=auth(OTHER), timeout=30) as other:
        for method, path, body in [
            ("GET", f"/v1/conversations/{cid}", None),
            ("POST", f"/v1/conversations/{cid}", {"metadata": {"owner": "mallory"}}),
            ("DELETE", f"/v1/conversations/{cid}", None),
            ("GET", f"/v1/conversations/{cid}/items", None),
            ("POST", f"/v1/conversations/{cid}/items", {"items": [message("theirs")]}),
            ("GET", f"/v1/conversations/{cid}/items/{item_id}", None),
            ("DELETE", f"/v1/conversations/{cid}/items/{item_id}", None),
            ("POST", "/v1/responses", {"model": MODEL, "input": "!say hi", "conversation": cid}),
            (
                "POST",
                "/v1/responses/input_tokens",
                {"model": MODEL, "input": "x", "conversation": {"id": cid}},
            ),
        ]:
            reply = await other.request(method, path, json=body)
            assert reply.status_code == 404, (method, path, reply.text)
            assert reply.json()["error"]["code"] == "conversation_not_found", reply.text
    assert await ok(await http.get(f"/v1/conversations/{cid}")) == conversation
    assert texts(await all_items(http, cid)) == ["mine"]
    unauthenticated = await http.get(f"/v1/conversations/{cid}", headers={"authorization": ""})
    assert unauthenticated.status_code == 401


# ------------------------------------------------------------------------------- `conversation` on a create
async def test_two_creates_in_a_conversation_the_second_sees_the_first(http: httpx.AsyncClient) -> None:
    cid = (await new_conversation(http))["id"]
    first = await ok(
        await http.post(
            "/v1/responses", json={"model": MODEL, "input": "Hi.\n!say one\n!say two", "conversation": cid}
        )
    )
    check_response(first)
    assert first["conversation"] == {"id": cid} and first["output"][0]["content"][0]["text"] == "one"
    assert texts(await all_items(http, cid)) == ["Hi.\n!say one\n!say two", "one"]

    second_body = {"model": MODEL, "input": "And?", "conversation": {"id": cid}, "stream": True}
    counted = await ok(await http.post("/v1/responses/input_tokens", json=second_body))
    events: list[dict[str, Any]] = []
    async with http.stream("POST", "/v1/responses", json=second_body) as reply:
        assert reply.status_code == 200
        await sse_read(reply.aiter_lines(), events)
    second = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    check_response(second)
    # The script's second line: the model saw the first exchange before this input.
    assert second["output"][0]["content"][0]["text"] == "two" and second["conversation"] == {"id": cid}
    items = await all_items(http, cid)
    assert texts(items) == ["Hi.\n!say one\n!say two", "one", "And?", "two"]
    assert items[3]["id"] == second["output"][0]["id"]  # output items keep their ids

    # Usage counts the conversation's items: exactly what the same context sent in full costs.
    assert second["usage"]["input_tokens"] == counted["input_tokens"] > first["usage"]["input_tokens"]
    stateless = [
        {k: v for k, v in item.items() if k != "id"} for item in items[:3]
    ]  # the same three items, by value
    full = await ok(await http.post("/v1/responses/input_tokens", json={"model": MODEL, "input": stateless}))
    assert full["input_tokens"] == second["usage"]["input_tokens"]
    stored = await ok(await http.get(f"/v1/responses/{second['id']}"))
    assert stored["conversation"] == {"id": cid}
    inputs = await ok(await http.get(f"/v1/responses/{second['id']}/input_items"))
    assert [item["id"] for item in inputs["data"]] == [items[2]["id"]]  # its own input, one id in both


async def test_a_tool_call_answered_in_the_conversation(http: httpx.AsyncClient) -> None:
    cid = (await new_conversation(http, items=[message(CALL)]))["id"]
    body = {"model": MODEL, "tools": TOOLS, "conversation": cid, "store": False}
    first = await ok(await http.post("/v1/responses", json={**body, "input": []}))
    call = first["output"][0]
    assert call["type"] == "function_call" and call["name"] == "grep"
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "x.py:1"}
    second = await ok(await http.post("/v1/responses", json={**body, "input": [answer]}))
    assert second["output"][0]["content"][0]["text"] == "found it"
    items = await all_items(http, cid)
    assert texts(items) == [CALL, "call grep", "function_call_output x.py:1", "found it"]
    # store: false keeps no response, and the conversation still has the items (it is the store asked for).
    assert (await http.get(f"/v1/responses/{second['id']}")).status_code == 404
    # An output answering no call of the conversation is refused before anything runs.
    stray = {"type": "function_call_output", "call_id": "call_nowhere", "output": "?"}
    refused = await http.post("/v1/responses", json={**body, "input": [stray]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unknown_call_id"
    assert len(await all_items(http, cid)) == 4


async def test_create_refusals_with_a_conversation(http: httpx.AsyncClient) -> None:
    cid = (await new_conversation(http, items=[message("keep")]))["id"]
    kept = await all_items(http, cid)
    previous = await ok(await http.post("/v1/responses", json={"model": MODEL, "input": "!say x"}))
    cases = [
        (
            {"conversation": cid, "previous_response_id": previous["id"]},
            400,
            "invalid_request",
            "conversation",
        ),
        ({"conversation": "conv_missing"}, 404, "conversation_not_found", "conversation"),
        ({"conversation": cid, "input": [kept[0]]}, 400, "invalid_request", "input[0].id"),
        ({"conversation": 7}, 400, "invalid_request", "conversation"),
    ]
    for fields, status, code, param in cases:
        for path in ("/v1/responses", "/v1/responses/input_tokens"):
            reply = await http.post(path, json={"model": MODEL, "input": "!say no", **fields})
            assert reply.status_code == status, (path, fields, reply.text)
            assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == (code, param)
    assert await all_items(http, cid) == kept


async def test_ga_websocket_creates_in_a_conversation(http: httpx.AsyncClient, srv: Served) -> None:
    cid = (await new_conversation(http, items=[message("Hi.\n!say one\n!say two")]))["id"]
    async with connect(srv.server.url, additional_headers=auth(KEY)) as ws:
        first = await ga_events(ws, {"model": MODEL, "input": [], "conversation": cid, "store": False})
        second = await ga_events(ws, {"model": MODEL, "input": "More?", "conversation": {"id": cid}})
        assert [events[-1]["type"] for events in (first, second)] == ["response.completed"] * 2
        assert second[-1]["response"]["output"][0]["content"][0]["text"] == "two"
        assert second[-1]["response"]["conversation"] == {"id": cid}
        conflict = await ga_events(
            ws, {"model": MODEL, "input": "x", "conversation": cid, "previous_response_id": "r"}
        )
        assert_error(conflict[-1], "invalid_request", "conversation")
        missing = await ga_events(ws, {"model": MODEL, "input": "x", "conversation": "conv_missing"})
        assert_error(missing[-1], "conversation_not_found", "conversation")
        again = await ga_events(ws, {"model": MODEL, "input": "Last?", "conversation": cid})
        assert again[-1]["type"] == "response.completed"  # the connection serves on
    assert texts(await all_items(http, cid)) == [
        "Hi.\n!say one\n!say two",
        "one",
        "More?",
        "two",
        "Last?",
        "Done.",
    ]


async def test_a_long_lived_response_in_a_conversation(http: httpx.AsyncClient, srv: Served) -> None:
    cid = (await new_conversation(http, items=[message(CALL)]))["id"]

    async def grep(args: dict[str, object]) -> str:
        return "x.py:1"

    url = srv.server.url + "?protocol=longlived"
    async with LongLivedClient(url, api_key=KEY) as client:
        result = await client.rollout(
            {"model": MODEL, "input": "Go.", "tools": TOOLS, "conversation": cid}, {"grep": grep}
        )
    assert result.response["status"] == "completed" and result.response["conversation"] == {"id": cid}
    # The whole response joined: its input, the call, the appended output, the answer, in that order.
    assert texts(await all_items(http, cid)) == [
        CALL,
        "Go.",
        "call grep",
        "function_call_output x.py:1",
        "found it",
    ]


# ------------------------------------------------------------------------------------ the agents SDK
def _agent(calls: list[str]) -> Any:
    import agents

    @agents.function_tool
    def grep(q: str) -> str:
        calls.append(q)
        return "x.py:1"

    return agents.Agent(name="finder", instructions="Be brief.", tools=[grep], model=MODEL)


@pytest.mark.parametrize("managed", [False, True], ids=["session", "conversation_id"])
async def test_agents_sdk_remembers_across_runs(http: httpx.AsyncClient, srv: Served, managed: bool) -> None:
    """``OpenAIConversationsSession`` (the SDK reads and adds the conversation's items itself) and a
    server-managed ``conversation_id`` (every create names the conversation): either way the second
    run's model sees the first run, tool call included, and says the script's third line."""
    import agents
    from agents.models.openai_provider import OpenAIProvider

    agents.set_tracing_disabled(True)  # no trace export: nothing leaves loopback
    client = AsyncOpenAI(base_url=srv.server.http_url + "/v1", api_key=KEY, max_retries=0)
    provider = OpenAIProvider(openai_client=client, use_responses=True)
    config = agents.RunConfig(model_provider=provider, tracing_disabled=True)
    calls: list[str] = []
    agent = _agent(calls)
    try:
        if managed:
            cid = (await client.conversations.create()).id
            first = await agents.Runner.run(agent, CALL, run_config=config, conversation_id=cid)
            second = await agents.Runner.run(
                agent, "What did you find?", run_config=config, conversation_id=cid
            )
        else:
            session = agents.OpenAIConversationsSession(openai_client=client)
            first = await agents.Runner.run(agent, CALL, run_config=config, session=session)
            second = await agents.Runner.run(agent, "What did you find?", run_config=config, session=session)
            cid = session.session_id
    finally:
        await provider.aclose()
        await client.close()
    assert calls == ["x"]
    assert first.final_output == "found it"
    assert second.final_output == "as I said, found it"
    items = await all_items(http, cid)
    assert texts(items) == [
        CALL,
        "call grep",
        "function_call_output x.py:1",
        "found it",
        "What did you find?",
        "as I said, found it",
    ]


async def test_concurrent_adds_never_interleave(http: httpx.AsyncClient) -> None:
    """Each add takes the conversation's row first: ten adds at once land as ten whole pairs."""
    import asyncio

    cid = (await new_conversation(http))["id"]

    async def add(n: int) -> None:
        pair = {"items": [message(f"{n}a"), message(f"{n}b")]}
        await ok(await http.post(f"/v1/conversations/{cid}/items", json=pair))

    await asyncio.gather(*(add(n) for n in range(10)))
    shown = texts(await all_items(http, cid))
    assert sorted(shown) == sorted(f"{n}{half}" for n in range(10) for half in "ab")
    assert all(shown[i][:-1] == shown[i + 1][:-1] for i in range(0, 20, 2)), shown
