"""The bad-input matrix (docs/operations.md, "Bad input") over a real server: one test per case, in the
long-lived
protocol, GA WebSocket mode and HTTP.

Each case checks the typed error (docs/protocol.md, "Error codes"; its registered status and type, a ``param``
naming the
field), that the connection stays open where the protocol allows, and that a valid rollout then
succeeds on the same connection. Where the protocol does not allow it (a frame past the limit: 1009,
invalid UTF-8 in a text frame: 1007), the close code is checked and a new connection must serve.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from helpers import (
    MODEL,
    TOOLS,
    assert_error,
    create,
    ga_rollout_ok,
    http_rollout_ok,
    longlived_rollout_ok,
    output,
    outputs,
    recv,
    running,
    until,
)
from raw_socket import raw_invalid_utf8_close_code
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from proto.core.errors import ERROR_CODES
from proto.core.events import TERMINAL_TYPES
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server or a process

MAX_FRAME = 2**20  # the module's server: small enough to cross cheaply, large enough for a big message
MAX_TOOLS = 8
MAX_ITEMS = 16
LONG_TURN = "!tokens 4000 !say long"  # about a second of decode at 4000 tokens/s: "while it runs"
NESTED = "[" * 100_000 + "]" * 100_000  # far past msgspec's nesting limit, well within the frame limit
# In a JSON schema (typed ``Any``), so the typed decoder itself must descend, not stop at a wrong type.
NESTED_EVENT = (
    f'{{"type": "response.create", "model": "{MODEL}", '
    f'"text": {{"format": {{"type": "json_schema", "name": "x", "schema": {{"a": {NESTED}}}}}}}}}'
)
LONG_ID = "call_" + "x" * 60  # 65 characters: one past OpenAI's limit on a call_id, a cache key, a user id
Ctx = dict[str, Any]
# Integers past their documented range (OpenAI's codes: docs/protocol.md, "Error codes"): top_logprobs is
# 0..20, max_tool_calls at least 1, and every integer of a request an int64.
OUT_OF_RANGE = [
    ("top_logprobs", "negative", -1, "integer_below_min_value"),
    ("top_logprobs", "above_20", 21, "integer_above_max_value"),
    ("top_logprobs", "past_int64", 2**64, "integer_above_max_value"),
    ("max_tool_calls", "zero", 0, "integer_below_min_value"),
    ("max_tool_calls", "negative", -1, "integer_below_min_value"),
    ("max_tool_calls", "past_int64", 2**64, "integer_above_max_value"),
]
CITE = {"type": "url_citation", "url": "https://x.test", "title": "x", "start_index": 0, "end_index": 2**63}
# An integer nested in a tool and in an item, past int64 (the field, its value, the param it is named by).
INT64_PAST = [
    (
        "tool",
        {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"], "max_num_results": 2**64}]},
        "tools[0].max_num_results",
    ),
    (
        "item",
        {
            "input": [
                {
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "hi", "annotations": [CITE]}],
                }
            ]
        },
        "input[0].content[0].annotations[0].end_index",
    ),
]
IMAGELESS = {"role": "user", "content": [{"type": "input_image", "detail": "low"}]}  # neither url nor file


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running(max_frame_bytes=MAX_FRAME, max_tools=MAX_TOOLS, max_input_items=MAX_ITEMS) as server:
        yield server


@pytest.fixture
async def http(srv: ThreadedServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as client:
        yield client


def ll_url(srv: ThreadedServer) -> str:
    return srv.url + "?protocol=longlived"


def dumps(value: Any) -> str:
    return json.dumps(value)


def with_(**fields: Any) -> str:
    return dumps(create(**fields))


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "grep", "arguments": "{}"}


def many_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "name": f"tool_{i}"} for i in range(MAX_TOOLS + 1)]


def append(items: list[dict[str, Any]], **fields: Any) -> str:
    return dumps({"type": "response.append", "input": items, **fields})


def pending(ctx: Ctx, index: int) -> str:
    return str(ctx["done"]["pending_calls"][index]["call_id"])


# ------------------------------------------------------------------------------------ long-lived
@dataclass(frozen=True)
class LLCase:
    id: str
    frames: Callable[[Ctx], list[str | bytes]]  # the last one is refused; any before it are valid
    code: str
    param: str | None
    setup: str = "idle"  # idle | ended | suspended | second (one ended, one suspended) | running
    answered: int = 0  # pending calls the frames answered validly before the refused one
    reply: str = "error"  # the refusal's event type (response.inject answers with its own)


def one(frame: str | bytes) -> Callable[[Ctx], list[str | bytes]]:
    return lambda ctx: [frame]


LL_CASES = [
    LLCase("not_json", one("{oops"), "invalid_json", None),
    LLCase("empty_frame", one(""), "invalid_json", None),
    LLCase("json_array", one("[1, 2]"), "invalid_event", None),
    LLCase("json_string", one('"response.create"'), "invalid_event", None),
    LLCase("json_null", one("null"), "invalid_event", None),
    LLCase("binary_frame", one(b'{"type": "response.create"}'), "binary_frame_not_supported", None),
    LLCase("unknown_type", one('{"type": "response.frobnicate"}'), "unknown_event_type", "$.type"),
    LLCase("server_event_type", one('{"type": "response.done"}'), "unknown_event_type", "$.type"),
    LLCase("missing_type", one(dumps({"model": MODEL, "input": "hi"})), "invalid_event", "$.type"),
    LLCase("type_not_string", one('{"type": 7}'), "invalid_event", "$.type"),
    LLCase(
        "create_missing_model",
        one('{"type": "response.create", "input": "hi"}'),
        "invalid_request",
        "$.model",
    ),
    LLCase("create_model_null", one(with_(model=None)), "invalid_request", "$.model"),
    LLCase("create_input_ill_typed", one(with_(input=5)), "invalid_request", "$.input"),
    # The SDK types call_id optional: an output without one is well-formed and answers no call.
    LLCase(
        "create_item_missing_call_id",
        one(with_(input=[{"type": "function_call_output", "output": "x"}])),
        "unknown_call_id",
        "$.input[0].call_id",
    ),
    LLCase(
        "create_item_missing_output",
        one(with_(input=[{"type": "function_call_output", "call_id": "c"}])),
        "invalid_request",
        "$.input[0].output",
    ),
    LLCase(
        "create_item_unknown_type",
        one(with_(input=[{"type": "frobnicate"}])),
        "invalid_request",
        "$.input[0].type",
    ),
    LLCase(
        "create_tool_missing_name",
        one(with_(tools=[{"type": "function"}])),
        "invalid_request",
        "$.tools[0].name",
    ),
    LLCase("create_tools_not_a_list", one(with_(tools=5)), "invalid_request", "$.tools"),
    LLCase("unknown_model", one(with_(model="gpt-nope")), "model_not_found", "$.model"),
    LLCase("too_many_tools", one(with_(tools=many_tools())), "too_many_tools", "$.tools"),
    LLCase(
        "prompt_cache_key_too_long",
        one(with_(prompt_cache_key=LONG_ID)),
        "string_above_max_length",
        "$.prompt_cache_key",
    ),
    LLCase(
        "safety_identifier_too_long",
        one(with_(safety_identifier=LONG_ID)),
        "string_above_max_length",
        "$.safety_identifier",
    ),
    LLCase(
        "metadata_too_many_pairs",
        one(with_(metadata={f"k{i}": "v" for i in range(17)})),
        "object_above_max_properties",
        "$.metadata",
    ),
    LLCase(
        "tool_name_off_pattern",
        one(with_(tools=[{"type": "function", "name": "read.file", "parameters": {}}])),
        "invalid_value",
        "$.tools[0].name",
    ),
    LLCase(
        "create_call_id_empty",
        one(with_(input=[user("hi"), output("", "x")])),
        "empty_string",
        "$.input[1].call_id",
    ),
    LLCase(
        "create_call_id_too_long",
        one(with_(input=[{"type": "function_call", "call_id": LONG_ID, "name": "grep", "arguments": "{}"}])),
        "string_above_max_length",
        "$.input[0].call_id",
    ),
    LLCase("too_many_items", one(with_(input=[user("hi")] * (MAX_ITEMS + 1))), "too_many_items", "$.input"),
    LLCase(
        "create_output_unknown_call_id",
        one(with_(input=[user("hi"), output("call_nope", "x")])),
        "unknown_call_id",
        "$.input[1].call_id",
    ),
    LLCase(
        "max_output_tokens_overflow",
        one(with_(max_output_tokens=10**40)),
        "integer_above_max_value",
        "$.max_output_tokens",
    ),
    LLCase(
        "max_output_tokens_negative",
        one(with_(max_output_tokens=-1)),
        "integer_below_min_value",
        "$.max_output_tokens",
    ),
    LLCase(
        "max_output_tokens_float",
        one(with_(max_output_tokens=123456789).replace("123456789", "1e400")),
        "invalid_request",
        "$.max_output_tokens",
    ),
    *(
        LLCase(f"{field}_{name}", one(with_(**{field: value})), code, f"$.{field}")
        for field, name, value, code in OUT_OF_RANGE
    ),
    *(
        LLCase(f"int64_{name}", one(with_(**fields)), "integer_above_max_value", f"$.{param}")
        for name, fields, param in INT64_PAST
    ),
    LLCase("image_without_source", one(with_(input=[IMAGELESS])), "invalid_request", "$.input[0].content[0]"),
    LLCase("temperature_out_of_range", one(with_(temperature=3.5)), "invalid_request", "$.temperature"),
    LLCase("temperature_ill_typed", one(with_(temperature="hot")), "invalid_request", "$.temperature"),
    LLCase("deeply_nested", one(NESTED_EVENT), "invalid_json", None),
    LLCase("lone_surrogate", one(with_(input=[user("\ud800")])), "invalid_json", None),
    LLCase("append_no_open_response", one(append([output("call_x", "x")])), "no_open_response", None),
    # The event is checked on its own before the state (docs/protocol.md, "Append rules"): the same error
    # whenever it lands.
    *(
        LLCase(f"append_empty_{setup}", one(append([])), "empty_array", "$.input", setup=setup)
        for setup in ("idle", "ended", "suspended", "running")
    ),
    LLCase(
        "append_malformed_item_after_end",
        one(append([{"type": "function_call_output", "call_id": "c"}])),
        "invalid_request",
        "$.input[0].output",
        setup="ended",
    ),
    LLCase(
        "inject_empty_after_end",
        lambda c: [dumps({"type": "response.inject", "response_id": c["last_id"], "input": []})],
        "empty_array",
        None,
        setup="ended",
        reply="response.inject.failed",
    ),
    LLCase("cancel_no_open_response", one('{"type": "response.cancel"}'), "no_open_response", None),
    LLCase(
        "cancel_unknown_response",
        one('{"type": "response.cancel", "response_id": "resp_nope"}'),
        "response_not_found",
        "$.response_id",
    ),
    LLCase(
        "append_after_end",
        one(append([output("call_x", "x")])),
        "response_already_completed",
        None,
        setup="ended",
    ),
    LLCase(
        "cancel_after_end",
        one('{"type": "response.cancel"}'),
        "response_already_completed",
        None,
        setup="ended",
    ),
    # (a create while suspended supersedes the open response: tests/test_codex_v1.py)
    LLCase(
        "create_while_suspended_invalid",
        one(with_(model="gpt-nope")),
        "model_not_found",
        "$.model",
        setup="suspended",
    ),
    LLCase("create_while_running", one(with_()), "response_in_progress", None, setup="running"),
    LLCase(
        "append_call_id_too_long",
        one(append([output(LONG_ID, "x")])),
        "string_above_max_length",
        "$.input[0].call_id",
        setup="suspended",
    ),
    LLCase(
        "append_unknown_call_id",
        one(append([output("call_nope", "x")])),
        "unknown_call_id",
        "$.input[0].call_id",
        setup="suspended",
    ),
    LLCase(
        "output_not_yet_pending",
        one(append([output("call_future", "x")])),
        "unknown_call_id",
        "$.input[0].call_id",
        setup="running",
    ),
    LLCase(
        "duplicate_in_one_append",
        lambda c: [append([output(pending(c, 0), "x"), output(pending(c, 0), "x")])],
        "duplicate_call_output",
        "$.input[1].call_id",
        setup="suspended",
    ),
    LLCase(
        "duplicate_across_appends",
        lambda c: [append([output(pending(c, 0), "x")]), append([output(pending(c, 0), "x")])],
        "duplicate_call_output",
        "$.input[0].call_id",
        setup="suspended",
        answered=1,
    ),
    LLCase(
        "append_wrong_response_id",
        one(append([output("call_x", "x")], response_id="resp_nope")),
        "response_not_found",
        "$.response_id",
        setup="suspended",
    ),
    LLCase(
        "append_to_previous_response",
        lambda c: [append([output(pending(c, 0), "x")], response_id=c["last_id"])],
        "response_already_completed",
        "$.response_id",
        setup="second",
    ),
    LLCase(
        "append_assistant_message",
        one(append([{"role": "assistant", "content": "I said"}])),
        "invalid_request",
        "$.input[0].role",
        setup="suspended",
    ),
    LLCase(
        "append_function_call_item",
        one(append([call("call_mine")])),
        "unknown_call_id",
        "$.input[0].call_id",
        setup="suspended",
    ),
    LLCase(
        "append_reasoning_item",
        one(append([{"type": "reasoning", "id": "rs_1", "summary": []}])),
        "invalid_request",
        "$.input[0].type",
        setup="suspended",
    ),
    LLCase(
        "append_input_not_a_list",
        one('{"type": "response.append", "input": "hi"}'),
        "invalid_event",
        "$.input",
        setup="suspended",
    ),
    LLCase(
        "append_missing_input",
        one('{"type": "response.append"}'),
        "invalid_event",
        "$.input",
        setup="suspended",
    ),
    LLCase(
        "append_too_many_items",
        one(append([user("more")] * (MAX_ITEMS + 1))),
        "too_many_items",
        "$.input",
        setup="suspended",
    ),
    LLCase(
        "cancel_wrong_response_id",
        one('{"type": "response.cancel", "response_id": "resp_nope"}'),
        "response_not_found",
        "$.response_id",
        setup="suspended",
    ),
    LLCase(
        "inject_unknown_response",
        one(dumps({"type": "response.inject", "response_id": "resp_nope", "input": [user("hi")]})),
        "response_not_found",
        None,
        setup="suspended",
        reply="response.inject.failed",
    ),
]


async def ll_setup(ws: ClientConnection, setup: str) -> Ctx:
    ctx: Ctx = {}
    if setup in ("ended", "second"):
        ctx["last_id"] = (await longlived_rollout_ok(ws))["id"]
    if setup in ("suspended", "second"):
        await ws.send(dumps(create()))
        ctx["done"] = (await until(ws, {"response.done", *TERMINAL_TYPES}))[-1]
        assert ctx["done"]["type"] == "response.done"
    if setup == "running":
        await ws.send(dumps(create(LONG_TURN)))
        await until(ws, {"response.output_text.delta"})  # it streams: the refused frame lands mid-turn
    return ctx


async def ll_finish(ws: ClientConnection, case: LLCase, ctx: Ctx) -> None:
    """Bring the open response to its end: the refused frame changed nothing, so the calls it left
    pending are still answerable (suspended) and a running response still cancels."""
    if case.setup in ("suspended", "second"):
        calls = ctx["done"]["pending_calls"][case.answered :]
        await ws.send(append(outputs(calls)))
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.completed", terminal
    elif case.setup == "running":
        await ws.send('{"type": "response.cancel"}')
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.incomplete" and terminal["response"]["status"] == "cancelled", (
            terminal
        )


@pytest.mark.parametrize("case", LL_CASES, ids=[case.id for case in LL_CASES])
async def test_longlived(srv: ThreadedServer, case: LLCase) -> None:
    async with connect(ll_url(srv), max_size=None) as ws:
        ctx = await ll_setup(ws, case.setup)
        for frame in case.frames(ctx):
            await ws.send(frame)
        reply = (await until(ws, {"error", "response.inject.failed"}))[
            -1
        ]  # a running response's deltas may come first
        if case.reply == "error":
            assert_error(reply, case.code, case.param)
        else:
            assert (reply["type"], reply["code"]) == (case.reply, case.code), reply
        await ll_finish(ws, case, ctx)
        await longlived_rollout_ok(ws)


async def test_longlived_huge_string_within_the_limit_works(srv: ThreadedServer) -> None:
    big = "lorem ipsum " * (MAX_FRAME // 2 // 12)  # half the frame limit
    async with connect(ll_url(srv), max_size=None) as ws:
        await ws.send(dumps(create("!say short\n" + big)))
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.completed", terminal
        await longlived_rollout_ok(ws)


async def test_longlived_oversized_frame_closes_1009(srv: ThreadedServer) -> None:
    await _oversized_closes_1009(ll_url(srv))
    async with connect(ll_url(srv), max_size=None) as ws:  # the server serves on
        await longlived_rollout_ok(ws)


async def test_longlived_invalid_utf8_fails_the_connection(srv: ThreadedServer) -> None:
    # wsproto rejects the frame; LabWSProtocol sends the 1007 close frame uvicorn itself would not.
    assert await asyncio.to_thread(raw_invalid_utf8_close_code, ll_url(srv)) == 1007
    async with connect(ll_url(srv), max_size=None) as ws:
        await longlived_rollout_ok(ws)


async def _oversized_closes_1009(url: str) -> None:
    async with connect(url, max_size=None) as ws:
        await ws.send(dumps(create("x" * (MAX_FRAME + 1))))
        assert_error(await recv(ws), "message_too_large", None)  # the typed error first, then the close
        with pytest.raises(ConnectionClosed) as closed:
            await recv(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


# ------------------------------------------------------------------------------------ GA WebSocket
@dataclass(frozen=True)
class GACase:
    id: str
    frame: str | bytes
    code: str
    param: str | None
    setup: str = "idle"  # idle | running (a long response in flight) | after (one rollout done)


def ga(**fields: Any) -> str:
    return with_(store=False, **fields)


GA_CASES = [
    GACase("not_json", "{oops", "invalid_json", None),
    GACase("json_array", "[1, 2]", "invalid_event", None),
    GACase("binary_frame", b'{"type": "response.create"}', "binary_frame_not_supported", None),
    GACase("unknown_type", '{"type": "response.frobnicate"}', "unknown_event_type", "type"),
    GACase("longlived_event", append([output("call_x", "x")]), "unknown_event_type", "type"),
    GACase("missing_model", '{"type": "response.create", "input": "hi"}', "invalid_request", "model"),
    GACase("model_ill_typed", ga(model=5), "invalid_request", "model"),
    GACase("unknown_model", ga(model="gpt-nope"), "model_not_found", "model"),
    GACase("too_many_tools", ga(tools=many_tools()), "too_many_tools", "tools"),
    GACase(
        "prompt_cache_key_too_long",
        ga(prompt_cache_key=LONG_ID),
        "string_above_max_length",
        "prompt_cache_key",
    ),
    GACase(
        "metadata_value_too_long",
        ga(metadata={"k": "v" * 513}),
        "string_above_max_length",
        "metadata.k",
    ),
    GACase(
        "tool_name_off_pattern",
        ga(tools=[{"type": "function", "name": "read.file", "parameters": {}}]),
        "invalid_value",
        "tools[0].name",
    ),
    GACase("output_call_id_empty", ga(input=[output("", "x")]), "empty_string", "input[0].call_id"),
    GACase(
        "output_call_id_too_long",
        ga(input=[output(LONG_ID, "x")]),
        "string_above_max_length",
        "input[0].call_id",
    ),
    GACase("too_many_items", ga(input=[user("hi")] * (MAX_ITEMS + 1)), "too_many_items", "input"),
    GACase(
        "item_missing_call_id",
        ga(input=[{"type": "function_call_output", "output": "x"}]),
        "unknown_call_id",
        "input[0].call_id",
    ),
    GACase(
        "item_missing_output",
        ga(input=[{"type": "function_call_output", "call_id": "c"}]),
        "invalid_request",
        "input[0].output",
    ),
    GACase("undocumented_tool_type", ga(tools=[{"type": "frobnicate"}]), "invalid_request", "tools[0].type"),
    GACase(
        "unknown_call_id",
        ga(input=[user("hi"), output("call_nope", "x")]),
        "unknown_call_id",
        "input[1].call_id",
    ),
    GACase(
        "duplicate_call_output",
        ga(input=[user("hi"), call("call_1"), output("call_1", "x"), output("call_1", "x")]),
        "duplicate_call_output",
        "input[3].call_id",
    ),
    GACase(
        "previous_response_not_found",
        ga(previous_response_id="resp_nope", input=[user("hi")]),
        "previous_response_not_found",
        "previous_response_id",
    ),
    GACase(
        "max_output_tokens_overflow",
        ga(max_output_tokens=10**40),
        "integer_above_max_value",
        "max_output_tokens",
    ),
    *(
        GACase(f"{field}_{name}", ga(**{field: value}), code, field)
        for field, name, value, code in OUT_OF_RANGE
    ),
    *(
        GACase(f"int64_{name}", ga(**fields), "integer_above_max_value", param)
        for name, fields, param in INT64_PAST
    ),
    GACase("image_without_source", ga(input=[IMAGELESS]), "invalid_request", "input[0].content[0]"),
    GACase(
        "max_output_tokens_below_16",
        ga(max_output_tokens=15),
        "integer_below_min_value",
        "max_output_tokens",
    ),
    GACase("top_p_out_of_range", ga(top_p=-0.5), "invalid_request", "top_p"),
    GACase("deeply_nested", NESTED_EVENT, "invalid_json", None),
    GACase("lone_surrogate", ga(input=[user("\udc00 alone")]), "invalid_json", None),
    GACase("create_while_in_flight", ga(), "response_in_progress", None, setup="running"),
    GACase(
        "continue_unknown_call_after_rollout",
        ga(previous_response_id="", input=[output("call_nope", "x")]),
        "unknown_call_id",
        "input[0].call_id",
        setup="after",
    ),
]


@pytest.mark.parametrize("case", GA_CASES, ids=[case.id for case in GA_CASES])
async def test_ga(srv: ThreadedServer, case: GACase) -> None:
    async with connect(srv.url, max_size=None) as ws:
        frame = case.frame
        if case.setup == "running":
            await ws.send(ga(input=[user(LONG_TURN)]))
            await until(ws, {"response.output_text.delta"})
        elif case.setup == "after":
            await ws.send(ga(input=[user("!say first")]))
            first = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
            assert first["type"] == "response.completed"
            frame = ga(previous_response_id=first["response"]["id"], input=[output("call_nope", "x")])
        await ws.send(frame)
        reply = (await until(ws, {"error"}))[-1]
        assert_error(reply, case.code, case.param)
        if case.setup == "running":  # the response in flight was not disturbed
            terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
            assert terminal["type"] == "response.completed", terminal
        await ga_rollout_ok(ws)


async def test_ga_huge_string_within_the_limit_works(srv: ThreadedServer) -> None:
    big = "lorem ipsum " * (MAX_FRAME // 2 // 12)
    async with connect(srv.url, max_size=None) as ws:
        await ws.send(ga(input=[user("!say short\n" + big)]))
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.completed", terminal
        await ga_rollout_ok(ws)


async def test_ga_oversized_frame_closes_1009(srv: ThreadedServer) -> None:
    await _oversized_closes_1009(srv.url)
    async with connect(srv.url, max_size=None) as ws:
        await ga_rollout_ok(ws)


async def test_ga_invalid_utf8_fails_the_connection(srv: ThreadedServer) -> None:
    assert await asyncio.to_thread(raw_invalid_utf8_close_code, srv.url) == 1007  # as in long-lived
    async with connect(srv.url, max_size=None) as ws:
        await ga_rollout_ok(ws)


# ------------------------------------------------------------------------------------ HTTP
@dataclass(frozen=True)
class HTTPCase:
    id: str
    body: bytes
    code: str
    param: str | None


def body(**fields: Any) -> bytes:
    value = {"model": MODEL, "input": [user("!say hi")], "tools": TOOLS, **fields}
    return json.dumps(value).encode()


HTTP_CASES = [
    HTTPCase("not_json", b"{oops", "invalid_json", None),
    HTTPCase("empty_body", b"", "invalid_json", None),
    HTTPCase("json_array", b"[1, 2]", "invalid_request", None),
    HTTPCase("missing_model", b'{"input": "hi"}', "invalid_request", "model"),
    HTTPCase("model_ill_typed", body(model=["a"]), "invalid_request", "model"),
    HTTPCase("unknown_model", body(model="gpt-nope"), "model_not_found", "model"),
    HTTPCase("too_many_tools", body(tools=many_tools()), "too_many_tools", "tools"),
    HTTPCase(
        "prompt_cache_key_too_long",
        body(prompt_cache_key=LONG_ID),
        "string_above_max_length",
        "prompt_cache_key",
    ),
    HTTPCase(
        "safety_identifier_too_long",
        body(safety_identifier=LONG_ID),
        "string_above_max_length",
        "safety_identifier",
    ),
    HTTPCase(
        "metadata_too_many_pairs",
        body(metadata={f"k{i}": "v" for i in range(17)}),
        "object_above_max_properties",
        "metadata",
    ),
    HTTPCase(
        "tool_name_off_pattern",
        body(tools=[{"type": "function", "name": "read.file", "parameters": {}}]),
        "invalid_value",
        "tools[0].name",
    ),
    HTTPCase(
        "tool_name_empty",
        body(tools=[{"type": "function", "name": "", "parameters": {}}]),
        "empty_string",
        "tools[0].name",
    ),
    HTTPCase(
        "function_call_id_empty",
        body(input=[user("hi"), {"type": "function_call", "call_id": "", "name": "grep", "arguments": "{}"}]),
        "empty_string",
        "input[1].call_id",
    ),
    HTTPCase(
        "output_call_id_too_long",
        body(input=[user("hi"), output(LONG_ID, "x")]),
        "string_above_max_length",
        "input[1].call_id",
    ),
    HTTPCase("too_many_items", body(input=[user("hi")] * (MAX_ITEMS + 1)), "too_many_items", "input"),
    HTTPCase(
        "item_missing_call_id",
        body(input=[{"type": "function_call_output", "output": "x"}]),
        "unknown_call_id",
        "input[0].call_id",
    ),
    HTTPCase(
        "item_missing_output",
        body(input=[{"type": "function_call_output", "call_id": "c"}]),
        "invalid_request",
        "input[0].output",
    ),
    HTTPCase(
        "undocumented_tool_type", body(tools=[{"type": "frobnicate"}]), "invalid_request", "tools[0].type"
    ),
    HTTPCase(
        "unknown_call_id",
        body(input=[user("hi"), output("call_nope", "x")]),
        "unknown_call_id",
        "input[1].call_id",
    ),
    HTTPCase(
        "duplicate_call_output",
        body(input=[user("hi"), call("call_1"), output("call_1", "x"), output("call_1", "x")]),
        "duplicate_call_output",
        "input[3].call_id",
    ),
    HTTPCase(
        "previous_response_not_found",
        body(previous_response_id="resp_nope"),
        "previous_response_not_found",
        "previous_response_id",
    ),
    HTTPCase(
        "max_output_tokens_overflow",
        body(max_output_tokens=10**40),
        "integer_above_max_value",
        "max_output_tokens",
    ),
    *(
        HTTPCase(f"{field}_{name}{sse}", body(**{field: value}, **stream), code, field)
        for field, name, value, code in OUT_OF_RANGE
        for sse, stream in (("", {}), ("_sse", {"stream": True}))
    ),
    *(
        HTTPCase(f"int64_{name}", body(**fields), "integer_above_max_value", param)
        for name, fields, param in INT64_PAST
    ),
    HTTPCase("image_without_source", body(input=[IMAGELESS]), "invalid_request", "input[0].content[0]"),
    HTTPCase(
        "max_output_tokens_below_16",
        body(max_output_tokens=10),
        "integer_below_min_value",
        "max_output_tokens",
    ),
    HTTPCase("temperature_out_of_range", body(temperature=2.5), "invalid_request", "temperature"),
    HTTPCase("stream_ill_typed", body(stream="yes"), "invalid_request", "stream"),
    HTTPCase("background_without_store", body(background=True, store=False), "invalid_request", "store"),
    HTTPCase(
        "deeply_nested",
        NESTED_EVENT.replace('"type": "response.create", ', "").encode(),
        "invalid_json",
        None,
    ),
    HTTPCase(
        "invalid_utf8", b'{"model": "' + MODEL.encode() + b'", "input": "\xff\xfe"}', "invalid_json", None
    ),
    HTTPCase("lone_surrogate", body(input=[user("\ud800")]), "invalid_json", None),
    HTTPCase("body_too_large", body(input=[user("x" * MAX_FRAME)]), "message_too_large", None),
]


@pytest.mark.parametrize("case", HTTP_CASES, ids=[case.id for case in HTTP_CASES])
async def test_http(http: httpx.AsyncClient, case: HTTPCase) -> None:
    reply = await http.post("/v1/responses", content=case.body, headers={"content-type": "application/json"})
    status, kind = ERROR_CODES[case.code]
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (case.code, kind, case.param), error
    await http_rollout_ok(http)


async def test_http_chunked_body_too_large(http: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no content-length: the limit is counted as it arrives
        for _ in range(3):
            yield b" " * (MAX_FRAME // 2)
        yield body()

    reply = await http.post("/v1/responses", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "message_too_large", reply.text
    await http_rollout_ok(http)


async def test_http_huge_string_within_the_limit_works(http: httpx.AsyncClient) -> None:
    big = "lorem ipsum " * (MAX_FRAME // 2 // 12)
    reply = await http.post(
        "/v1/responses",
        content=body(input=[user("!say short\n" + big)]),
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 200 and reply.json()["status"] == "completed", reply.text[:300]
    await http_rollout_ok(http)


async def test_http_input_items_limit_ill_typed(http: httpx.AsyncClient) -> None:
    reply = await http.post("/v1/responses", content=body())
    response_id = reply.json()["id"]
    bad = await http.get(f"/v1/responses/{response_id}/input_items", params={"limit": "many"})
    assert bad.status_code == 400 and (bad.json()["error"]["code"], bad.json()["error"]["param"]) == (
        "invalid_request",
        "limit",
    )
    await http_rollout_ok(http)


async def test_http_unknown_response_id(http: httpx.AsyncClient) -> None:
    reply = await http.get("/v1/responses/resp_nope")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "response_not_found"
    await http_rollout_ok(http)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"top_logprobs": 21},
            "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 "
            "instead.",
        ),
        (
            {"max_tool_calls": 0},
            "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, but got 0 "
            "instead.",
        ),
        (
            {"max_output_tokens": 15},
            "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 15 "
            "instead.",
        ),
    ],
    ids=["top_logprobs", "max_tool_calls", "max_output_tokens"],
)
async def test_a_range_refusal_reads_as_openais_on_every_transport(
    srv: ThreadedServer, http: httpx.AsyncClient, fields: dict[str, Any], message: str
) -> None:
    """OpenAI's wording, the field named as OpenAI names it, whatever the transport's ``param`` spelling."""
    reply = await http.post(
        "/v1/responses", content=body(**fields), headers={"content-type": "application/json"}
    )
    seen = [reply.json()["error"]["message"]]
    for url, frame in ((srv.url, ga(**fields)), (ll_url(srv), with_(**fields))):
        async with connect(url, max_size=None) as ws:
            await ws.send(frame)
            seen.append((await until(ws, {"error"}))[-1]["error"]["message"])
    assert seen == [message] * 3
