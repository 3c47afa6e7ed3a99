"""The helpers the test files share, each defined once: a real server on loopback, requests and frames,
a valid rollout per transport (to show a connection still serves), and the same ten-turn rollout driven
over each transport so their work can be compared.

Where two tests need slightly different things they get two names, never one name with two meanings:
``TERMINAL_TYPES`` (a response's terminal events) and ``TERMINAL_OR_ERROR`` (those or a refusal); ``TOOLS``
(the
two functions ``create`` declares) and ``ROLLOUT_TOOLS`` (the ten-turn rollout's tools, one of them hosted).

A raw RFC 6455 socket, for frames no conforming client sends, is its own module: tests/raw_socket.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from proto.client import messages
from proto.client.longlived import LongLivedClient
from proto.core.errors import ERROR_CODES
from proto.core.events import TERMINAL_TYPES
from proto.processes import free_port
from proto.server.app import Server
from proto.server.config import Settings
from proto.server.serve import ThreadedServer

# ------------------------------------------------------------------------------------ models and guards
MODEL = "mock-4000tps"  # SETTINGS gives it a 1 ms prefill: a rollout costs milliseconds of modelled GPU time
SLOW_MODEL = "mock-65tps"  # 65 tokens/s: `!tokens 5000` streams for over a minute unless cancelled
CORE_MODEL = "mock-1000tps"  # the sans-IO core tests' model: any catalogue name, no server behind it
GUARD = 10.0  # seconds: a guard against hangs only; no assertion depends on timing

# ------------------------------------------------------------------------------------ a server on loopback
SETTINGS = Settings(
    db=":memory:", port=0, model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0"]
)
ServerFactory = Callable[..., contextlib.AbstractContextManager[ThreadedServer]]


@contextlib.contextmanager
def running(**overrides: object) -> Iterator[ThreadedServer]:
    """``with running(tool_timeout_s=0.3) as srv:`` — a fresh server with these settings over SETTINGS."""
    server = ThreadedServer(replace(SETTINGS, **overrides))  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def state(server: ThreadedServer) -> Server:
    """The server's own objects (sessions, pipeline, ledger), for facts the wire does not show."""
    found: Server = server.app.state.server  # type: ignore[attr-defined]
    return found


def server_tasks(server: ThreadedServer) -> list[str]:
    """Names of the tasks alive on the server's event loop, read on that loop."""

    async def names() -> list[str]:
        me = asyncio.current_task()
        return [task.get_name() for task in asyncio.all_tasks() if task is not me and not task.done()]

    assert server.loop is not None
    return asyncio.run_coroutine_threadsafe(names(), server.loop).result(GUARD)


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll a server-side condition (bounded, a guard against hangs, not a timing assertion)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


# ------------------------------------------------------------------------------------ the server as a process
def cli_command() -> list[str]:
    """The ``responses-lab`` command of this interpreter's environment (``python -m proto`` without one)."""
    script = Path(sys.executable).with_name("responses-lab")
    return [str(script)] if script.exists() else [sys.executable, "-m", "proto"]


def clean_env() -> dict[str, str]:
    """This environment without any ``RESPONSES_LAB_*`` setting, so only the command line configures."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}


async def wait_healthy(http: httpx.AsyncClient, limit_s: float = 60.0) -> None:
    """Until a server process just started answers ``/healthz`` (with any status: one started with
    ``--api-key`` answers a client without the key 401); a process that does not within ``limit_s`` fails
    the test here (a loaded 2-core machine starts several workers on PostgreSQL in seconds)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            await http.get("/healthz")
            return
        except httpx.TransportError:
            await asyncio.sleep(0.02)
    raise AssertionError(f"the server did not answer /healthz within {limit_s:.0f} s")


@dataclass(frozen=True)
class Served:
    """A ``responses-lab serve`` process (``serve_process``) and where it answers."""

    process: asyncio.subprocess.Process
    http_url: str  # http://127.0.0.1:PORT
    ws_url: str  # ws://127.0.0.1:PORT/v1/responses


@contextlib.asynccontextmanager
async def serve_process(db: Path | str, *flags: str) -> AsyncIterator[Served]:
    """``responses-lab serve`` on ``db`` (a SQLite file or a PostgreSQL URL) and a free port, answering
    ``/healthz`` when entered; killed on the way out if the test has not stopped it (or crashed it) itself."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *cli_command(), "serve", "--port", str(port), "--db", str(db), *flags,
        env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=GUARD) as http:
            await wait_healthy(http)
        yield Served(process, f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/v1/responses")
    finally:
        if process.returncode is None:  # stopped as an operator would, so that it ends its own children
            process.terminate()  # (the engine and the workers of --workers N: a kill would orphan them)
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Read a server's SQLite file from outside, as another process would (WAL: never waits on its writer)."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute(sql).fetchall()
    connection.close()
    return rows


# ------------------------------------------------------------------------------------ requests
LOCAL_TOOLS = ("grep", "read_file", "run_tests")


def tools_decl(*hosted: str) -> list[dict[str, Any]]:
    """The local function tools, then these hosted ones."""
    return [{"type": "function", "name": name} for name in LOCAL_TOOLS] + [{"type": t} for t in hosted]


TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "grep"},
    {"type": "function", "name": "read_file"},
]
ROLLOUT_TOOLS = tools_decl("web_search")
TWO_CALLS = 'Go.\n!call grep {"q": 1} | !call read_file {"path": "a.py"}\n!say done'
TERMINAL_OR_ERROR = TERMINAL_TYPES | {"error"}


def create(script: str = TWO_CALLS, **fields: Any) -> dict[str, Any]:
    """A ``response.create`` event (both WebSocket protocols) declaring TOOLS; drop ``type`` for HTTP.
    ``fields`` may replace any of them (``model``, ``input``, ``tools``) in place."""
    return messages.create({**messages.body(MODEL, [messages.user_message(script)], tools=TOOLS), **fields})


def user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def output(call_id: str, text: str = "ok") -> dict[str, Any]:
    return messages.function_call_output(call_id, text)


def outputs(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A short output for each of these calls (pending calls or function_call items)."""
    return [output(call["call_id"], f"{call['name']}: ok") for call in calls]


def tool_output(name: str, arguments: str) -> str:
    """The one output string every transport's rollout answers a call with, so their usage compares."""
    return f"{name} says: ok for {arguments} " + "line of output " * 20


def outputs_for(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_output of each function call in a response's output."""
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    return [output(item["call_id"], tool_output(item["name"], item["arguments"])) for item in calls]


def ten_turn_script() -> str:
    """Nine call turns (one of them parallel, one hosted), then the answer: ten sampling segments."""
    lines = ["Fix the failing test in the repo."]
    for turn in range(9):
        if turn == 3:
            lines.append('!call read_file {"path": "a.py"} | !call read_file {"path": "b.py"}')
        elif turn == 5:
            lines.append('!call web_search {"query": "python off-by-one"}')
        else:
            lines.append(f'!call {LOCAL_TOOLS[turn % 2 * 2]} {{"turn": {turn}}}')
    lines.append("!say Fixed.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ frames
async def recv(ws: ClientConnection) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), GUARD))
    return data


async def until(ws: ClientConnection, types: set[str] | frozenset[str]) -> list[dict[str, Any]]:
    """Frames up to and including the first whose type is in ``types``."""
    frames: list[dict[str, Any]] = []
    while True:
        frame = await recv(ws)
        frames.append(frame)
        if frame["type"] in types:
            return frames


def assert_error(frame: dict[str, Any], code: str, param: str | None) -> None:
    """The GA error envelope (docs/protocol.md, "Error shape") with this code, its registered status and type,
    and this param."""
    assert frame["type"] == "error", frame
    status, kind = ERROR_CODES[code]
    assert (frame["error"]["code"], frame["status"], frame["error"]["type"]) == (code, status, kind), frame
    assert frame["error"]["param"] == param, frame
    assert frame["error"]["message"], frame


DELTA_TYPES = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})


async def sse_read(lines: AsyncIterator[str], events: list[dict[str, Any]], deltas: int = 0) -> None:
    """Append the events of an SSE body's ``data:`` lines to ``events``: until ``deltas`` token deltas were
    read in all (then the stream is left open, to read on), or to the end of the body (``deltas`` 0)."""
    async for line in lines:
        if line.startswith("data: "):
            events.append(json.loads(line[len("data: ") :]))
            if deltas and sum(e["type"] in DELTA_TYPES for e in events) >= deltas:
                return


# ------------------------------------------------------------------------------------ one valid rollout each
async def longlived_rollout_ok(ws: ClientConnection) -> dict[str, Any]:
    """One valid long-lived rollout with a tool round-trip: create, answer both calls, completed."""
    await ws.send(json.dumps(create()))
    done = (await until(ws, {"response.done", *TERMINAL_OR_ERROR}))[-1]
    assert done["type"] == "response.done", done
    await ws.send(json.dumps(messages.append(outputs(done["pending_calls"]))))
    terminal = (await until(ws, {*TERMINAL_OR_ERROR, "response.done"}))[-1]
    assert terminal["type"] == "response.completed", terminal
    response: dict[str, Any] = terminal["response"]
    return response


async def ga_rollout_ok(ws: ClientConnection) -> None:
    """One valid GA rollout: a turn ending at two calls, then its continuation to the answer."""
    await ws.send(json.dumps(create(store=False)))
    first = (await until(ws, TERMINAL_OR_ERROR))[-1]
    assert first["type"] == "response.completed", first
    calls = [item for item in first["response"]["output"] if item["type"] == "function_call"]
    assert len(calls) == 2
    follow = messages.continuation(
        messages.body(MODEL, [], tools=TOOLS, store=False), outputs(calls), first["response"]["id"]
    )
    await ws.send(json.dumps(messages.create(follow)))
    second = (await until(ws, TERMINAL_OR_ERROR))[-1]
    assert second["type"] == "response.completed", second
    assert second["response"]["output"][-1]["type"] == "message"


async def http_rollout_ok(client: httpx.AsyncClient) -> None:
    body = create()
    del body["type"]
    reply = await client.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "completed"


# ------------------------------------------------------------------------------------ one rollout, each
# transport
# Every mode answers each call with tool_output, so the four transports see the same conversation and
# their token usage can be compared exactly.
async def http_rollout(
    url: str, script: str, previous: bool, key: str | None = None, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """``http`` (full history re-sent) or ``http-prev`` (previous_response_id + new items) to the end;
    ``headers`` are added to every request (``http-cached``'s)."""
    responses: list[dict[str, Any]] = []
    history: list[Any] = [{"role": "user", "content": script}]
    base = messages.body(MODEL, history, tools=ROLLOUT_TOOLS)
    body = base
    async with httpx.AsyncClient(
        base_url=url, headers={**auth(key), **(headers or {})}, timeout=60
    ) as client:
        while True:
            reply = await client.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            response = reply.json()
            responses.append(response)
            answers = outputs_for(response)
            if not answers:
                return responses
            if previous:
                body = messages.continuation(base, answers, response["id"])
            else:
                history = [*history, *response["output"], *answers]
                body = dict(base, input=history)


async def ga_events(ws: ClientConnection, event: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one GA ``response.create`` (flat), return every event up to its terminal one (or error)."""
    await ws.send(json.dumps(messages.create(event)))
    events: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await ws.recv())
        events.append(frame)
        if frame["type"] in TERMINAL_OR_ERROR:
            return events


async def ga_rollout(
    url: str, script: str, store: bool = False, key: str | None = None
) -> list[dict[str, Any]]:
    responses: list[dict[str, Any]] = []
    base = messages.body(MODEL, [messages.user_message(script)], tools=ROLLOUT_TOOLS, store=store)
    event = base
    async with connect(url, additional_headers=auth(key)) as ws:
        while True:
            events = await ga_events(ws, event)
            assert events[-1]["type"] == "response.completed", events[-1]
            response = events[-1]["response"]
            responses.append(response)
            answers = outputs_for(response)
            if not answers:
                return responses
            event = messages.continuation(base, answers, response["id"])


async def longlived_rollout(url: str, script: str) -> list[dict[str, Any]]:
    """The whole rollout in one long-lived response (a one-element list, like the other modes' lists)."""
    calls: dict[str, str] = {}

    def note(event: Any) -> None:
        # Tools get parsed args; keep the exact argument text the model wrote, as the other modes see it.
        item = event.data.get("item") if event.type == "response.output_item.done" else None
        if item and item.get("type") == "function_call":
            calls[json.dumps(json.loads(item["arguments"]), sort_keys=True)] = item["arguments"]

    def make(name: str) -> Any:
        async def run(args: dict[str, Any]) -> str:
            return tool_output(name, calls.pop(json.dumps(args, sort_keys=True)))

        return run

    async with LongLivedClient(url) as client:
        result = await client.rollout(
            messages.body(MODEL, [messages.user_message(script)], tools=ROLLOUT_TOOLS),
            {name: make(name) for name in LOCAL_TOOLS},
            on_event=note,
        )
    return [result.response]


# ------------------------------------------------------------------------------------ the lab on a trace
def bench_trace(path: Path, out: Path) -> dict[str, Any]:
    """``responses-lab bench --quick`` on a trace file, every mode, on the local profile (a real server
    process); its ``results.json``. Tool times × 0.002 and ten times the GPU's speed: the same tokens, a
    tenth of the modelled time (the tests read token counts and cache hits, never durations)."""
    from proto.lab.bench import main as bench_main  # the lab's import cost only where a test runs it

    flags = ["--quick", "--workload", str(path), "--profile", "local", "--tool-time-scale", "0.002"]
    flags += ["--no-predict", "--no-plots", "--pings", "10", "--warmup", "0", "--out", str(out)]
    flags += ["--rollouts", "1"]  # one rollout a session: the tests sum its tokens against the trace's
    flags += ["--model-override", "mock-4000tps:tokens-per-second=40000,prefill-time-per-token=0.0039"]
    assert bench_main(flags) == 0
    results: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return results
