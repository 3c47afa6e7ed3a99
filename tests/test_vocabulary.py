"""The mock model speaks the whole item vocabulary (docs/protocol.md, "The directive script"): the script in
the first
user message that holds directive lines, custom tool calls, namespace functions, reasoning items carried
back, one call per turn under ``parallel_tool_calls: false``, and custom outputs appended long-lived."""

from __future__ import annotations

import json
from typing import Any

import httpx
import plain_server
import pytest
from helpers import MODEL, until
from websockets.asyncio.client import ClientConnection, connect

from proto.core.events import TERMINAL_TYPES
from proto.server.serve import ThreadedServer
from sampler.policy import PlannedCall, ScriptError, parse_directive, parse_script

srv, http = plain_server.srv, plain_server.http  # the module's server and its httpx client (fixtures)

CONTEXT = "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"  # what Codex sends first
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /(.|\\n)+/"},
}
NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Spawn.", "parameters": {"type": "object"}}
    ],
}
GREP = {"type": "function", "name": "grep", "parameters": {"type": "object"}}
ENCRYPTED = ["reasoning.encrypted_content"]


# ------------------------------------------------------------------------------------ parsing (sans server)
def test_custom_call_and_reason_parse() -> None:
    plan = parse_directive(
        f'!reason 40 !tokens 90 !call apply_patch {json.dumps(PATCH)} | !call grep {{"q": 1}}'
    )
    assert plan.reasoning_tokens == 40 and plan.output_tokens == 90
    assert plan.calls == (PlannedCall("apply_patch", PATCH, custom=True), PlannedCall("grep", '{"q":1}'))
    assert parse_directive("!tokens 5 !reason 7 !say hi").reasoning_tokens == 7  # prefixes in either order


@pytest.mark.parametrize(
    "line", ["!reason !say x", "!reason 5", "!reason 5 !reason 6 !say x", '!call x "unterminated']
)
def test_bad_reason_or_custom_lines_take_their_turn(line: str) -> None:
    with pytest.raises(ScriptError):
        parse_directive(line)
    plans = parse_script(f"task\n{line}\n!say after")
    assert plans is not None and len(plans) == 2 and plans[0].text.startswith("[script error on line 2")


# ------------------------------------------------------------------------------------ a server
async def post(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    reply = await http.post("/v1/responses", json={"model": MODEL, **fields})
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()
    return response


async def sse(http: httpx.AsyncClient, **fields: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with http.stream("POST", "/v1/responses", json={"model": MODEL, "stream": True, **fields}) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def kinds(response: dict[str, Any]) -> list[str]:
    return [item["type"] for item in response["output"]]


async def test_script_is_the_first_user_message_with_directives(http: httpx.AsyncClient) -> None:
    response = await post(
        http,
        input=[
            {"role": "user", "content": CONTEXT},
            {"role": "user", "content": 'Fix it.\n!call grep {"q": 1}\n!say done'},
        ],
        tools=[GREP],
    )
    assert kinds(response) == ["function_call"] and response["output"][0]["name"] == "grep"


async def test_custom_call_streams_its_input_and_takes_its_output(http: httpx.AsyncClient) -> None:
    script = f"!call apply_patch {json.dumps(PATCH)}\n!say patched"
    events = await sse(http, input=script, tools=[APPLY_PATCH])
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    done = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert len(deltas) > 1 and "".join(deltas) == PATCH and done[0]["input"] == PATCH
    response = events[-1]["response"]
    call = response["output"][0]
    assert (call["type"], call["name"], call["input"]) == ("custom_tool_call", "apply_patch", PATCH)
    follow = await post(
        http,
        previous_response_id=response["id"],
        tools=[APPLY_PATCH],
        input=[{"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}],
    )
    assert follow["output"][-1]["content"][0]["text"] == "patched"


async def test_namespace_function_is_called_by_its_own_name(http: httpx.AsyncClient) -> None:
    response = await post(http, input='!call spawn_agent {"task": "t"}\n!say ok', tools=[NAMESPACE])
    call = response["output"][0]
    assert (call["type"], call["name"], call["namespace"]) == (
        "function_call",
        "spawn_agent",
        "multi_agent_v1",
    )


async def test_reasoning_summary_and_encrypted_content(http: httpx.AsyncClient) -> None:
    script = '!reason 50 !call grep {"q": 1}\n!say done'
    plain = await sse(http, input=script, tools=[GREP])
    assert not [e for e in plain if e["type"].startswith("response.reasoning_summary")]
    item = plain[-1]["response"]["output"][0]
    assert item["type"] == "reasoning" and item["summary"] == [] and "encrypted_content" not in item
    events = await sse(http, input=script, tools=[GREP], reasoning={"summary": "auto"}, include=ENCRYPTED)
    summary = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    response = events[-1]["response"]
    item = response["output"][0]
    assert summary and item["summary"] == [{"type": "summary_text", "text": summary}]
    assert item["encrypted_content"].startswith("rlr1:")
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == 50


async def longlived(url: str, create: dict[str, Any], answer: str = "ok") -> list[dict[str, Any]]:
    """A long-lived rollout to its end, answering each pending call; every terminal/done frame."""
    frames: list[dict[str, Any]] = []
    async with connect(url + "?protocol=longlived") as ws:
        await ws.send(json.dumps({"type": "response.create", **create}))
        while True:
            frame = (await until(ws, {"response.done", *TERMINAL_TYPES, "error"}))[-1]
            frames.append(frame)
            if frame["type"] != "response.done":
                return frames
            await ws.send(json.dumps({"type": "response.append", "input": _answers(frame)}))


def _answers(done: dict[str, Any]) -> list[dict[str, Any]]:
    by_id = {item.get("call_id"): item for item in done["response"]["output"]}
    return [
        {
            "type": "custom_tool_call_output"
            if by_id[c["call_id"]]["type"] == "custom_tool_call"
            else "function_call_output",
            "call_id": c["call_id"],
            "output": "ok",
        }
        for c in done["pending_calls"]
    ]


async def test_reasoning_is_carried_back_with_the_same_tokens(
    srv: ThreadedServer, http: httpx.AsyncClient
) -> None:
    """Sent back over HTTP (store: false, encrypted_content), a reasoning item costs what it cost inside the
    long-lived response; continued with previous_response_id it is in the stored chain."""
    script = '!reason 64 !call grep {"q": 1}\n!say done'
    fields = {
        "input": [{"role": "user", "content": script}],
        "tools": [GREP],
        "include": ENCRYPTED,
        "reasoning": {"summary": "auto"},
    }
    frames = await longlived(srv.url, {"model": MODEL, **fields})
    ll_second = frames[-1]["response"]["lab"]["turns"][-1]["prompt_tokens"]
    first = await post(http, store=False, **fields)
    calls = [item for item in first["output"] if item["type"] == "function_call"]
    history = [
        *fields["input"],
        *first["output"],
        {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "ok"},
    ]
    second = await post(
        http, store=False, input=history, tools=[GREP], include=ENCRYPTED, reasoning={"summary": "auto"}
    )
    assert second["lab"]["turns"][0]["prompt_tokens"] == ll_second
    assert second["output"][-1]["content"][0]["text"] == "done"
    stored = await post(http, **fields)
    chained = await post(
        http,
        previous_response_id=stored["id"],
        tools=[GREP],
        input=[{"type": "function_call_output", "call_id": stored["output"][1]["call_id"], "output": "ok"}],
    )
    assert chained["output"][-1]["content"][0]["text"] == "done"
    assert chained["lab"]["turns"][0]["prompt_tokens"] > 64  # the chain's reasoning is in the prompt


async def test_parallel_tool_calls_false_makes_one_call_per_turn(
    srv: ThreadedServer, http: httpx.AsyncClient
) -> None:
    script = '!call grep {"q": 1} | !call grep {"q": 2}\n!say done'
    both = await post(http, input=script, tools=[GREP])
    assert len([k for k in kinds(both) if k == "function_call"]) == 2
    names: list[list[str]] = []
    body: dict[str, Any] = {"input": script, "tools": [GREP], "parallel_tool_calls": False}
    while True:
        response = await post(http, **body)
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        if not calls:
            break
        names.append([call["arguments"] for call in calls])
        body = {
            "previous_response_id": response["id"],
            "tools": [GREP],
            "parallel_tool_calls": False,
            "input": [
                {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls
            ],
        }
    assert names == [['{"q":1}'], ['{"q":2}']] and response["output"][-1]["content"][0]["text"] == "done"
    frames = await longlived(
        srv.url, {"model": MODEL, "input": script, "tools": [GREP], "parallel_tool_calls": False}
    )
    assert [len(f["pending_calls"]) for f in frames if f["type"] == "response.done"] == [1, 1]
    assert frames[-1]["type"] == "response.completed"


async def test_longlived_append_takes_custom_outputs_and_echoed_calls(srv: ThreadedServer) -> None:
    script = f'!call apply_patch {json.dumps(PATCH)} | !call grep {{"q": 1}}\n!say both done'
    async with connect(srv.url + "?protocol=longlived") as ws:
        await ws.send(
            json.dumps(
                {"type": "response.create", "model": MODEL, "input": script, "tools": [APPLY_PATCH, GREP]}
            )
        )
        done = (await until(ws, {"response.done", *TERMINAL_TYPES, "error"}))[-1]
        assert done["type"] == "response.done", done
        calls = {item["call_id"]: item for item in done["response"]["output"]}
        # Early v1 Codex sends the model's own call back before its output: accepted when it matches.
        echoed = [calls[c["call_id"]] for c in done["pending_calls"]]
        await ws.send(json.dumps({"type": "response.append", "input": [*echoed, *_answers(done)]}))
        terminal = (await until(ws, {"response.done", *TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.completed", terminal
        assert terminal["response"]["output"][-1]["content"][0]["text"] == "both done"
        await _refuses_mismatched_echo(ws)


async def _refuses_mismatched_echo(ws: ClientConnection) -> None:
    await ws.send(
        json.dumps(
            {
                "type": "response.create",
                "model": MODEL,
                "input": '!call grep {"q": 1}\n!say x',
                "tools": [GREP],
            }
        )
    )
    done = (await until(ws, {"response.done", *TERMINAL_TYPES, "error"}))[-1]
    call = done["response"]["output"][0]
    await ws.send(json.dumps({"type": "response.append", "input": [{**call, "name": "other"}]}))
    error = (await until(ws, {"error"}))[-1]
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_request", "$.input[0].name")
