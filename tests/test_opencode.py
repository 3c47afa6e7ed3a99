"""opencode (npm ``opencode-ai``, pinned in tests/clients/opencode; its binary ships in the platform package
npm installs beside it), unmodified, against this server: ``opencode run`` with the config a new user
writes to point the ``openai`` provider (the AI SDK's Responses provider, ``@ai-sdk/openai``) at another
base URL, and the key ``opencode auth login`` stores. A scripted task reads a file, edits it and writes
another, over HTTP, over GA WebSocket mode (``OPENCODE_EXPERIMENTAL_WEBSOCKETS=1``: the server's log says
the task's responses came over the socket) and with the model declared as reasoning (opencode then sends
``store: false`` and ``include: ["reasoning.encrypted_content"]`` and carries the reasoning items back
without their ids: a recording proxy in front of the server shows what it sent). Every tool runs exactly
once, by the server's log and by opencode's own events; the files end as scripted. opencode's title
request (no tools) gets a message, never a call. HOME and every XDG directory are in the test's tmp path.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from codex import KEY, LabServer, client_bin, environ_has_node, lab_server, run_client
from helpers import MODEL, clean_env

from proto.processes import free_port

pytestmark = pytest.mark.process  # every test starts a server and a client

ANSWER = "The task is complete."
TOOLS = ["read", "edit", "write"]


def opencode_bin() -> Path:
    return client_bin("opencode", "opencode", "opencode")


def config(base_url: str, reasoning: bool) -> dict[str, Any]:
    """opencode.json: the ``openai`` provider at our base URL, our model added to it (also as the small
    model, which writes the session's title)."""
    model: dict[str, Any] = {
        "name": "responses-lab",
        "tool_call": True,
        "limit": {"context": 128000, "output": 4096},
    }
    if reasoning:
        model["reasoning"] = True
    return {
        "$schema": "https://opencode.ai/config.json",
        "model": f"openai/{MODEL}",
        "small_model": f"openai/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
        "provider": {"openai": {"options": {"baseURL": base_url}, "models": {MODEL: model}}},
    }


def task(work: Path, reasoning: bool) -> str:
    notes, added = work / "notes.txt", work / "added.txt"
    think = "!reason 20 " if reasoning else ""
    return "\n".join(
        [
            "Read the notes, change them, then write a new file.",
            think + "!call read " + json.dumps({"filePath": str(notes)}),
            think
            + "!call edit "
            + json.dumps({"filePath": str(notes), "oldString": "alpha", "newString": "gamma"}),
            "!call write " + json.dumps({"filePath": str(added), "content": "beta\n"}),
            f"!say {ANSWER}",
        ]
    )


@dataclass
class Recorder:
    """A proxy in front of the server that keeps each request body it forwards (HTTP only)."""

    upstream: str
    port: int = field(default_factory=free_port)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if body:
            self.bodies.append(json.loads(body))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method, self.upstream + request.path_qs, data=body, headers=headers
            ) as up,
        ):
            skip = ("content-length", "transfer-encoding", "content-encoding")
            reply = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in skip}
            )
            await reply.prepare(request)
            async for chunk in up.content.iter_any():
                await reply.write(chunk)
            await reply.write_eof()
            return reply


@contextlib.asynccontextmanager
async def recording(server: LabServer) -> AsyncIterator[Recorder]:
    recorder = Recorder(f"http://127.0.0.1:{server.port}")
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.forward)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", recorder.port).start()
    try:
        yield recorder
    finally:
        await runner.cleanup()


@dataclass
class OpencodeRun:
    returncode: int
    output: str
    events: list[dict[str, Any]]

    def tools(self) -> list[dict[str, Any]]:
        return [e["part"] for e in self.events if e.get("type") == "tool_use"]

    def text(self) -> str:
        return "".join(e["part"]["text"] for e in self.events if e.get("type") == "text")


async def opencode_run(
    home: Path, work: Path, base_url: str, prompt: str, *, reasoning: bool = False, websockets: bool = False
) -> OpencodeRun:
    environ_has_node()
    binary = opencode_bin()
    xdg = {d: home / f".{d}" for d in ("config", "data", "cache", "state")}
    (xdg["config"] / "opencode").mkdir(parents=True)
    (xdg["config"] / "opencode" / "opencode.json").write_text(json.dumps(config(base_url, reasoning)))
    (xdg["data"] / "opencode").mkdir(parents=True)
    (xdg["data"] / "opencode" / "auth.json").write_text(json.dumps({"openai": {"type": "api", "key": KEY}}))
    env = {
        **{k: v for k, v in clean_env().items() if not k.startswith(("OPENCODE", "OPENAI_", "XDG_"))},
        **{f"XDG_{d.upper()}_HOME": str(path) for d, path in xdg.items()},
        "HOME": str(home),
        "PWD": str(work),  # opencode takes its project directory from PWD (else ours: an external directory)
        "OPENCODE_DISABLE_MODELS_FETCH": "1",  # the bundled models.dev snapshot; nothing leaves loopback
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "NO_COLOR": "1",
    }
    if websockets:
        env["OPENCODE_EXPERIMENTAL_WEBSOCKETS"] = "1"
    # The prompt on stdin: `opencode run` quotes a positional message that has spaces in it.
    code, out = await run_client([str(binary), "run", "--format", "json"], work, env, stdin=prompt.encode())
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return OpencodeRun(code, out, events)


def _workdir(tmp_path: Path) -> tuple[Path, Path]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "notes.txt").write_text("alpha\n")
    return work, home


def _assert_task(server: LabServer, run: OpencodeRun, work: Path) -> list[dict[str, Any]]:
    """The task completed, each tool ran once, the files are as scripted; the task's log lines (the title
    request's apart)."""
    assert run.returncode == 0, run.output
    assert not [e for e in run.events if e.get("type") == "error"], run.output
    assert [part["tool"] for part in run.tools()] == TOOLS, run.output
    assert {part["state"]["status"] for part in run.tools()} == {"completed"}, run.output
    assert run.text() == ANSWER, run.output
    ended = server.ended()
    assert {line["status"] for line in ended} == {"completed"}, ended
    assert [name for line in ended for name in line["calls"]] == TOOLS, ended
    titles = [line for line in ended if line["input_tokens"] < 1000]  # the title request: no tools, short
    assert len(titles) == 1 and titles[0]["calls"] == [], ended
    assert (work / "notes.txt").read_text() == "gamma\n"
    assert (work / "added.txt").read_text() == "beta\n"
    return [line for line in ended if line not in titles]


async def test_opencode_http(tmp_path: Path) -> None:
    work, home = _workdir(tmp_path)
    async with lab_server(tmp_path) as server:
        run = await opencode_run(home, work, server.base_url, task(work, reasoning=False))
        rollout = _assert_task(server, run, work)
        assert [line["mode"] for line in rollout] == ["http"] * 4, rollout  # read, edit, write, answer


async def test_opencode_websocket_mode(tmp_path: Path) -> None:
    work, home = _workdir(tmp_path)
    async with lab_server(tmp_path) as server:
        run = await opencode_run(home, work, server.base_url, task(work, reasoning=False), websockets=True)
        rollout = _assert_task(server, run, work)
        # the task's four responses on one GA WebSocket connection (the title request stays on HTTP)
        assert [line["mode"] for line in rollout] == ["ws"] * 4, rollout
        assert {line.get("protocol") for line in rollout} == {"ga"}, rollout
        assert len({line["conn_id"] for line in rollout}) == 1, rollout


async def test_opencode_reasoning_model_carries_encrypted_reasoning_back(tmp_path: Path) -> None:
    work, home = _workdir(tmp_path)
    async with lab_server(tmp_path) as server, recording(server) as recorder:
        run = await opencode_run(home, work, recorder.base_url, task(work, reasoning=True), reasoning=True)
        rollout = _assert_task(server, run, work)
        assert [line["mode"] for line in rollout] == ["http"] * 4, rollout
    bodies = [body for body in recorder.bodies if body.get("tools")]  # the task's requests
    assert len(bodies) == 4, recorder.bodies
    for body in bodies:
        assert body["store"] is False and "reasoning.encrypted_content" in body["include"], body
    carried = [[item for item in body["input"] if item.get("type") == "reasoning"] for body in bodies]
    assert [len(items) for items in carried] == [0, 1, 2, 2], carried
    for item in carried[-1]:  # without an id (store is false), its encrypted content as the server made it
        assert "id" not in item and item["encrypted_content"], item
