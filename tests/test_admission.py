"""Admission (docs/protocol.md, "Admission"): a create past the limit is refused at the door — 429
``rate_limit_exceeded`` with a retry hint over HTTP, the same code in the GA error envelope on both WebSocket
protocols — before anything starts; work already admitted runs to its end.

Each server here gives its model a tiny engine (one batch slot, one or two waiting places), so the limit
(max-num-seqs + max-waiting) is reached by holding a few long-lived responses suspended on their calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import httpx
import pytest
from helpers import (
    GUARD,
    MODEL,
    SETTINGS,
    TERMINAL_OR_ERROR,
    TOOLS,
    assert_error,
    create,
    outputs,
    running,
    state,
    until,
    wait_for,
)
from openai import AsyncOpenAI
from websockets.asyncio.client import ClientConnection, connect

from proto.client import messages
from proto.core.errors import ERROR_CODES, ClientError
from proto.engine.client import RemoteModel, card_capacity
from proto.server.admission import Admission
from proto.server.config import Settings, add_arguments, from_args
from proto.server.pipeline import Engines
from proto.server.serve import ThreadedServer
from sampler.clock import FakeClock

RETRY_MS = 100.0  # the servers' retry hint: the SDK test waits about this long per attempt
ONE_CALL = '!call grep {"q": "x"}\n!say done'


def tiny(waiting: int) -> str:
    """The test model on an engine of one batch slot and ``waiting`` waiting places: 1 + waiting open."""
    return f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0,max-num-seqs=1,max-waiting={waiting}"


@pytest.fixture
def srv() -> Iterator[ThreadedServer]:  # a ``process`` fixture (tests/conftest.py)
    """Room for two open responses."""
    with running(model_override=[tiny(1)], retry_after_ms=RETRY_MS) as server:
        yield server


def http_body(script: str = ONE_CALL, **fields: Any) -> dict[str, Any]:
    body = create(script, **fields)
    del body["type"]
    return body


def shed(server: ThreadedServer) -> int:
    return state(server).pipeline.admission.shed.get(MODEL, 0)


def admitted(server: ThreadedServer) -> int:
    return state(server).pipeline.admission.open.get(MODEL, 0)


class Held:
    """Long-lived responses suspended on their calls: each holds one place until ``finish``."""

    def __init__(self, server: ThreadedServer, stack: AsyncExitStack) -> None:
        self.url = server.url + "?protocol=longlived"
        self.stack = stack
        self.open: list[tuple[ClientConnection, dict[str, Any]]] = []

    async def hold(self, count: int) -> None:
        for _ in range(count):
            ws = await self.stack.enter_async_context(connect(self.url))
            await ws.send(json.dumps(create(ONE_CALL)))
            done = (await until(ws, {"response.done", *TERMINAL_OR_ERROR}))[-1]
            assert done["type"] == "response.done", done
            self.open.append((ws, done))

    async def finish(self) -> None:
        """Answer every held response's call: each completes (admitted work is never shed)."""
        for ws, done in self.open:
            await ws.send(json.dumps(messages.append(outputs(done["pending_calls"]))))
            terminal = (await until(ws, {*TERMINAL_OR_ERROR, "response.done"}))[-1]
            assert terminal["type"] == "response.completed", terminal
        self.open = []


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


def assert_refused(frame: dict[str, Any]) -> None:
    """The GA error envelope of a refused create, with its retry hint in ``headers``."""
    assert_error(frame, "rate_limit_exceeded", None)
    hint = frame["headers"]
    assert RETRY_MS / 2 <= int(hint["retry-after-ms"]) <= RETRY_MS * 1.5, hint
    assert hint["retry-after"] == "1", hint


# ------------------------------------------------------------------------------------------ the rule
def test_the_limit_is_the_engines_room_and_max_admitted_only_lowers_it() -> None:
    clock = FakeClock()

    def limit(**fields: Any) -> int | None:
        settings = replace(SETTINGS, model_override=[tiny(3)], **fields)
        return Admission(settings, Engines(settings, clock)).limit(MODEL)

    assert limit() == 4  # one running + three waiting: the most that never overflows the queue
    assert limit(max_admitted=2) == 2
    assert limit(max_admitted=50) == 4  # capped: admission is what guarantees the queue
    # An engine in another process: its card's room, shared by the workers in front of it; unknown (a real
    # vLLM): --max-admitted alone, or no limit of ours.
    remote = replace(SETTINGS, engine="http://127.0.0.1:9", workers=2)
    engines = Engines(remote, clock)
    assert engines.remote is not None
    engines.remote.models = {
        "sized": RemoteModel(engines.remote, "sized", capacity=1280),
        "unsized": RemoteModel(engines.remote, "unsized"),
    }
    admission = Admission(remote, engines)
    assert (admission.limit("sized"), admission.limit("unsized")) == (640, None)
    assert Admission(replace(remote, max_admitted=7), engines).limit("unsized") == 7
    assert card_capacity({"settings": {"max-num-seqs": 256, "max-waiting": 1024}}) == 1280
    assert card_capacity({"id": "a-vllm-model", "max_model_len": 8192}) is None
    assert ERROR_CODES["rate_limit_exceeded"] == (429, "requests")
    assert Settings().max_admitted == 0 and Settings().retry_after_ms == 1000.0


@pytest.mark.parametrize(("name", "value"), [("max_admitted", "12"), ("retry_after_ms", "250.0")])
def test_admission_settings_are_flags_and_environment_variables(name: str, value: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    by_flag = from_args(parser.parse_args(["--" + name.replace("_", "-"), value]), environ={})
    by_env = from_args(parser.parse_args([]), environ={"RESPONSES_LAB_" + name.upper(): value})
    assert str(getattr(by_flag, name)) == str(getattr(by_env, name)) == value


# ------------------------------------------------------------------------------------------ at the door
async def test_over_limit_creates_are_refused_at_the_door_on_every_transport(
    srv: ThreadedServer, stack: AsyncExitStack
) -> None:
    held = Held(srv, stack)
    await held.hold(2)  # the limit: both places taken, by responses waiting on a tool
    pipeline = state(srv).pipeline
    rows, writes = pipeline.totals.ledger_rows, pipeline.totals.store_writes
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
        for body in (http_body(store=True), http_body(stream=True)):
            refused = await http.post("/v1/responses", json=body)
            assert refused.status_code == 429, refused.text
            assert refused.headers["content-type"] == "application/json"  # not an SSE stream: nothing started
            error = refused.json()["error"]
            assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests"), error
            assert RETRY_MS / 2 <= int(refused.headers["retry-after-ms"]) <= RETRY_MS * 1.5
            assert refused.headers["retry-after"] == "1"  # whole seconds, rounded up
    ga = await stack.enter_async_context(connect(srv.url))
    await ga.send(json.dumps(create(store=True)))
    assert_refused(json.loads(await asyncio.wait_for(ga.recv(), GUARD)))
    longlived = await stack.enter_async_context(connect(srv.url + "?protocol=longlived"))
    await longlived.send(json.dumps(create()))
    assert_refused(json.loads(await asyncio.wait_for(longlived.recv(), GUARD)))
    assert shed(srv) == 4
    # Nothing ran for them: no ledger row, no store write (each create above asked to be stored).
    assert (pipeline.totals.ledger_rows, pipeline.totals.store_writes) == (rows, writes)

    await held.finish()
    assert admitted(srv) == 0
    # The refused connections serve on: the same creates now run (the first frame is response.created).
    await longlived.send(json.dumps(create()))
    assert (await until(longlived, {"response.done", *TERMINAL_OR_ERROR}))[-1]["type"] == "response.done"
    await ga.send(json.dumps(create(store=True)))
    assert json.loads(await asyncio.wait_for(ga.recv(), GUARD))["type"] == "response.created"
    assert (await until(ga, TERMINAL_OR_ERROR))[-1]["type"] == "response.completed"


async def test_a_create_that_supersedes_a_suspended_response_takes_its_place(
    srv: ThreadedServer, stack: AsyncExitStack
) -> None:
    held = Held(srv, stack)
    await held.hold(2)
    ws, _ = held.open.pop()
    await ws.send(json.dumps(create()))  # the suspended response ends superseded, and gives its place back
    frames = await until(ws, {"response.done", "error"})
    assert frames[0]["type"] == "response.incomplete", frames[0]
    assert frames[0]["response"]["incomplete_details"]["reason"] == "superseded"
    assert frames[-1]["type"] == "response.done" and shed(srv) == 0 and admitted(srv) == 2
    await held.finish()


async def test_a_refused_ga_continuation_keeps_its_cached_response(
    srv: ThreadedServer, stack: AsyncExitStack
) -> None:
    """A continuation is a new request (refused like any create), and a refusal is not a failure: the
    connection's cache keeps the response it continues (store: false), so the retry finds it."""
    ga = await stack.enter_async_context(connect(srv.url))
    base = messages.body(MODEL, [messages.user_message(ONE_CALL)], tools=TOOLS, store=False)
    await ga.send(json.dumps(messages.create(base)))
    first = (await until(ga, TERMINAL_OR_ERROR))[-1]
    assert first["type"] == "response.completed", first
    calls = [item for item in first["response"]["output"] if item["type"] == "function_call"]
    follow = messages.create(messages.continuation(base, outputs(calls), first["response"]["id"]))
    held = Held(srv, stack)
    await held.hold(2)
    await ga.send(json.dumps(follow))
    assert_refused(json.loads(await asyncio.wait_for(ga.recv(), GUARD)))
    await held.finish()
    await ga.send(json.dumps(follow))
    final = (await until(ga, TERMINAL_OR_ERROR))[-1]
    assert final["type"] == "response.completed", final
    assert final["response"]["output"][-1]["type"] == "message"


async def test_every_way_a_response_ends_gives_its_place_back(
    srv: ThreadedServer, stack: AsyncExitStack
) -> None:
    """Completed, cut by a client gone mid-stream (SSE), or by one gone before its JSON reply: each
    response's place is given back exactly once (the count returns to zero, never below)."""
    long = "!tokens 3000 !say long"
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
        assert (await http.post("/v1/responses", json=http_body("!say hi"))).status_code == 200
        assert admitted(srv) == 0
        async with http.stream("POST", "/v1/responses", json=http_body(long, stream=True)) as sse:
            async for line in sse.aiter_lines():
                if "output_text.delta" in line:
                    break
            assert admitted(srv) == 1
        await wait_for(lambda: admitted(srv) == 0, "the SSE response cut by its client gave its place back")
        reply = asyncio.create_task(http.post("/v1/responses", json=http_body(long)))
        await wait_for(lambda: admitted(srv) == 1, "the JSON response admitted")
        reply.cancel()
        await wait_for(lambda: admitted(srv) == 0, "the JSON response cut by its client gave its place back")
    held = Held(srv, stack)
    await held.hold(2)  # both places are there to take
    await held.finish()
    assert admitted(srv) == 0 and shed(srv) == 0


async def test_a_background_response_gives_its_place_back_however_it_ends(srv: ThreadedServer) -> None:
    """A background response is admitted like any create and owned by the server, not by its request: its
    place is given back when it completes and when it is cancelled while it runs (docs/protocol.md,
    "Background mode")."""
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http:
        quick = await http.post("/v1/responses", json=http_body("!say hi", background=True, store=True))
        assert quick.status_code == 200 and quick.json()["status"] == "queued", quick.text
        await wait_for(lambda: admitted(srv) == 0, "the completed background response gave its place back")
        body = http_body("!tokens 3000 !say long", background=True, store=True)
        long = (await http.post("/v1/responses", json=body)).json()
        assert admitted(srv) == 1
        cancelled = (await http.post(f"/v1/responses/{long['id']}/cancel")).json()
        assert cancelled["status"] == "cancelled", cancelled
        await wait_for(lambda: admitted(srv) == 0, "the cancelled background response gave its place back")
    assert shed(srv) == 0


# ------------------------------------------------------------------------------------------ admitted work
@pytest.mark.process
async def test_admitted_rollouts_all_complete_while_new_creates_are_shed() -> None:
    """Three ten-turn rollouts on an engine of one slot and two waiting places, their turns competing for
    the slot, while other clients keep asking: every create past the three is refused at the door, and
    the three run to completion — none fails mid-rollout (on main, one would, ``server_overloaded``)."""
    with running(model_override=[tiny(2)], retry_after_ms=RETRY_MS) as server:
        url = server.url + "?protocol=longlived"
        # Ten turns of 100 tokens each (25 ms at 4 000 tokens/s): the three share the one slot for ~0.75 s.
        turns = [f'!tokens 100 !call grep {{"turn": {k}}}' for k in range(9)]
        script = "\n".join(["Search.", *turns, "!tokens 100 !say done"])
        refused = 0

        async def rollout() -> dict[str, Any]:
            async with connect(url) as ws:
                await ws.send(json.dumps(create(script)))
                while True:
                    event = (await until(ws, {"response.done", *TERMINAL_OR_ERROR}))[-1]
                    if event["type"] != "response.done":
                        return event
                    await ws.send(json.dumps(messages.append(outputs(event["pending_calls"]))))

        async def knock() -> None:
            nonlocal refused
            await wait_for(lambda: admitted(server) == 3, "three rollouts admitted")
            async with connect(url) as ws:
                while admitted(server) == 3:
                    await ws.send(json.dumps(create()))
                    frame = json.loads(await asyncio.wait_for(ws.recv(), GUARD))
                    if frame["type"] != "error":  # a rollout ended in between: this one got its place
                        await until(ws, {"response.done", *TERMINAL_OR_ERROR})
                        return
                    assert_error(frame, "rate_limit_exceeded", None)
                    refused += 1

        results = await asyncio.wait_for(asyncio.gather(*(rollout() for _ in range(3)), knock()), 60)
        for terminal in results[:3]:
            assert terminal is not None and terminal["type"] == "response.completed", terminal
            assert len(terminal["response"]["lab"]["turns"]) == 10  # every turn ran
        assert refused > 0 and shed(server) == refused


# ------------------------------------------------------------------------------------------ a real client
@pytest.mark.process
async def test_the_openai_sdk_retries_a_refused_create_until_it_is_admitted(stack: AsyncExitStack) -> None:
    """The openai Python SDK (its own retry loop, max_retries) reads retry-after-ms, waits, asks again, and
    gets its response once a place is free: it made more than one attempt (the server refused some)."""
    with running(model_override=[tiny(0)], retry_after_ms=RETRY_MS) as server:
        held = Held(server, stack)
        await held.hold(1)  # the one place
        sdk = AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=50)
        call = asyncio.create_task(sdk.responses.create(model=MODEL, input="!say admitted", store=False))
        await wait_for(lambda: shed(server) >= 2, "the SDK's create refused twice")
        assert not call.done()
        await held.finish()
        response = await asyncio.wait_for(call, GUARD)
        assert response.status == "completed" and response.output_text == "admitted"
        assert shed(server) >= 2  # attempts: every refusal, then the one admitted
        await sdk.close()


def test_retry_hints_are_spread() -> None:
    """Refused clients come back spread over ±50 % of the hint, not in one wave."""
    settings = replace(SETTINGS, model_override=[tiny(0)], max_admitted=1, retry_after_ms=1000.0)
    admission = Admission(settings, Engines(settings, FakeClock()), random.Random(7))
    admission.admit(MODEL)
    waits = []
    for _ in range(200):
        with pytest.raises(ClientError) as refused:
            admission.admit(MODEL)
        waits.append(refused.value.retry_after_s or 0.0)
    assert 0.5 <= min(waits) < 0.6 and 1.4 < max(waits) <= 1.5
