"""Open Responses conformance: the public compliance suite itself, unmodified, as a client (its 17 cases:
HTTP JSON, SSE, GA WebSocket mode, ``POST /responses/compact``), on Bun from the npm registry
(tests/clients/openresponses, installed by ``make clients``); then every event of every transport and the
compact endpoint through the vendored schemas (tests/spec.py). The bounded Schemathesis run over the
spec's own operations is tests/test_schemathesis.py.

The suite failing to install or start fails these tests with the reason; nothing is skipped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from codex import CLIENTS, environ_has_node
from helpers import MODEL, auth, clean_env, running
from spec import check_compact, check_event, check_response
from websockets.asyncio.client import connect

from proto.server.serve import ThreadedServer

KEY = "sk-openresponses-0001"
SUITE = Path(__file__).resolve().parent / "clients" / "openresponses"


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running(api_key=[KEY]) as server:
        yield server


def _suite_dir(tmp: Path) -> Path:
    """The vendored suite beside the installed modules (Bun resolves ``zod`` from the files' own folder)."""
    environ_has_node()
    modules = CLIENTS / "openresponses" / "node_modules"
    bun = modules / ".bin" / "bun"
    if not bun.exists():
        pytest.fail(
            f"Bun is not installed at {bun}: `make clients` (run by `make test`) installs it and zod from "
            f"npm with "
            "tests/clients/openresponses/package.json; its output says why it failed"
        )
    for part in ("bin", "src"):
        shutil.copytree(SUITE / part, tmp / part)
    (tmp / "node_modules").symlink_to(modules)
    return bun


async def test_compliance_suite_passes(srv: ThreadedServer, tmp_path: Path) -> None:
    bun = _suite_dir(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        str(bun),
        "run",
        "bin/compliance-test.ts",
        "--base-url",
        srv.http_url + "/v1",
        "--api-key",
        KEY,
        "--model",
        MODEL,
        "--json",
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    text = out.decode()
    assert text.strip().startswith("{"), (
        f"the compliance suite did not start (exit {proc.returncode}): {err.decode()[-3000:]}{text[-3000:]}"
    )
    report = json.loads(text)
    failed = {r["id"]: r.get("errors", []) for r in report["results"] if r["status"] != "passed"}
    assert not failed, json.dumps(failed, indent=1)[:6000]
    assert report["summary"] == {"passed": 17, "failed": 0, "skipped": 0, "total": 17}, report["summary"]
    assert proc.returncode == 0


# ------------------------------------------------------------------------------------------ every event type
# One script drives every output the mock model makes: reasoning with a summary, a preamble message,
# parallel function calls, a custom tool call, a hosted web search, then (after the outputs) a final message.
SCRIPT = (
    'Do it.\n!reason 5 !tokens 12 !call grep {"pattern": "x"} | !call apply_patch "*** Begin Patch"\n'
    '!call web_search {"query": "open responses"}\n!say All done.'
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "grep",
        "description": "Search files",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch"},
    {"type": "web_search"},
]
BODY: dict[str, Any] = {
    "model": MODEL,
    "input": [{"role": "user", "content": SCRIPT}],
    "tools": TOOLS,
    "reasoning": {"effort": "low", "summary": "auto"},
    "include": ["reasoning.encrypted_content"],
}


def _outputs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls = [
        e["item"]
        for e in events
        if e["type"] == "response.output_item.done"
        and e["item"]["type"] in ("function_call", "custom_tool_call")
    ]
    return [{"type": f"{c['type']}_output", "call_id": c["call_id"], "output": "ok"} for c in calls]


def _check_all(events: list[dict[str, Any]], transport: str) -> set[str]:
    for event in events:
        check_event(event, transport)
    return {e["type"] for e in events}


EXPECTED = {
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done",
    "response.custom_tool_call_input.delta",
    "response.custom_tool_call_input.done",
    "response.web_search_call.in_progress",
    "response.web_search_call.searching",
    "response.web_search_call.completed",
    "response.completed",
}


async def _sse(http: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        return [json.loads(line[6:]) async for line in reply.aiter_lines() if line.startswith("data: ")]


async def test_every_event_validates_over_http_and_sse(srv: ThreadedServer) -> None:
    async with httpx.AsyncClient(base_url=srv.http_url, headers=auth(KEY), timeout=30) as http:
        first = await _sse(http, BODY)
        rest = await _sse(
            http,
            {**BODY, "input": [], "previous_response_id": first[-1]["response"]["id"]}
            | {"input": _outputs(first)},
        )
        second = await _sse(http, {**BODY, "input": [], "previous_response_id": rest[-1]["response"]["id"]})
        seen = _check_all(first + rest + second, "sse")
        assert seen >= EXPECTED, EXPECTED - seen
        reply = await http.post("/v1/responses", json=BODY)
        check_response(reply.json())
        stored = await http.get(f"/v1/responses/{reply.json()['id']}")
        check_response(stored.json())


async def test_every_event_validates_over_ga_websocket(srv: ThreadedServer) -> None:
    events: list[dict[str, Any]] = []
    async with connect(srv.url, additional_headers=auth(KEY)) as ws:
        previous: str | None = None
        inputs: list[dict[str, Any]] = BODY["input"]
        for _ in range(4):
            await ws.send(
                json.dumps(
                    {"type": "response.create", **BODY, "input": inputs, "previous_response_id": previous}
                )
            )
            turn: list[dict[str, Any]] = []
            while not turn or turn[-1]["type"] not in (
                "response.completed",
                "response.failed",
                "response.incomplete",
                "error",
            ):
                turn.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            events += turn
            previous, inputs = turn[-1]["response"]["id"], _outputs(turn)
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "store": False,
                    "previous_response_id": "resp_missing",
                    "input": [],
                }
            )
        )
        events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    assert events[-1]["type"] == "error"
    seen = _check_all(events, "ws")
    assert seen >= EXPECTED, EXPECTED - seen


async def test_every_event_validates_over_the_longlived_protocol(srv: ThreadedServer) -> None:
    """The shared events validate; ``response.done`` is the protocol's own extension (docs/protocol.md)."""
    events: list[dict[str, Any]] = []
    async with connect(srv.url + "?protocol=longlived", additional_headers=auth(KEY)) as ws:
        await ws.send(json.dumps({"type": "response.create", **BODY}))
        while not events or events[-1]["type"] != "response.completed":
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            if events[-1]["type"] == "response.done":
                segment = events[: len(events)]
                await ws.send(json.dumps({"type": "response.append", "input": _outputs(segment)[-2:]}))
    seen = _check_all(events, "longlived")
    assert seen >= EXPECTED | {"response.done"}, (EXPECTED | {"response.done"}) - seen


async def test_compact_validates_and_its_item_stands_for_the_history(srv: ThreadedServer) -> None:
    history = [
        {"role": "user", "content": "Remember: slate."},
        {"role": "assistant", "content": "OK, " + "slate " * 200},
        {"role": "user", "content": "Compact this."},
    ]
    async with httpx.AsyncClient(base_url=srv.http_url, headers=auth(KEY), timeout=30) as http:
        reply = await http.post("/v1/responses/compact", json={"model": MODEL, "input": history})
        assert reply.status_code == 200, reply.text
        compacted = reply.json()
        check_compact(compacted)
        assert compacted["object"] == "response.compaction"
        assert [i["type"] for i in compacted["output"]] == ["message", "message", "compaction"]
        # the compacted window costs fewer input tokens than the history it stands for
        full = await http.post(
            "/v1/responses", json={"model": MODEL, "input": [*history, {"role": "user", "content": "Go on."}]}
        )
        short = await http.post(
            "/v1/responses",
            json={"model": MODEL, "input": [*compacted["output"], {"role": "user", "content": "Go on."}]},
        )
        check_response(short.json())
        assert short.json()["usage"]["input_tokens"] < full.json()["usage"]["input_tokens"] - 150
        assert compacted["usage"]["output_tokens"] >= 1
        # a damaged one is refused, typed, with its path (another server's is accepted, as its JSON)
        forged = await http.post(
            "/v1/responses",
            json={"model": MODEL, "input": [{"type": "compaction", "encrypted_content": "rlc2:%%%"}]},
        )
        assert forged.status_code == 400
        assert forged.json()["error"]["code"] == "invalid_encrypted_content"
        assert forged.json()["error"]["param"] == "input[0].encrypted_content"
        missing = await http.post("/v1/responses/compact", json={"input": "Compact this conversation."})
        assert missing.status_code == 400 and missing.json()["error"]["code"], missing.text
