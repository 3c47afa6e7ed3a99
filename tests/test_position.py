"""The script's position (docs/protocol.md, "The directive script", the position): which line a request
plays when its client re-sends a history without some of the items the server made — the hosted
``web_search_call`` (Cline CLI), reasoning, ids. Unit tests on the rule, a property over generated
scripts, and a real server on HTTP and GA WebSocket mode with clients that drop those items."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgspec
import pytest
from helpers import MODEL, TERMINAL_OR_ERROR, running
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect

from proto.client import messages
from proto.core import codec
from proto.core.items import Item
from proto.server.serve import ThreadedServer
from sampler.position import count_segments, script_position

Dict = dict[str, Any]


def items(*raw: Dict) -> list[Item]:
    return codec.decode_items([msgspec.Raw(json.dumps(item).encode()) for item in raw])


def user(text: str) -> Dict:
    return {"type": "message", "role": "user", "content": text}


def said(text: str, id: str | None = "msg_1") -> Dict:
    item: Dict = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return item if id is None else {**item, "id": id}


def call(name: str, arguments: str, call_id: str, id: str | None = "fc_1") -> Dict:
    item: Dict = {"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id}
    return item if id is None else {**item, "id": id}


def answered(call_id: str) -> Dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def searched(query: str) -> Dict:
    return {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": query},
    }


def thought(id: str | None = "rs_1") -> Dict:
    item: Dict = {"type": "reasoning", "summary": [], "encrypted_content": "opaque"}
    return item if id is None else {**item, "id": id}


SCRIPT = (
    "Read, search, add.\n"
    '!call read {"path": "a.txt"}\n'
    '!call web_search {"query": "mock model"}\n'
    '!call apply_patch {"input": "*** Add File: b.txt"}\n'
    "!say Finished."
)


def test_a_dropped_hosted_call_does_not_replay_the_call_after_it() -> None:
    # Cline CLI's history: the search's response held [web_search_call, apply_patch's call]; it re-sends
    # only the call
    faithful = items(
        user(SCRIPT),
        call("read", '{"path":"a.txt"}', "c1"),
        answered("c1"),
        searched("mock model"),
        call("apply_patch", '{"input":"*** Add File: b.txt"}', "c2"),
        answered("c2"),
    )
    dropped = [item for item in faithful if not item.__class__.__name__.endswith("WebSearch")]
    assert len(dropped) == len(faithful) - 1
    assert count_segments(faithful) == 3 and count_segments(dropped) == 2  # the count alone falls short
    assert script_position(faithful, SCRIPT) == 3
    assert script_position(dropped, SCRIPT) == 3  # the `!say`, not apply_patch again


def test_arguments_are_matched_as_json_and_ids_and_reasoning_do_not_count() -> None:
    history = items(
        user(SCRIPT),
        call("read", '{ "path" : "a.txt" }', "c1", id=None),  # re-serialized, without an id
        answered("c1"),
        thought(id=None),
        call("apply_patch", '{"input":"*** Add File: b.txt"}', "c2", id=None),
        answered("c2"),
    )
    assert script_position(history, SCRIPT) == 3


def test_a_call_the_script_did_not_write_keeps_the_count() -> None:
    history = items(user(SCRIPT), call("read", '{"path":"other.txt"}', "c1"), answered("c1"))
    assert script_position(history, SCRIPT) == count_segments(history) == 1


def test_arguments_nested_past_the_parser_are_compared_as_text() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    history = items(user(SCRIPT), call("read", deep, "c1"), answered("c1"))
    assert script_position(history, SCRIPT) == 1


def test_without_a_script_the_position_is_the_count() -> None:
    history = items(user("hello"), said("hello"), user("again"), call("read", "{}", "c1"), answered("c1"))
    assert script_position(history, "hello") == count_segments(history) == 2


def test_the_same_call_on_two_lines_is_matched_once_each() -> None:
    script = "Twice.\n!call read {}\n!say between\n!call read {}\n!say end"
    once = items(user(script), call("read", "{}", "c1"), answered("c1"))
    assert script_position(once, script) == 1
    twice = [*once, *items(said("between"), user("go on"), call("read", "{}", "c2"), answered("c2"))]
    assert script_position(twice, script) == 3
    # a client that lost the message between: the second read is still the third line's
    lost = [*once, *items(user("go on"), call("read", "{}", "c2"), answered("c2"))]
    assert count_segments(lost) == 2 and script_position(lost, script) == 3


def test_a_parallel_line_with_a_call_dropped_by_a_cap_does_not_match_a_later_line() -> None:
    # max_tool_calls 1 per response: the first line's read_file never ran; the second line's one did
    script = "Cap.\n!call grep {} | !call read_file {}\n!call read_file {}\n!say done"
    history = items(
        user(script), call("grep", "{}", "c1"), answered("c1"), call("read_file", "{}", "c2"), answered("c2")
    )
    assert script_position(history, script) == 2


def test_serial_turns_count_a_parallel_line_call_by_call() -> None:
    script = 'Serial.\n!call grep {} | !call read_file {}\n!call web_search {"query": "q"}\n!say done'
    history = items(
        user(script),
        call("grep", "{}", "c1"),
        answered("c1"),
        call("read_file", "{}", "c2"),
        answered("c2"),
    )
    assert script_position(history, script, parallel=False) == 2
    assert script_position(history, script, parallel=True) == 2  # its second segment is counted too


# ---- a property: generated scripts, played as the server plays them, re-sent with items dropped ------------

Line = tuple[str, Any]  # ("local", [(name, args)]), ("hosted", query), ("say", text)

local_line = st.lists(
    st.tuples(st.sampled_from(["read", "grep"]), st.sampled_from(["{}", '{"a":1}', '{"a":2}'])),
    min_size=1,
    max_size=2,
).map(lambda calls: ("local", calls))
hosted_line = st.sampled_from(["q1", "q2"]).map(lambda query: ("hosted", query))
say_line = st.sampled_from(["ok", "fine"]).map(lambda text: ("say", text))
scripts = st.lists(st.one_of(local_line, hosted_line, say_line), min_size=1, max_size=8)


def script_of(lines: list[Line]) -> str:
    out = ["Play it."]
    for kind, value in lines:
        if kind == "local":
            out.append(" | ".join(f"!call {name} {args}" for name, args in value))
        elif kind == "hosted":
            out.append(f'!call web_search {{"query": "{value}"}}')
        else:
            out.append(f"!say {value}")
    return "\n".join(out)


def played(lines: list[Line], reasoning: bool) -> Iterator[tuple[list[Dict], int]]:
    """Each request of the rollout: the history a faithful client sends, and the lines played before it.
    As the server plays it: a hosted search runs inside the response, a local call ends the response (the
    client answers it), a message ends it (the user writes again)."""
    history: list[Dict] = [user(script_of(lines))]
    k, n = 0, 0
    while k < len(lines):
        yield list(history), k
        while k < len(lines):
            kind, value = lines[k]
            k += 1
            history += [thought()] if reasoning else []
            if kind == "hosted":
                history.append(searched(value))
                continue
            if kind == "local":
                ids = [f"c{n + i}" for i in range(len(value))]
                n += len(value)
                history += [call(name, args, cid) for (name, args), cid in zip(value, ids, strict=True)]
                history += [answered(cid) for cid in ids]
            else:
                history += [said(value), user("next")]
            break


DROPS: dict[str, Callable[[Dict], Dict | None]] = {
    "hosted calls": lambda item: None if item["type"] == "web_search_call" else item,
    "reasoning": lambda item: None if item["type"] == "reasoning" else item,
    "ids": lambda item: (
        item if item["type"] == "web_search_call" else {k: v for k, v in item.items() if k != "id"}
    ),
}


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(lines=scripts, reasoning=st.booleans(), drops=st.sets(st.sampled_from(sorted(DROPS))))
def test_the_position_survives_dropped_items(lines: list[Line], reasoning: bool, drops: set[str]) -> None:
    script = script_of(lines)
    for history, k in played(lines, reasoning):
        faithful = items(*history)
        assert script_position(faithful, script) == count_segments(faithful) == k
        sent = history
        for drop in sorted(drops):
            sent = [kept for item in sent if (kept := DROPS[drop](item)) is not None]
        rewritten = items(*sent)
        position = script_position(rewritten, script)
        assert position >= count_segments(rewritten)
        if sent[-1]["type"] == "function_call_output":  # a line whose calls are answered is never replayed
            assert position == k, (history, sent)


# ---- over the wire: clients that drop what they cannot replay ---------------------------------------------

WIRE_SCRIPT = (
    "Look, search, read.\n"
    '!reason 8 !call grep {"pattern": "a"}\n'
    '!call web_search {"query": "mock model"}\n'
    '!reason 8 !call read_file {"path": "x"}\n'
    "!say done"
)
WIRE_TOOLS = [
    {"type": "function", "name": "grep"},
    {"type": "function", "name": "read_file"},
    {"type": "web_search"},
]


def resent(output: list[Dict]) -> list[Dict]:
    """What Cline CLI re-sends of a response's output: no hosted call; the rest without ids."""
    return [
        {k: v for k, v in item.items() if k not in ("id", "status")}
        for item in output
        if item["type"] != "web_search_call"
    ]


def answers(response: Dict) -> list[Dict]:
    return [answered(item["call_id"]) for item in response["output"] if item["type"] == "function_call"]


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


def calls_made(responses: list[Dict]) -> list[str]:
    return [
        item.get("name", item["type"]) for r in responses for item in r["output"] if "call" in item["type"]
    ]


@pytest.mark.process
@pytest.mark.parametrize("transport", ["http", "ga"])
async def test_a_client_that_drops_hosted_calls_reasoning_and_ids_gets_each_call_once(
    srv: ThreadedServer, transport: str
) -> None:
    base = messages.body(
        MODEL, [], tools=WIRE_TOOLS, store=False, include=["reasoning.encrypted_content"], reasoning={}
    )
    history: list[Dict] = [user(WIRE_SCRIPT)]
    responses: list[Dict] = []
    async with (
        httpx.AsyncClient(base_url=srv.http_url, timeout=30) as client,
        connect(srv.url) as ws,
    ):
        while len(responses) < 6:
            body = dict(base, input=history)
            if transport == "http":
                reply = await client.post("/v1/responses", json=body)
                assert reply.status_code == 200, reply.text
                response = reply.json()
            else:
                await ws.send(json.dumps(messages.create(body)))
                while (frame := json.loads(await ws.recv()))["type"] not in TERMINAL_OR_ERROR:
                    pass
                assert frame["type"] == "response.completed", frame
                response = frame["response"]
            responses.append(response)
            if not answers(response):
                break
            history += [*resent(response["output"]), *answers(response)]
    assert calls_made(responses) == ["grep", "web_search_call", "read_file"]
    reasoning = [item for item in history if item["type"] == "reasoning"]
    assert len(reasoning) == 2 and all("id" not in item and item["encrypted_content"] for item in reasoning)
    last = responses[-1]["output"][-1]
    assert last["type"] == "message" and last["content"][0]["text"] == "done"
