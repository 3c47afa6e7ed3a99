"""Faults over a real server on loopback: a client that disconnects in every protocol state,
an engine that fails mid-stream, a client that stops reading, and SIGTERM with responses open.

After every fault the server is checked from the inside: no response or writer task left on its loop, every
mock GPU's batch slots free and its KV pins back where they were, exactly one ledger row per response created.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import wsproto
import wsproto.events as wse
from helpers import server_tasks, wait_for
from virtual import virtual
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from proto.core.events import TERMINAL_TYPES
from proto.processes import free_port
from proto.server.app import Server
from proto.server.serve import ThreadedServer

FAST = "mock-4000tps"  # conftest: a 1 ms prefill
SLOW = "mock-65tps"  # `!tokens 5000` streams for over a minute unless cancelled
FLAKY = "mock-1000tps"  # fail-rate=1 where a test asks for it: every turn dies mid-stream
GUARD = 10.0  # against hangs only; no assertion depends on timing
TOOLS = [{"type": "function", "name": "grep"}]
SessionState = Callable[..., Any]


def state(srv: ThreadedServer) -> Server:
    found: Server = srv.app.state.server  # type: ignore[attr-defined]
    return found


def create(script: str, model: str = FAST, **extra: Any) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "model": model,
            "input": [{"role": "user", "content": script}],
            "tools": TOOLS,
            **extra,
        }
    )


async def recv_until(ws: ClientConnection, stop: set[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), GUARD))
        events.append(event)
        if event["type"] in stop | {"error"}:
            return events


def gpu_gauges(srv: ThreadedServer) -> dict[str, tuple[float, float]]:
    return {
        name: (gpu.metrics()["running"], gpu.metrics()["kv_blocks_used"])
        for name, gpu in state(srv).pipeline.engines.gpus.items()
    }


async def assert_clean(
    srv: ThreadedServer, created: list[str], kv_before: dict[str, tuple[float, float]]
) -> None:
    """The fault left nothing behind: tasks, slots, pins; and billed each created response once."""
    server = state(srv)

    def leftovers() -> list[str]:
        return [
            n
            for n in server_tasks(srv)
            if n.startswith(("responses-lab-session", "response-", "ws-writer", "ws-ga-writer"))
        ]

    await wait_for(
        lambda: not server.connections and not leftovers(), "every session ended, its tasks with it"
    )
    await wait_for(lambda: gpu_gauges(srv) == kv_before, "GPU slots and KV pins released")
    server.pipeline.ledger.flush()
    rows = [row.response_id for row in server.pipeline.ledger.rows()]
    assert sorted(rows) == sorted(created), (rows, created)


# ----------------------------------------------------------------------------------------- disconnects

LONGLIVED_STATES = ["before_create", "streaming", "suspended", "mid_append", "after_terminal"]


async def drive_longlived(ws: ClientConnection, where: str) -> list[str]:
    """Bring a long-lived connection to ``where``; returns the ids of the responses it created."""
    if where == "before_create":
        return []
    if where == "streaming":
        await ws.send(create("!tokens 5000 !say never", SLOW))
        events = await recv_until(ws, {"response.output_text.delta"})
        return [events[0]["response"]["id"]]
    if where == "after_terminal":
        await ws.send(create("!say done"))
        events = await recv_until(ws, TERMINAL_TYPES)
        assert events[-1]["type"] == "response.completed"
        return [events[-1]["response"]["id"]]
    await ws.send(create("!call grep {}\n!tokens 5000 !say never", FAST if where == "suspended" else SLOW))
    done = (await recv_until(ws, {"response.done"}))[-1]
    assert done["type"] == "response.done", done
    if where == "mid_append":  # the resumed turn starts streaming as the client goes away
        output = {
            "type": "function_call_output",
            "call_id": done["pending_calls"][0]["call_id"],
            "output": "ok",
        }
        await ws.send(json.dumps({"type": "response.append", "input": [output]}))
    return [done["response"]["id"]]


async def drive_ga(ws: ClientConnection, where: str) -> list[str]:
    """GA mode's states: idle, streaming, between responses (the last one ended at a call, cached), a
    continuation just sent (the GA spelling of an append), after a completed response."""
    if where == "before_create":
        return []
    if where == "streaming":
        await ws.send(create("!tokens 5000 !say never", SLOW))
        events = await recv_until(ws, {"response.output_text.delta"})
        return [events[0]["response"]["id"]]
    if where == "after_terminal":
        await ws.send(create("!say done"))
        return [(await recv_until(ws, TERMINAL_TYPES))[-1]["response"]["id"]]
    await ws.send(create("!call grep {}\n!tokens 5000 !say never", SLOW))
    first = (await recv_until(ws, TERMINAL_TYPES))[-1]["response"]
    call = next(item for item in first["output"] if item["type"] == "function_call")
    if where == "suspended":
        return [first["id"]]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    await ws.send(
        json.dumps(
            {
                "type": "response.create",
                "model": SLOW,
                "input": [output],
                "tools": TOOLS,
                "previous_response_id": first["id"],
            }
        )
    )
    created = json.loads(await asyncio.wait_for(ws.recv(), GUARD))
    assert created["type"] == "response.created", created
    return [first["id"], created["response"]["id"]]


@pytest.mark.parametrize("how", ["close", "abort"])
@pytest.mark.parametrize("where", LONGLIVED_STATES)
@pytest.mark.parametrize("protocol", ["longlived", "ga"])
async def test_disconnect_in_every_state_leaves_nothing_behind(
    make_server: Any, protocol: str, where: str, how: str
) -> None:
    with make_server() as srv:
        before = gpu_gauges(srv)
        url = srv.url + ("?protocol=longlived" if protocol == "longlived" else "")
        async with connect(url) as ws:
            created = await (drive_longlived(ws, where) if protocol == "longlived" else drive_ga(ws, where))
            if how == "abort":
                ws.transport.abort()  # the TCP connection just drops
            else:
                await ws.close()
        await assert_clean(srv, created, before)


# ----------------------------------------------------------------------------------------- engine failure


async def test_engine_failure_fails_the_response_and_the_server_keeps_serving(make_server: Any) -> None:
    overrides = [f"{FAST}:prefill-overhead=1,prefill-time-per-token=0", f"{FLAKY}:fail-rate=1"]
    with make_server(model_override=overrides) as srv:
        before = gpu_gauges(srv)
        created: list[str] = []
        for url in (srv.url + "?protocol=longlived", srv.url):
            async with connect(url) as ws:
                await ws.send(create("!say hello", FLAKY))
                failed = (await recv_until(ws, TERMINAL_TYPES))[-1]
                assert failed["type"] == "response.failed", failed
                assert failed["response"]["error"]["code"] == "engine_failure"
                await ws.send(create("!say still here"))  # same connection, a healthy model
                ok = (await recv_until(ws, TERMINAL_TYPES))[-1]
                assert ok["type"] == "response.completed", ok
                created += [failed["response"]["id"], ok["response"]["id"]]
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
            body = {"model": FLAKY, "input": "hello", "store": False}
            refused = await http.post("/v1/responses", json=body)
            # Nothing was sent before the failure: the OpenAI error body, with engine_failure's 500.
            assert refused.status_code == 500 and refused.json()["error"]["code"] == "engine_failure", (
                refused.text
            )
            ok = (await http.post("/v1/responses", json={**body, "model": FAST})).json()
            assert ok["status"] == "completed"
            ledger = state(srv).pipeline.ledger
            ledger.flush()
            created += [row.response_id for row in ledger.rows(mode="http") if row.status == "failed"] + [
                ok["id"]
            ]
        await assert_clean(srv, created, before)
        statuses = sorted(row.status for row in state(srv).pipeline.ledger.rows())
        assert statuses == ["completed"] * 3 + ["failed"] * 3


# ----------------------------------------------------------------------------------------- slow reader


class RawClient:
    """A WebSocket client on a plain socket with a tiny receive buffer, so a test can stop reading and
    make the server's buffers fill up within a few hundred frames."""

    def __init__(self, host: str, port: int, target: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(GUARD)
        self.sock.connect((host, port))
        self.conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.sock.sendall(self.conn.send(wse.Request(host=f"{host}:{port}", target=target)))
        assert any(isinstance(e, wse.AcceptConnection) for e in self.read_events())

    def send_text(self, text: str) -> None:
        self.sock.sendall(self.conn.send(wse.TextMessage(data=text)))

    def read_events(self) -> list[wse.Event]:
        data = self.sock.recv(65536)
        self.conn.receive_data(data or None)
        return list(self.conn.events())

    def read_to_close(self) -> tuple[int | None, int]:
        """Read everything the server still sends: (close code or None, text frames seen)."""
        frames = 0
        while True:
            for event in self.read_events():
                if isinstance(event, wse.CloseConnection):
                    return event.code, frames
                if isinstance(event, wse.TextMessage) and event.message_finished:
                    frames += 1
            if self.conn.state is wsproto.connection.ConnectionState.CLOSED:
                return None, frames


@pytest.mark.process
@pytest.mark.parametrize("protocol", ["longlived", "ga"])
async def test_a_slow_reader_is_held_back_then_disconnected(protocol: str) -> None:
    tokens = 200_000  # 50 s of output at 4000 tokens/s: far more than every buffer on the way holds
    # More output than the model's max-output-tokens allows by default: the knob is raised for this test.
    model = f"{FAST}:prefill-overhead=1,prefill-time-per-token=0,max-output-tokens={tokens}"
    async with virtual(
        send_queue=32, send_timeout_s=1.0, model_override=[model]
    ) as virtual_server:  # the send timeout on virtual time
        srv = virtual_server.server
        server = state(srv)
        before = gpu_gauges(srv)
        target = "/v1/responses" + ("?protocol=longlived" if protocol == "longlived" else "")
        client = RawClient(srv.settings.host, srv.settings.port, target)
        client.send_text(create(f"!tokens {tokens} !say never"))  # and never read
        await wait_for(lambda: bool(server.connections), "the session started")
        session = next(iter(server.connections))
        await wait_for(lambda: session.out.qsize() >= 32, "the send queue filled: the sampler waits")
        assert session.stopping is None  # held back, not yet given up on
        await virtual_server.advance_until(
            1.0, lambda: session.stopping is not None, "the slow reader was given up on"
        )
        # the client reads again: the close comes through
        code, frames = await asyncio.to_thread(client.read_to_close)
        client.sock.close()
        assert code == 1008
        assert session.out.peak <= 32  # the bound held: the sampler waited instead of queueing
        await wait_for(lambda: not server.connections, "the session ended")
        server.pipeline.ledger.flush()
        [row] = server.pipeline.ledger.rows()
        assert row.status == "cancelled"
        assert row.output_tokens < tokens  # back-pressure stopped the sampler long before the end
        assert frames < tokens
        await wait_for(lambda: gpu_gauges(srv) == before, "GPU slots and KV pins released")


# ----------------------------------------------------------------------------------------- SIGTERM


@pytest.mark.process
async def test_sigterm_ends_open_responses_with_an_error_and_1001_and_flushes_the_ledger(
    tmp_path: Path,
) -> None:
    db = tmp_path / "lab.db"
    port = free_port()
    script = Path(sys.executable).with_name("responses-lab")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "proto"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}
    server = await asyncio.create_subprocess_exec(
        *command, "serve", "--port", str(port), "--db", str(db), "--shutdown-grace-s", "5",
        "--model-override", f"{FAST}:prefill-overhead=1,prefill-time-per-token=0",
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=GUARD) as http:
            for _ in range(500):
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.02)
            stored = (
                await http.post("/v1/responses", json={"model": FAST, "input": "!say kept", "store": True})
            ).json()
        url = f"ws://127.0.0.1:{port}/v1/responses"
        async with (
            connect(url + "?protocol=longlived") as suspended,
            connect(url + "?protocol=longlived") as streaming,
            connect(url) as ga_streaming,
            connect(url) as idle,
        ):
            ids = [
                (await drive_longlived(suspended, "suspended"))[0],
                (await drive_longlived(streaming, "streaming"))[0],
            ]
            ids += await drive_ga(ga_streaming, "streaming")
            server.send_signal(signal.SIGTERM)
            for ws in (suspended, streaming, ga_streaming):
                error = (await recv_until(ws, set()))[-1]
                assert error["type"] == "error" and error["error"]["code"] == "server_shutting_down", error
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), GUARD)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(idle.recv(), GUARD)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        # uvicorn re-raises the signal once its shutdown is done: "killed by SIGTERM", after a clean exit
        # path.
        assert await asyncio.wait_for(server.wait(), 30) in (0, -signal.SIGTERM)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    with sqlite3.connect(db) as sql:
        billed = dict(sql.execute("SELECT response_id, status FROM usage").fetchall())
        kept = sql.execute("SELECT response_id FROM responses").fetchall()
    assert billed == {stored["id"]: "completed", **dict.fromkeys(ids, "cancelled")}
    assert kept == [(stored["id"],)]
