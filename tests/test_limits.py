"""The server's limits (docs/operations.md, "Limits"), each over the wire on its own server. Frame size, tools
and
input items per event are also cases of the bad-input matrix (tests/test_bad_input.py)."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest
from helpers import (
    MODEL,
    TOOLS,
    assert_error,
    create,
    ga_rollout_ok,
    longlived_rollout_ok,
    outputs,
    recv,
    running,
    until,
)
from virtual import virtual
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from proto.core.events import TERMINAL_TYPES
from proto.server.config import Settings, add_arguments, from_args
from proto.server.transports.timers import ConnectionTimers

pytestmark = pytest.mark.process  # every test starts a server or a process

THREE_CALLS = 'Go.\n!call grep {"a": 1} | !call grep {"b": 2} | !call read_file {"c": 3}\n!say done'
LIMITS = {
    "max_frame_bytes": "1234",
    "max_input_items": "5",
    "max_tools": "6",
    "max_pending_calls": "7",
    "tool_timeout_s": "8.5",
    "idle_timeout_s": "9.5",
    "connection_max_age_s": "10.5",
}


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_each_limit_is_a_flag_and_an_environment_variable(name: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flag = "--" + name.replace("_", "-")
    by_flag = from_args(parser.parse_args([flag, LIMITS[name]]), environ={})
    by_env = from_args(parser.parse_args([]), environ={"RESPONSES_LAB_" + name.upper(): LIMITS[name]})
    assert str(getattr(by_flag, name)) == str(getattr(by_env, name)) == LIMITS[name]
    assert getattr(Settings(), name) > 0  # a default that is a limit, not "off"


def test_timers_idle_only_without_an_open_response_and_age_polls_a_running_one() -> None:
    timers = ConnectionTimers(opened_at=0.0, max_age_s=100.0, idle_timeout_s=10.0)
    assert timers.due_in(0.0, busy=False) == 10.0
    assert not timers.idle(50.0, busy=True) and timers.idle(50.0, busy=False)
    timers.touch(45.0)
    assert timers.due_in(50.0, busy=False) == 5.0 and not timers.idle(50.0, busy=False)
    assert timers.due_in(50.0, busy=True) == 2.5  # checks back: a response's end cannot wake the reader
    assert not timers.aged(99.9) and timers.aged(100.0)
    assert 0 < timers.due_in(100.0, busy=True) < 1  # past the age: poll until the response suspends or ends
    assert timers.due_in(100.0, busy=False) == 0.0


async def closed_with(ws: ClientConnection) -> tuple[int, str]:
    """Read until the server closes; its close code and reason."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await recv(ws)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


def ll(url: str) -> str:
    return url + "?protocol=longlived"


# ------------------------------------------------------------------------------------ pending calls
async def test_too_many_pending_calls_fails_the_response_and_the_connection_serves_on() -> None:
    with running(max_pending_calls=2) as srv:
        async with connect(ll(srv.url)) as ws:
            await ws.send(json.dumps(create(THREE_CALLS)))
            events = await until(ws, {*TERMINAL_TYPES, "response.done", "error"})
            terminal = events[-1]
            assert terminal["type"] == "response.failed", terminal
            assert terminal["response"]["error"]["code"] == "too_many_pending_calls"
            assert "response.done" not in [e["type"] for e in events]  # never suspended on the excess
            await longlived_rollout_ok(ws)  # two parallel calls: at the limit, allowed


async def test_pending_calls_limit_is_long_lived_only() -> None:
    """HTTP and GA hold no pending calls: the calls go back in the output and the client holds them."""
    with running(max_pending_calls=2) as srv:
        async with connect(srv.url) as ws:
            await ws.send(json.dumps(create(THREE_CALLS, store=False)))
            terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.completed", terminal
        assert [item["type"] for item in terminal["response"]["output"]].count("function_call") == 3
        async with httpx.AsyncClient(base_url=srv.http_url) as client:
            body = {"model": MODEL, "input": THREE_CALLS, "tools": TOOLS}
            reply = await client.post("/v1/responses", json=body)
        assert reply.status_code == 200 and len(reply.json()["output"]) == 3


# ------------------------------------------------------------------------------------ idle
# Every limit below runs on virtual time (tests/virtual.py): the test says how much time passes.
@pytest.mark.parametrize("protocol", ["longlived", "ga"])
async def test_idle_connection_is_closed_1000(protocol: str) -> None:
    async with virtual(idle_timeout_s=0.3) as srv:
        url = ll(srv.url) if protocol == "longlived" else srv.url
        async with connect(url) as ws:
            await srv.advance(0.29)
            await (longlived_rollout_ok(ws) if protocol == "longlived" else ga_rollout_ok(ws))  # still open
            await srv.advance(0.3)
            assert await closed_with(ws) == (1000, "idle_timeout")


@pytest.mark.parametrize("protocol", ["longlived", "ga"])
async def test_idle_clock_starts_after_the_last_response(protocol: str) -> None:
    async with virtual(idle_timeout_s=0.5) as srv:
        url = ll(srv.url) if protocol == "longlived" else srv.url
        async with connect(url) as ws:
            for _ in range(4):  # frames keep it open however long it lives
                await (longlived_rollout_ok(ws) if protocol == "longlived" else ga_rollout_ok(ws))
                await srv.advance(0.3)
            await srv.advance(0.25)
            assert await closed_with(ws) == (1000, "idle_timeout")


async def test_a_suspended_response_is_governed_by_the_tool_timeout_not_idle() -> None:
    async with virtual(idle_timeout_s=0.2, tool_timeout_s=0.8) as srv, connect(ll(srv.url)) as ws:
        await ws.send(json.dumps(create()))
        events = await until(ws, {*TERMINAL_TYPES, "response.done", "error"})
        assert events[-1]["type"] == "response.done"
        await srv.advance(0.7)  # idle would have closed it three times over: a suspended response is not idle
        await srv.advance(0.15)
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.incomplete", terminal
        assert terminal["response"]["incomplete_details"]["reason"] == "tool_timeout"
        await srv.advance(0.25)
        assert await closed_with(ws) == (1000, "idle_timeout")


# ------------------------------------------------------------------------------------ tool timeout
async def test_tool_timeout_ends_the_response_and_the_connection_serves_on() -> None:
    async with virtual(tool_timeout_s=0.3) as srv, connect(ll(srv.url)) as ws:
        await ws.send(json.dumps(create()))
        events = await until(ws, {*TERMINAL_TYPES, "response.done", "error"})
        done = events[-1]
        assert done["type"] == "response.done"
        await srv.advance(0.3)
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["response"]["incomplete_details"]["reason"] == "tool_timeout"
        await ws.send(json.dumps({"type": "response.append", "input": outputs(done["pending_calls"])}))
        assert_error(await recv(ws), "response_already_completed", None)  # too late: typed, not a crash
        await longlived_rollout_ok(ws)


async def test_tool_timeout_does_not_apply_to_ga_where_nothing_waits_server_side() -> None:
    async with virtual(tool_timeout_s=0.2) as srv, connect(srv.url) as ws:
        await ws.send(json.dumps(create(store=False)))
        first = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        calls = [item for item in first["response"]["output"] if item["type"] == "function_call"]
        await srv.advance(0.5)  # longer than the tool timeout: the cached response is still there
        follow = {
            "type": "response.create",
            "model": MODEL,
            "tools": TOOLS,
            "store": False,
            "previous_response_id": first["response"]["id"],
            "input": outputs(calls),
        }
        await ws.send(json.dumps(follow))
        second = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert second["type"] == "response.completed", second


# ------------------------------------------------------------------------------------ connection age
async def aged(ws: ClientConnection) -> None:
    """The end of an aged connection: one typed error, then close 1000 with the code as reason."""
    assert_error((await until(ws, {"error"}))[-1], "websocket_connection_limit_reached", None)
    assert await closed_with(ws) == (1000, "websocket_connection_limit_reached")


async def test_longlived_age_limit_closes_an_idle_connection() -> None:
    async with virtual(connection_max_age_s=0.3) as srv, connect(ll(srv.url)) as ws:
        await srv.advance(0.3)
        await aged(ws)


async def test_longlived_age_limit_ends_a_suspended_response_with_its_terminal_event() -> None:
    async with virtual(connection_max_age_s=0.5) as srv, connect(ll(srv.url)) as ws:
        await ws.send(json.dumps(create()))
        events = await until(ws, {*TERMINAL_TYPES, "response.done", "error"})
        assert events[-1]["type"] == "response.done"
        await srv.advance(0.5)
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.incomplete", terminal
        assert terminal["response"]["incomplete_details"]["reason"] == "websocket_connection_limit_reached"
        await aged(ws)


async def test_longlived_age_limit_lets_a_streaming_response_finish() -> None:
    async with virtual(connection_max_age_s=0.2) as srv, connect(ll(srv.url)) as ws:
        await ws.send(json.dumps(create("!tokens 4000 !say long")))  # ~1 s of real decode at 4000 tokens/s
        await until(ws, {"response.output_text.delta"})
        await srv.advance(0.2)  # aged while streaming: the response is let finish
        terminal = (await until(ws, {*TERMINAL_TYPES, "error"}))[-1]
        assert terminal["type"] == "response.completed", terminal
        await srv.advance(0.1)  # the next check after the response ended closes the connection
        await aged(ws)
