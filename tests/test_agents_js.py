"""The OpenAI Agents SDK for JavaScript (@openai/agents 0.20, pinned in tests/clients/agents-js), unmodified,
against ``responses-lab serve`` over HTTP and over the Responses WebSocket (``OpenAIProvider({...,
useResponsesWebSocket: true})``): a tool loop then a second user turn chained by ``previousResponseId``, a
streamed run, and a zod ``outputType``. Its WebSocket needs Node >= 22's global ``WebSocket`` (on Node 20 it
throws "requires a global WebSocket implementation"), so the client runs on the Node 22 that its
package.json installs from npm (the ``node`` package), whatever node is on PATH. The server's log says which
transport served each response. Configuration, as a user writes it: docs/clients.md."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from codex import CLIENTS, KEY, LabServer, lab_process
from helpers import MODEL, clean_env

pytestmark = pytest.mark.process  # every test starts a server and a client

ROLLOUT = Path(__file__).resolve().parent / "clients" / "agents-js" / "rollout.mjs"
MODULES = CLIENTS / "agents-js" / "node_modules"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with lab_process(tmp_path_factory.mktemp("agents-js")) as server:
        yield server


async def run(srv: LabServer, case: str, websocket: bool) -> dict[str, Any]:
    node = MODULES / ".bin" / "node"
    if not (MODULES / "@openai" / "agents").exists() or not node.exists():
        pytest.fail(
            f"the Agents SDK or its Node 22 is not installed at {MODULES}: `make clients` (run by `make "
            "test`) installs them from npm with tests/clients/agents-js/package.json; its output says why"
        )
    env = {
        **clean_env(),
        "AGENTS_MODULES": str(MODULES),
        "LAB_BASE_URL": srv.base_url,
        "LAB_API_KEY": KEY,
        "LAB_MODEL": MODEL,
        "LAB_CASE": case,
        "LAB_WEBSOCKET": "1" if websocket else "0",
    }
    proc = await asyncio.create_subprocess_exec(
        str(node), str(ROLLOUT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    assert result["node"].startswith("v22."), result
    return result


def transport(lines: list[dict[str, Any]], modes: list[str], websocket: bool) -> None:
    """Over WebSocket every response on GA WebSocket mode, all on one connection; over HTTP, these modes."""
    if websocket:
        assert len(lines) == len(modes), lines
        assert {(line["mode"], line.get("protocol")) for line in lines} == {("ws", "ga")}, lines
        assert len({line["conn_id"] for line in lines}) == 1, lines
    else:
        assert [line["mode"] for line in lines] == modes, lines


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_tool_loop_then_a_second_turn(srv: LabServer, websocket: bool) -> None:
    mark = srv.mark()
    result = await run(srv, "tool_loop", websocket)
    assert result["calls"] == ["grep def mean", "read_file a.py"], result
    assert result["answers"] == ["Found it.", "Read it."], result
    lines = srv.ended_since(mark)
    # over HTTP the first run re-sends its history; the second is chained by previousResponseId
    transport(lines, ["http", "http", "http-prev", "http-prev"], websocket)
    assert [line["calls"] for line in lines] == [["grep"], [], ["read_file"], []], lines


async def test_streamed_run_over_websocket(srv: LabServer) -> None:
    mark = srv.mark()
    result = await run(srv, "streamed", websocket=True)
    assert result["calls"] == ["grep def median"], result
    assert len(result["deltas"]) > 1 and "".join(result["deltas"]) == result["answer"], result
    assert result["answer"] == "Streamed answer here.", result
    transport(srv.ended_since(mark), ["ws", "ws"], websocket=True)


async def test_output_type_over_websocket(srv: LabServer) -> None:
    mark = srv.mark()
    result = await run(srv, "structured", websocket=True)
    assert result["object"] == {"city": "Oslo", "celsius": -3}, result
    transport(srv.ended_since(mark), ["ws"], websocket=True)
