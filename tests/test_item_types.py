"""Every tool and input item type OpenAI documents, over a real server.

The types are the members of the SDK-generated unions (``proto.core.openai_types``, from the ``openai``
package's
``openai/types/responses``), so a type OpenAI adds shows up here. Each gets a sample: the shapes real clients
send (``REAL``: Codex's namespace and freeform ``apply_patch`` tools, ``view_image`` output with an image,
the AI SDK's item references…) and, for the rest, the smallest value the schema accepts, built from the
struct's own fields.

For each one: a request carrying it is accepted over HTTP, stored and listed back (``input_items``),
continued with ``previous_response_id`` over HTTP, over GA WebSocket mode (from the connection's cache) and
over the long-lived protocol (a create that continues the stored chain); and the tokens it adds to the
prompt (with it minus without it) are the same on every one of those paths: it is rendered and counted
alike everywhere.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import struct
import sys
import typing
import zlib
from pathlib import Path
from typing import Any

import httpx
import msgspec
import msgspec.inspect as mi
import openai
import plain_server
import pytest
import typing_extensions
from helpers import MODEL, until
from openai.types.responses.response_input_item_param import ResponseInputItemParam
from openai.types.responses.tool_param import ToolParam
from websockets.asyncio.client import connect

from proto.core import openai_types as oa
from proto.core.events import TERMINAL_TYPES
from proto.server.serve import ThreadedServer
from sampler import media

srv, http = plain_server.srv, plain_server.http  # the module's server and its httpx client (fixtures)

GENERATOR = Path(__file__).resolve().parent.parent / "scripts" / "gen_openai_types.py"
SCRIPT = "!say ok\n!say ok\n!say ok\n!say ok"  # every turn says the same, whatever the item shifts


def png(width: int, height: int) -> bytes:
    """A real PNG of that size (one grey pixel row repeated): its header is what the server reads."""
    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


IMAGE = "data:image/png;base64," + base64.b64encode(png(1024, 1024)).decode()
CALL = {"type": "function_call", "call_id": "call_fn", "name": "grep", "arguments": "{}"}
CUSTOM_CALL = {
    "type": "custom_tool_call",
    "call_id": "call_ct",
    "name": "apply_patch",
    "input": "*** Begin Patch\n*** End Patch",
}

# What real clients send (the issue lists these).
REAL_TOOLS: dict[str, dict[str, Any]] = {
    "namespace": {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn_agent",
                "description": "Spawn.",
                "strict": False,
                "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
            }
        ],
    },
    "custom": {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {
            "type": "grammar",
            "syntax": "lark",
            "definition": 'start: "*** Begin Patch" /(.|\\n)*/ "*** End Patch"',
        },
    },
    "local_shell": {"type": "local_shell"},
    "mcp": {
        "type": "mcp",
        "server_label": "deepwiki",
        "server_url": "https://mcp.deepwiki.com/mcp",
        "require_approval": "never",
    },
    "file_search": {"type": "file_search", "vector_store_ids": ["vs_1"], "max_num_results": 4},
    "image_generation": {"type": "image_generation", "quality": "low"},
    "tool_search": {"type": "tool_search"},
}
REAL_ITEMS: dict[str, list[dict[str, Any]]] = {  # the item, after any call it answers
    "reasoning": [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Thought about it."}],
            "encrypted_content": "gAAAAABopaque",
        }
    ],
    "custom_tool_call": [CUSTOM_CALL],
    "custom_tool_call_output": [
        CUSTOM_CALL,
        {"type": "custom_tool_call_output", "call_id": "call_ct", "output": "Success. Updated 1 file."},
    ],
    "function_call_output": [
        CALL,
        {
            "type": "function_call_output",
            "call_id": "call_fn",
            "output": [
                {"type": "input_text", "text": "here is the image"},
                {"type": "input_image", "image_url": IMAGE},
            ],
        },
    ],
    "local_shell_call": [
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "call_ls",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls", "-la"], "env": {}},
        }
    ],
    "compaction": [{"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque-compacted-history"}],
    "web_search_call": [
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "open_page", "url": "https://example.com/docs"},
        }
    ],
    "message": [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what is in this picture?"},
                {"type": "input_image", "image_url": IMAGE, "detail": "high"},
            ],
        }
    ],
}


# ------------------------------------------------------------------------------------ samples from the schema
def sample(t: mi.Type) -> Any:
    """The smallest JSON value of this type the schema accepts."""
    match t:
        case mi.StrType():
            return "x"
        case mi.IntType():
            return max(1, t.ge or 0)
        case mi.FloatType():
            return 0.5
        case mi.BoolType():
            return True
        case mi.NoneType():
            return None
        case mi.LiteralType():
            return t.values[0]
        case mi.ListType():
            return [sample(t.item_type)]
        case mi.DictType() | mi.AnyType():
            return {}
        case mi.StructType():
            value: dict[str, Any] = {t.tag_field: t.tag} if t.tag_field and t.tag is not None else {}
            for f in t.fields:
                if f.required:
                    value[f.encode_name] = sample(f.type)
            return value
        case mi.UnionType():
            members = [m for m in t.types if not isinstance(m, mi.NoneType)]
            return sample(members[0])
    raise TypeError(f"no sample for {t}")


def members(union: Any) -> dict[str, mi.StructType]:
    info = mi.type_info(union)
    assert isinstance(info, mi.UnionType)
    return {str(m.tag): m for m in info.types if isinstance(m, mi.StructType)}


ITEM_TYPES = members(oa.InputItem)
TOOL_TYPES = members(oa.Tool)


def item_case(kind: str) -> list[dict[str, Any]]:
    return REAL_ITEMS.get(kind) or [sample(ITEM_TYPES[kind])]


def tool_case(kind: str) -> dict[str, Any]:
    return REAL_TOOLS.get(kind) or sample(TOOL_TYPES[kind])


def sdk_tags(union: Any) -> set[str]:
    """The ``type`` values of the SDK union's members (TypedDicts)."""
    tags: set[str] = set()
    for member in typing.get_args(union):
        hint = typing_extensions.get_type_hints(member).get("type")
        tags.update(v for v in typing.get_args(hint) if isinstance(v, str))
        tags.update(v for arg in typing.get_args(hint) for v in typing.get_args(arg) if isinstance(v, str))
    return tags


def test_every_sdk_type_is_a_member() -> None:
    """Every item and tool type the installed SDK spells out decodes here (a type OpenAI adds fails this)."""
    assert sdk_tags(ResponseInputItemParam) - set(ITEM_TYPES) == set()
    assert sdk_tags(ToolParam) - set(TOOL_TYPES) == set()
    assert len(ITEM_TYPES) >= 30 and len(TOOL_TYPES) >= 15
    assert set(REAL_ITEMS) <= set(ITEM_TYPES) and set(REAL_TOOLS) <= set(TOOL_TYPES)


def test_generated_schema_is_current() -> None:
    """proto/core/openai_types.py is what scripts/gen_openai_types.py makes from the SDK it names."""
    if openai.__version__ != oa.SDK_VERSION:
        pytest.fail(
            f"proto/core/openai_types.py was generated from openai {oa.SDK_VERSION}, {openai.__version__} is "
            f"installed: "
            "run scripts/gen_openai_types.py and review the diff"
        )
    spec = importlib.util.spec_from_file_location("gen_openai_types", GENERATOR)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = generator  # its dataclasses look their module up
    try:
        spec.loader.exec_module(generator)
    finally:
        del sys.modules[spec.name]
    assert generator.generate() == Path(oa.__file__).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ a server
def body(
    extra: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **fields: Any
) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": [{"role": "user", "content": SCRIPT}, *extra],
        "tools": tools or [],
        **fields,
    }


async def post(http: httpx.AsyncClient, value: dict[str, Any]) -> dict[str, Any]:
    reply = await http.post("/v1/responses", json=value)
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()
    assert response["status"] == "completed", response
    return response


async def ws_rollout(url: str, creates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each create in turn on one connection, each continuing the previous response (``"prev"``)."""
    out: list[dict[str, Any]] = []
    async with connect(url, max_size=None) as ws:
        for event in creates:
            if event.get("previous_response_id") == "prev":
                event = {**event, "previous_response_id": out[-1]["id"]}
            await ws.send(json.dumps({"type": "response.create", **event}))
            terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
            assert terminal["type"] == "response.completed", terminal
            out.append(terminal["response"])
    return out


def prompt(response: dict[str, Any], turn: int = 0) -> int:
    return int(response["lab"]["turns"][turn]["prompt_tokens"])


async def deltas(
    srv: ThreadedServer,
    http: httpx.AsyncClient,
    extra: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> dict[str, int]:
    """The prompt tokens ``extra`` (items) or ``tools`` add, on each path: first turn, then continued."""
    more = [{"role": "user", "content": "and?"}]
    result: dict[str, int] = {}
    with_, without = body(extra, tools), body([], None)
    first_with, first_without = await post(http, with_), await post(http, without)
    result["http"] = prompt(first_with) - prompt(first_without)
    # store → input_items: the items come back as they went in (ids added; a reference as what it names)
    listed = (
        await http.get(f"/v1/responses/{first_with['id']}/input_items", params={"order": "asc"})
    ).json()["data"]
    sent = ["message" if item["type"] == "item_reference" else item.get("type", "message") for item in extra]
    assert [item.get("type", "message") for item in listed[1:]] == sent
    next_with = await post(
        http, {"model": MODEL, "input": more, "tools": tools or [], "previous_response_id": first_with["id"]}
    )
    next_without = await post(
        http, {"model": MODEL, "input": more, "previous_response_id": first_without["id"]}
    )
    result["http-prev"] = prompt(next_with) - prompt(next_without)
    follow = {"model": MODEL, "input": more, "previous_response_id": "prev"}
    ga_with = await ws_rollout(
        srv.url, [{**with_, "store": False}, {**follow, "tools": tools or [], "store": False}]
    )
    ga_without = await ws_rollout(srv.url, [{**without, "store": False}, {**follow, "store": False}])
    result["ga"] = prompt(ga_with[0]) - prompt(ga_without[0])
    result["ga-continued"] = prompt(ga_with[1]) - prompt(ga_without[1])
    ll_url = srv.url + "?protocol=longlived"
    ll_with = await ws_rollout(ll_url, [with_, {**follow, "tools": tools or []}])
    ll_without = await ws_rollout(ll_url, [without, follow])
    result["longlived"] = prompt(ll_with[0]) - prompt(ll_without[0])
    result["longlived-continued"] = prompt(ll_with[1]) - prompt(ll_without[1])
    return result


@pytest.mark.parametrize("kind", sorted(ITEM_TYPES))
async def test_item_type_round_trips(srv: ThreadedServer, http: httpx.AsyncClient, kind: str) -> None:
    extra = item_case(kind)
    if kind == "item_reference":  # a reference to an item this key stored: the first response's message
        stored = await post(http, body([]))
        extra = [{"type": "item_reference", "id": stored["output"][0]["id"]}]
    counted = await deltas(srv, http, extra, None)
    if kind == "compaction_trigger":  # it changes the answer (one compaction item: tests/test_compaction.py),
        # so the continuations carry a different answer; its own rendering is compared on the first turns
        counted = {path: n for path, n in counted.items() if not path.endswith(("-prev", "-continued"))}
    assert set(counted.values()) == {counted["http"]}, counted  # rendered alike on every path
    assert counted["http"] > 0, counted  # and counted


@pytest.mark.parametrize("kind", sorted(TOOL_TYPES))
async def test_tool_type_round_trips(srv: ThreadedServer, http: httpx.AsyncClient, kind: str) -> None:
    tool = tool_case(kind)
    counted = await deltas(srv, http, [], [tool])
    assert set(counted.values()) == {counted["http"]}, counted
    assert counted["http"] > 0, counted
    response = await post(http, body([], [tool]))
    assert [t["type"] for t in response["tools"]] == [tool["type"]]  # carried onto the Response


def test_image_tokens_follow_the_vision_guide() -> None:
    # The guide's own examples (sampler/media.py cites them).
    assert media.image_tokens((1024, 1024), "high") == 765
    assert media.image_tokens((2048, 4096), "high") == 1105
    assert media.image_tokens((4096, 8192), "low") == 85
    assert media.image_size(png(300, 200)) == (300, 200)


async def test_image_in_a_message_costs_its_tiles(http: httpx.AsyncClient) -> None:
    text_only = await post(
        http, body([{"role": "user", "content": [{"type": "input_text", "text": "look"}]}])
    )
    with_image = await post(
        http,
        body(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": IMAGE},
                    ],
                }
            ]
        ),
    )
    # 765 image tokens plus the image segment's chat markers and header
    assert 765 <= prompt(with_image) - prompt(text_only) <= 765 + 8


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "frobnicate"}, "input[1].type"),
        ({"type": "local_shell_call", "id": "l", "call_id": "c", "status": "completed"}, "input[1].action"),
        ({"type": "custom_tool_call", "call_id": "c", "name": "n"}, "input[1].input"),
        ({"type": "reasoning", "id": "r", "summary": [{"type": "summary_text"}]}, "input[1].summary[0].text"),
        (
            {"type": "web_search_call", "id": "w", "status": "completed", "action": {"type": "teleport"}},
            "input[1].action.type",
        ),
    ],
)
async def test_malformed_item_is_typed_with_its_path(
    srv: ThreadedServer, http: httpx.AsyncClient, item: dict[str, Any], param: str
) -> None:
    """Same code on every transport; the long-lived protocol names the JSONPath."""
    reply = await http.post("/v1/responses", json=body([item]))
    error = reply.json()["error"]
    assert (reply.status_code, error["code"], error["param"]) == (400, "invalid_request", param), error
    if item["type"] == "frobnicate":
        assert "undocumented type 'frobnicate'" in error["message"]
    for url, expected in ((srv.url, param), (srv.url + "?protocol=longlived", "$." + param)):
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "response.create", **body([item])}))
            frame = (await until(ws, {"error", *TERMINAL_TYPES}))[-1]
            assert (frame["type"], frame["error"]["code"], frame["error"]["param"]) == (
                "error",
                "invalid_request",
                expected,
            ), frame


async def test_item_reference_to_nothing_is_item_not_found(http: httpx.AsyncClient) -> None:
    reply = await http.post("/v1/responses", json=body([{"type": "item_reference", "id": "msg_nope"}]))
    error = reply.json()["error"]
    assert (reply.status_code, error["code"], error["param"]) == (404, "item_not_found", "input[1].id"), error


def test_schema_decodes_what_it_encodes() -> None:
    """Every sample survives decode → encode → decode (the store keeps items as JSON)."""
    decoder = msgspec.json.Decoder(oa.InputItem)
    for kind in ITEM_TYPES:
        for value in item_case(kind):
            item = decoder.decode(json.dumps(value))
            assert decoder.decode(msgspec.json.encode(item)) == item, kind
