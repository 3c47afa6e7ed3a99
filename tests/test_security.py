"""Security over a real server (docs/operations.md, "Security"): the key on every endpoint, the WebSocket
handshake
included; keys and message text never in the logs; previous_response_id isolated per key on both
WebSocket protocols (HTTP's GET/DELETE/input_items/previous_response_id isolation: tests/test_http.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from helpers import GUARD, MODEL, auth, clean_env, cli_command, wait_healthy
from starlette.routing import Route, WebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from proto.processes import free_port
from proto.server.logs import configure

KEYS = ["sk-alice-0123456789abcdef", "sk-bob-fedcba9876543210"]
SECRET_TEXT = "the launch code is PLUTONIUM-42"

# Every route of the app: a new one without an entry here fails test_every_route_is_listed.
HTTP_ENDPOINTS = [
    ("POST", "/v1/responses"),
    ("POST", "/v1/responses/compact"),
    ("POST", "/v1/responses/input_tokens"),
    ("GET", "/v1/responses/resp_x"),
    ("DELETE", "/v1/responses/resp_x"),
    ("GET", "/v1/responses/resp_x/input_items"),
    ("POST", "/v1/responses/resp_x/cancel"),
    ("POST", "/v1/conversations"),
    ("GET", "/v1/conversations/conv_x"),
    ("POST", "/v1/conversations/conv_x"),
    ("DELETE", "/v1/conversations/conv_x"),
    ("POST", "/v1/conversations/conv_x/items"),
    ("GET", "/v1/conversations/conv_x/items"),
    ("GET", "/v1/conversations/conv_x/items/msg_x"),
    ("DELETE", "/v1/conversations/conv_x/items/msg_x"),
    ("GET", "/v1/models"),
    (
        "GET",
        "/healthz",
        # authenticated too: docs/protocol.md, "Authentication" says every endpoint (a load balancer gets a
        # key)
    ),
    ("GET", "/metrics"),
]
# Open by design: vLLM's ``/health`` (its key guards only ``/v1`` paths), so a gateway built for vLLM probes
# this server unmodified; it answers an empty body (docs/protocol.md, "Authentication").
OPEN_ENDPOINTS = [("GET", "/health")]
WS_PROTOCOLS = ["", "?protocol=longlived"]


def test_every_route_is_listed(make_server: Any) -> None:
    with make_server(api_key=KEYS) as srv:
        http = {
            (method, route.path)
            for route in srv.app.routes
            if isinstance(route, Route)
            for method in route.methods or ()
        }
        ws = {route.path for route in srv.app.routes if isinstance(route, WebSocketRoute)}
    listed = {
        (method, path.replace("resp_x", "{response_id}").replace("conv_x", "{conversation_id}"))
        for method, path in [*HTTP_ENDPOINTS, *OPEN_ENDPOINTS]
    }
    listed = {(method, path.replace("msg_x", "{item_id}")) for method, path in listed}
    assert {(m, p) for m, p in http if m != "HEAD"} == listed
    assert ws == {"/v1/responses"}


async def test_every_endpoint_and_the_handshake_refuse_a_missing_or_wrong_key(make_server: Any) -> None:
    with make_server(api_key=KEYS) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
            for method, path in HTTP_ENDPOINTS:
                for key in (None, "sk-wrong", KEYS[0] + "x"):
                    reply = await http.request(
                        method, path, headers=auth(key), json={"model": MODEL, "input": "hi"}
                    )
                    assert reply.status_code == 401, (method, path, key)
                    assert reply.json()["error"]["code"] == "unauthorized"
                reply = await http.request(
                    method, path, headers=auth(KEYS[1]), json={"model": MODEL, "input": "hi"}
                )
                assert reply.status_code != 401, (method, path)
            scheme_only = await http.get("/healthz", headers={"Authorization": KEYS[0]})  # no "Bearer"
            assert scheme_only.status_code == 401
            for method, path in OPEN_ENDPOINTS:  # vLLM's answer, with or without a key
                for key in (None, "sk-wrong", KEYS[0]):
                    reply = await http.request(method, path, headers=auth(key))
                    assert (reply.status_code, reply.content) == (200, b""), (path, key)
        for query in WS_PROTOCOLS:
            for key in (None, "sk-wrong"):
                with pytest.raises(InvalidStatus) as refused:
                    await connect(srv.url + query, additional_headers=auth(key))
                assert refused.value.response.status_code == 401  # refused before the upgrade
            async with connect(srv.url + query, additional_headers=auth(KEYS[0])):
                pass


@pytest.mark.parametrize("query", WS_PROTOCOLS, ids=["ga", "longlived"])
async def test_previous_response_id_of_another_key_is_not_found_over_websocket(
    make_server: Any, query: str
) -> None:
    with make_server(api_key=KEYS) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url, headers=auth(KEYS[0]), timeout=GUARD) as alice:
            mine = (
                await alice.post("/v1/responses", json={"model": MODEL, "input": "!say mine", "store": True})
            ).json()
        event = {
            "type": "response.create",
            "model": MODEL,
            "input": "more",
            "previous_response_id": mine["id"],
            "store": True,
        }
        async with connect(srv.url + query, additional_headers=auth(KEYS[1])) as bob:
            await bob.send(json.dumps(event))
            reply = json.loads(await asyncio.wait_for(bob.recv(), GUARD))
            assert reply["type"] == "error" and reply["error"]["code"] == "previous_response_not_found", reply
        async with connect(
            srv.url + query, additional_headers=auth(KEYS[0])
        ) as owner:  # the owner chains on it
            await owner.send(json.dumps(event))
            while (reply := json.loads(await asyncio.wait_for(owner.recv(), GUARD)))["type"] not in (
                "response.completed",
                "error",
            ):
                pass
            assert reply["type"] == "response.completed", reply


def test_the_redaction_runs_over_every_field_and_tracebacks() -> None:
    configure("debug")
    processors = structlog.get_config()["processors"][:-1]  # everything up to the renderer
    try:
        raise ValueError(f"bad header Authorization: Bearer {KEYS[0]}")
    except ValueError as exc:
        event: Any = {
            "event": "x",
            "api_key": KEYS[1],
            "Authorization": "Bearer " + KEYS[1],
            "exc_info": exc,
            "note": f"bearer {KEYS[0]}",
        }
    for processor in processors:
        event = processor(None, "error", event)
    assert KEYS[0] not in json.dumps(event) and KEYS[1] not in json.dumps(event)


@pytest.mark.process
async def test_keys_and_message_text_never_reach_the_server_log(tmp_path: Path) -> None:
    """A real server at debug level; its whole output is read back after every kind of traffic."""
    logged = await _server_log_after_traffic(tmp_path)
    assert "response_ended" in logged  # the server did log (debug level): it just never logged secrets
    for secret in [*KEYS, SECRET_TEXT, "PLUTONIUM"]:
        assert secret not in logged


@pytest.mark.process
async def test_log_text_logs_message_text_but_still_never_a_key(tmp_path: Path) -> None:
    logged = await _server_log_after_traffic(tmp_path, "--log-text")
    assert SECRET_TEXT in logged  # the debugging aid does what it says
    for key in KEYS:
        assert key not in logged


async def _server_log_after_traffic(tmp_path: Path, *extra: str) -> str:
    port = free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log_file:
        server = await asyncio.create_subprocess_exec(
            *cli_command(), "serve", "--port", str(port), "--db", ":memory:", "--log-level", "debug",
            "--api-key", KEYS[0], "--api-key", KEYS[1],
            "--model-override", f"{MODEL}:prefill-overhead=1", *extra,
            env=clean_env(), stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", headers=auth(KEYS[0]), timeout=GUARD
            ) as http:
                await wait_healthy(http)
                body = {"model": MODEL, "input": f"{SECRET_TEXT}\n!say {SECRET_TEXT}"}
                assert (await http.post("/v1/responses", json=body)).status_code == 200
                await http.post("/v1/responses", json={**body, "model": "nope"})  # an error path
                await http.get("/v1/models", headers=auth("sk-wrong-" + KEYS[1]))  # a refused key
            url = f"ws://127.0.0.1:{port}/v1/responses?protocol=longlived"
            async with connect(url, additional_headers=auth(KEYS[1])) as ws:
                await ws.send(json.dumps({"type": "response.create", **body}))
                while json.loads(await asyncio.wait_for(ws.recv(), GUARD))["type"] != "response.completed":
                    pass
                await ws.send(f"not json {SECRET_TEXT}")
                await asyncio.wait_for(ws.recv(), GUARD)
        finally:
            server.terminate()
            await asyncio.wait_for(server.wait(), 30)
    return log_path.read_text()


async def test_health_answers_503_once_the_server_stops_taking_work(make_server: Any) -> None:
    """vLLM answers 503 when its engine cannot serve; this server once it drains for shutdown."""
    with make_server(api_key=KEYS) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
            assert (await http.get("/health")).status_code == 200
            assert srv.loop is not None
            drained = asyncio.run_coroutine_threadsafe(srv.app.state.server.drain(0), srv.loop)
            assert await asyncio.wrap_future(drained) == 0
            reply = await http.get("/health")
            assert (reply.status_code, reply.content) == (503, b"")
