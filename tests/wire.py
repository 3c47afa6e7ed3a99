"""Low-level wire helpers for the hardening tests: raw frames over ``websockets``, a raw RFC 6455 socket
for what a conforming client cannot send, and one valid rollout per transport to show that a connection
still serves after it refused something."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import wsproto
from websockets.asyncio.client import ClientConnection
from wsproto.events import AcceptConnection, CloseConnection, Request

from proto.errors import ERROR_CODES

MODEL = "mock-4000tps"
TOOLS: list[dict[str, Any]] = [{"type": "function", "name": "grep"}, {"type": "function", "name": "read_file"}]
TWO_CALLS = 'Go.\n!call grep {"q": 1} | !call read_file {"path": "a.py"}\n!say done'
RECV_TIMEOUT = 10.0  # a guard against hangs only
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def create(script: str = TWO_CALLS, **fields: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": MODEL, "input": [{"role": "user", "content": script}], "tools": TOOLS, **fields}


async def recv(ws: ClientConnection) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT))
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
    """The GA error envelope (SPEC §2) with this code, its registered status and type, and this param."""
    assert frame["type"] == "error", frame
    status, kind = ERROR_CODES[code]
    assert (frame["error"]["code"], frame["status"], frame["error"]["type"]) == (code, status, kind), frame
    assert frame["error"]["param"] == param, frame
    assert frame["error"]["message"], frame


def outputs(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": call["call_id"], "output": f"{call['name']}: ok"} for call in calls]


async def longlived_rollout_ok(ws: ClientConnection) -> dict[str, Any]:
    """One valid long-lived rollout with a tool round-trip: create, answer both calls, completed."""
    await ws.send(json.dumps(create()))
    done = (await until(ws, {"response.done", *TERMINAL, "error"}))[-1]
    assert done["type"] == "response.done", done
    await ws.send(json.dumps({"type": "response.append", "input": outputs(done["pending_calls"])}))
    terminal = (await until(ws, {*TERMINAL, "error", "response.done"}))[-1]
    assert terminal["type"] == "response.completed", terminal
    response: dict[str, Any] = terminal["response"]
    return response


async def ga_rollout_ok(ws: ClientConnection) -> None:
    """One valid GA rollout: a turn ending at two calls, then its continuation to the answer."""
    await ws.send(json.dumps(create(store=False)))
    first = (await until(ws, {*TERMINAL, "error"}))[-1]
    assert first["type"] == "response.completed", first
    calls = [item for item in first["response"]["output"] if item["type"] == "function_call"]
    assert len(calls) == 2
    follow = {"type": "response.create", "model": MODEL, "tools": TOOLS, "store": False, "previous_response_id": first["response"]["id"], "input": outputs(calls)}
    await ws.send(json.dumps(follow))
    second = (await until(ws, {*TERMINAL, "error"}))[-1]
    assert second["type"] == "response.completed", second
    assert second["response"]["output"][-1]["type"] == "message"


async def http_rollout_ok(client: httpx.AsyncClient) -> None:
    body = create()
    del body["type"]
    reply = await client.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "completed"


def raw_invalid_utf8_close_code(url: str) -> int | None:
    """Open a WebSocket on a plain socket and send one *text* frame whose payload is not UTF-8 (no
    conforming client library will): the close code the server answers with, or None if it just hung up."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    with socket.create_connection((host, port), timeout=RECV_TIMEOUT) as sock:
        sock.sendall(conn.send(Request(host=f"{host}:{port}", target=target)))
        accepted = False
        while not accepted:
            conn.receive_data(sock.recv(65536))
            accepted = any(isinstance(event, AcceptConnection) for event in conn.events())
        payload = b'{"type": "response.create", "input": "\xff\xfe"}'
        mask = os.urandom(4)
        masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)  # FIN + text; masked, short length
        while True:
            data = sock.recv(65536)
            if not data:
                return None
            conn.receive_data(data)
            for event in conn.events():
                if isinstance(event, CloseConnection):
                    return event.code
