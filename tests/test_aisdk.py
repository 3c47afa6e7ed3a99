"""The Vercel AI SDK 7 (``ai`` + ``@ai-sdk/openai`` 4, pinned in tests/clients/aisdk), unmodified, against
this server over HTTP: a tool loop with ``generateText`` and with ``streamText``, with
``store: true`` (the SDK then sends its earlier assistant output as ``item_reference`` items, resolved from
the store) and ``store: false`` (everything re-sent); and structured output (``Output.object`` with a zod
schema) with each."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from codex import CLIENTS, environ_has_node
from helpers import MODEL, auth, clean_env, running

from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server or a process

KEY = "sk-aisdk-test-0001"
SCRIPT = (
    'Look for it.\n!tokens 12 !call grep {"pattern": "def mean"}\n'
    '!call grep {"pattern": "def median"}\n!say Found both.'
)
ROLLOUT = Path(__file__).resolve().parent / "clients" / "aisdk" / "rollout.mjs"


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running(api_key=[KEY]) as server:
        yield server


async def run_script(srv: ThreadedServer, script: Path, extra: dict[str, str]) -> dict[str, Any]:
    """Run one of tests/clients/aisdk's scripts against ``srv`` with the installed SDK; its JSON line."""
    environ_has_node()
    modules = CLIENTS / "aisdk" / "node_modules"
    if not (modules / "@ai-sdk" / "openai").exists():
        pytest.fail(
            f"the AI SDK is not installed at {modules}: `make clients` (run by `make test`) installs it from "
            f"npm "
            "with tests/clients/aisdk/package.json; its output says why it failed"
        )
    env = {
        **clean_env(),
        "AISDK_MODULES": str(modules),
        "LAB_BASE_URL": srv.http_url + "/v1",
        "LAB_API_KEY": KEY,
        "LAB_MODEL": MODEL,
        **extra,
    }
    proc = await asyncio.create_subprocess_exec(
        "node", str(script), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def rollout(srv: ThreadedServer, stream: bool, store: bool) -> dict[str, Any]:
    extra = {"LAB_PROMPT": SCRIPT, "LAB_STREAM": "1" if stream else "0", "LAB_STORE": json.dumps(store)}
    return await run_script(srv, ROLLOUT, extra)


@pytest.mark.parametrize("stream", [False, True], ids=["generateText", "streamText"])
@pytest.mark.parametrize("store", [True, False], ids=["store", "no-store"])
async def test_aisdk_tool_loop(srv: ThreadedServer, stream: bool, store: bool) -> None:
    result = await rollout(srv, stream, store)
    assert result["calls"] == ["def mean", "def median"], result
    assert result["finishReasons"] == ["tool-calls", "tool-calls", "stop"], result
    assert result["text"] == "Found both.", result
    # the first step's preamble (`!tokens 12`) is assistant text: with store, the SDK refers to it by id
    assert result["stepTexts"].endswith("Found both.") and len(result["stepTexts"]) > len("Found both."), (
        result
    )
    if stream:
        assert result["streamed"] == result["stepTexts"], result
    async with httpx.AsyncClient(base_url=srv.http_url, headers=auth(KEY)) as http:
        last = await http.get(f"/v1/responses/{result['responseIds'][-1]}")
    if store:  # stored, and its input referred to the preamble by id (the server resolved it)
        assert last.status_code == 200
        assert last.json()["lab"]["work"]["references_resolved"] >= 1, last.json()["lab"]["work"]
    else:
        assert last.status_code == 404
    assert result["usage"]["inputTokens"] > 0 and result["usage"]["outputTokens"] > 0, result


STRUCTURED = ROLLOUT.with_name("structured.mjs")
VERDICT = {
    "verdict": "fail",
    "lines": [12, 40],
    "note": "off by one",
    "retry": {"needed": True, "after_s": 5.5},
}


@pytest.mark.parametrize("stream", [False, True], ids=["generateText", "streamText"])
@pytest.mark.parametrize("scripted", [True, False], ids=["json-directive", "generated"])
async def test_aisdk_structured_output(srv: ThreadedServer, stream: bool, scripted: bool) -> None:
    """``output: Output.object({schema})`` with a zod schema: the SDK sends ``text.format`` json_schema and
    parses the reply with zod itself (an invalid one fails the script). A `!json` that validates comes back
    as written; without one the server generates a value valid against the schema."""
    prompt = "Judge the test run.\n" + (f"!json {json.dumps(VERDICT)}" if scripted else "")
    result = await run_script(srv, STRUCTURED, {"LAB_PROMPT": prompt, "LAB_STREAM": "1" if stream else "0"})
    assert result["valid"], result
    jsonschema.validate(result["object"], result["schema"])
    if scripted:
        assert result["object"] == VERDICT, result
    if stream:
        assert result["partials"] >= 1, result
    async with httpx.AsyncClient(base_url=srv.http_url, headers=auth(KEY)) as http:
        stored = (await http.get(f"/v1/responses/{result['responseId']}")).json()
    fmt = stored["text"]["format"]
    assert (fmt["type"], fmt["name"], fmt["strict"]) == ("json_schema", "verdict", True), fmt
    assert json.loads(stored["output"][-1]["content"][0]["text"]) == result["object"]
