"""Test helpers: a real server on loopback, and one rollout driven over each transport.

Every mode answers each call with the same output string, so the four transports see the same
conversation and their token usage can be compared exactly.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from proto.client.longlived import LongLivedClient
from proto.server.app import Server
from proto.server.config import Settings
from proto.server.run import ThreadedServer

MODEL = "mock-4000tps"
# A 1 ms prefill: a ten-turn rollout costs milliseconds of modelled GPU time.
SETTINGS = Settings(db=":memory:", port=0, model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0"])
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})

TOOL_NAMES = ("grep", "read_file", "run_tests")
TOOLS: list[dict[str, Any]] = [{"type": "function", "name": name} for name in TOOL_NAMES] + [{"type": "web_search"}]


def ten_turn_script() -> str:
    """Nine call turns (one of them parallel, one hosted), then the answer: ten sampling segments."""
    lines = ["Fix the failing test in the repo."]
    for turn in range(9):
        if turn == 3:
            lines.append('!call read_file {"path": "a.py"} | !call read_file {"path": "b.py"}')
        elif turn == 5:
            lines.append('!call web_search {"query": "python off-by-one"}')
        else:
            lines.append(f'!call {TOOL_NAMES[turn % 2 * 2]} {{"turn": {turn}}}')
    lines.append("!say Fixed.")
    return "\n".join(lines)


def tool_output(name: str, arguments: str) -> str:
    return f"{name} says: ok for {arguments} " + "line of output " * 20


@contextlib.contextmanager
def running(**overrides: object) -> Iterator[ThreadedServer]:
    server = ThreadedServer(replace(SETTINGS, **overrides))  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def state(server: ThreadedServer) -> Server:
    found: Server = server.app.state.server  # type: ignore[attr-defined]
    return found


def outputs_for(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": tool_output(item["name"], item["arguments"])}
        for item in response["output"]
        if item["type"] == "function_call"
    ]


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def http_rollout(url: str, script: str, previous: bool, key: str | None = None) -> list[dict[str, Any]]:
    """``http`` (full history re-sent) or ``http-prev`` (previous_response_id + new items) to the end."""
    responses: list[dict[str, Any]] = []
    history: list[Any] = [{"role": "user", "content": script}]
    body: dict[str, Any] = {"model": MODEL, "input": history, "tools": TOOLS}
    async with httpx.AsyncClient(base_url=url, headers=headers(key), timeout=60) as client:
        while True:
            reply = await client.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            response = reply.json()
            responses.append(response)
            outputs = outputs_for(response)
            if not outputs:
                return responses
            if previous:
                body = {"model": MODEL, "input": outputs, "tools": TOOLS, "previous_response_id": response["id"]}
            else:
                history = [*history, *response["output"], *outputs]
                body = {"model": MODEL, "input": history, "tools": TOOLS}


async def ga_events(ws: ClientConnection, event: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one GA ``response.create`` (flat), return every event up to its terminal one (or error)."""
    await ws.send(json.dumps({"type": "response.create", **event}))
    events: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await ws.recv())
        events.append(frame)
        if frame["type"] in TERMINAL:
            return events


async def ga_rollout(url: str, script: str, store: bool = False, key: str | None = None) -> list[dict[str, Any]]:
    responses: list[dict[str, Any]] = []
    event: dict[str, Any] = {"model": MODEL, "input": [{"role": "user", "content": script}], "tools": TOOLS, "store": store}
    async with connect(url, additional_headers=headers(key)) as ws:
        while True:
            events = await ga_events(ws, event)
            assert events[-1]["type"] == "response.completed", events[-1]
            response = events[-1]["response"]
            responses.append(response)
            outputs = outputs_for(response)
            if not outputs:
                return responses
            event = {"model": MODEL, "input": outputs, "tools": TOOLS, "store": store, "previous_response_id": response["id"]}


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
            {"model": MODEL, "input": [{"role": "user", "content": script}], "tools": TOOLS},
            {name: make(name) for name in TOOL_NAMES},
            on_event=note,
        )
    return [result.response]
