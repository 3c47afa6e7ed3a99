"""Two servers on two ports sharing one PostgreSQL (the suite's own, tests/databases.py): reconnects that land
on the other server, billing exactly once across both, and one of them killed mid-load.

The GA WebSocket cache is per connection, so a client that reconnects — to the same server or, as here, to
the other — continues from the store (``store: true``, counted in ``store_reads``, a ``store_load`` phase)
or is refused typed (``previous_response_not_found``, ``store: false``).
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import psycopg
import pytest
from databases import PostgresServer
from helpers import (
    GUARD,
    MODEL,
    SLOW_MODEL,
    TERMINAL_OR_ERROR,
    TOOLS,
    assert_error,
    auth,
    create,
    ga_events,
    ga_rollout_ok,
    outputs,
    running,
    state,
    until,
)
from websockets.asyncio.client import connect

from proto.client.longlived import LongLivedClient
from proto.core.events import TERMINAL_TYPES
from proto.processes import ChildServer
from proto.server.storage.ledger import LedgerRow, UsageLedger

pytestmark = pytest.mark.process  # every test starts a server or a process

FAST_FLAGS = [
    "--model-override",
    f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0",
    "--log-level",
    "warning",
]


def calls_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


def follow_up(previous: dict[str, Any], store: bool) -> dict[str, Any]:
    """The GA continuation of ``previous``: its id and an output for each of its calls, nothing else."""
    return {
        "model": MODEL,
        "tools": TOOLS,
        "store": store,
        "previous_response_id": previous["id"],
        "input": outputs(calls_of(previous)),
    }


async def one_ga_turn(url: str, event: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """One ``response.create`` on a connection of its own; its terminal event (or error)."""
    async with connect(url, additional_headers=auth(key)) as ws:
        return (await ga_events(ws, event))[-1]


# ------------------------------------------------------------------------------------ reconnects elsewhere
async def test_a_ga_continuation_on_the_other_server_loads_the_stored_chain(pg: PostgresServer) -> None:
    url = pg.fresh()
    with running(db=url) as a, running(db=url) as b:
        async with connect(a.url) as ws:
            first = (await ga_events(ws, create(store=True)))[-1]["response"]
            assert first["status"] == "completed" and len(calls_of(first)) == 2
            # The same connection: a cache hit, nothing read from the store.
            cached = (await ga_events(ws, follow_up(first, store=True)))[-1]["response"]
        assert cached["status"] == "completed" and cached["lab"]["work"]["store_reads"] == 0
        # A reconnect that lands on the other server: the chain comes from PostgreSQL.
        terminal = await one_ga_turn(b.url, follow_up(first, store=True))
        assert terminal["type"] == "response.completed", terminal
        elsewhere = terminal["response"]
        assert elsewhere["previous_response_id"] == first["id"]
        assert elsewhere["lab"]["work"]["store_reads"] == 1 and "store_load" in elsewhere["lab"]["phases_ms"]
        # the script's next turn: the conversation went on
        assert elsewhere["output"][-1]["type"] == "message"
        # The same turn, whichever path served it: the same words from the same prompt.
        assert [o["content"] for o in elsewhere["output"]] == [o["content"] for o in cached["output"]]
        assert elsewhere["usage"]["input_tokens"] == cached["usage"]["input_tokens"]
        # What B stored continues on A in turn, and both servers read each other's responses over HTTP.
        again = await one_ga_turn(
            a.url, {"model": MODEL, "tools": TOOLS, "previous_response_id": elsewhere["id"], "input": "more?"}
        )
        assert again["type"] == "response.completed" and again["response"]["lab"]["work"]["store_reads"] == 2
        async with httpx.AsyncClient(base_url=a.http_url) as http:
            assert (await http.get(f"/v1/responses/{elsewhere['id']}")).json()["status"] == "completed"


async def test_a_store_false_continuation_on_the_other_server_is_refused_typed(pg: PostgresServer) -> None:
    url = pg.fresh()
    with running(db=url) as a, running(db=url) as b:
        first = (await one_ga_turn(a.url, create(store=False)))["response"]
        assert first["status"] == "completed"
        async with connect(b.url) as ws:
            [error] = await ga_events(ws, follow_up(first, store=False))
            assert_error(error, "previous_response_not_found", "previous_response_id")
            await ga_rollout_ok(ws)  # the connection serves on


async def test_the_other_server_keeps_keys_apart(pg: PostgresServer) -> None:
    url = pg.fresh()
    keys = ["sk-alice-" + "a" * 32, "sk-mallory-" + "m" * 32]
    with running(db=url, api_key=keys) as a, running(db=url, api_key=keys) as b:
        first = (await one_ga_turn(a.url, create(store=True), key=keys[0]))["response"]
        stolen = await one_ga_turn(b.url, follow_up(first, store=True), key=keys[1])
        assert_error(stolen, "previous_response_not_found", "previous_response_id")
        async with httpx.AsyncClient(base_url=b.http_url) as http:
            assert (await http.get(f"/v1/responses/{first['id']}", headers=auth(keys[1]))).status_code == 404
            assert (await http.get(f"/v1/responses/{first['id']}", headers=auth(keys[0]))).status_code == 200
        owned = await one_ga_turn(b.url, follow_up(first, store=True), key=keys[0])
        assert owned["type"] == "response.completed"


LOOKUP = [{"type": "function", "name": "lookup"}]


async def _lookup(args: dict[str, Any]) -> str:
    return json.dumps({"found": args})


async def test_a_dropped_long_lived_response_ends_as_ever_and_its_chain_continues_elsewhere(
    pg: PostgresServer,
) -> None:
    url = pg.fresh()
    # Turn 0 calls, turn 1 answers (the stored response), turn 2 is a long stream (the dropped one).
    script = 'first\n!call lookup {"k": 1}\n!say one\n!tokens 400 !say long'
    with running(db=url) as a, running(db=url) as b:
        async with LongLivedClient(a.url) as client:
            stored = (
                await client.rollout({"model": MODEL, "input": script, "tools": LOOKUP}, {"lookup": _lookup})
            ).response
        assert stored["status"] == "completed"
        ledger = state(a).pipeline.ledger
        async with connect(a.url + "?protocol=longlived") as ws:
            continuation = {
                "type": "response.create",
                "model": SLOW_MODEL,
                "input": "go on",
                "tools": LOOKUP,
                "previous_response_id": stored["id"],
            }
            await ws.send(json.dumps(continuation))
            frames = await until(ws, {"response.output_text.delta", *TERMINAL_OR_ERROR})
            assert frames[-1]["type"] == "response.output_text.delta", frames[-1]
            dropped = frames[0]["response"]["id"]
        # The socket is gone mid-stream: the response ends as it always has (billed once, not stored).
        row = await _billed_row(ledger, dropped)
        assert row is not None and row.status in ("cancelled", "incomplete") and row.mode == "longlived"
        async with httpx.AsyncClient(base_url=b.http_url) as http:
            assert (await http.get(f"/v1/responses/{dropped}")).status_code == 404
        # A new connection, to the other server, continues the stored chain.
        async with LongLivedClient(b.url) as client:
            resumed = (
                await client.rollout(
                    {"model": MODEL, "input": "go on", "tools": LOOKUP, "previous_response_id": stored["id"]},
                    {"lookup": _lookup},
                )
            ).response
        assert resumed["status"] == "completed" and resumed["previous_response_id"] == stored["id"]
        assert resumed["lab"]["work"]["store_reads"] == 1 and resumed["lab"]["turns"][0]["turn"] == 2
        assert resumed["output"][-1]["content"][0]["text"].startswith("long")  # turn 2 of the script
        assert resumed["lab"]["usage_total"]["output_tokens"] >= 400


async def _billed_row(ledger: UsageLedger, response_id: str) -> LedgerRow | None:
    """The row, once the server has noticed the drop and billed it (bounded: a guard against hangs)."""
    for _ in range(int(GUARD * 100)):
        await asyncio.to_thread(ledger.flush)
        row = await asyncio.to_thread(ledger.get, response_id)
        if row is not None:
            return row
        await asyncio.sleep(0.01)
    return None


# ------------------------------------------------------------------------------------ billing exactly once
def ws_of(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/v1/responses"


SCRIPT = 'Spread me.\n!call grep {"q": %d}\n!call read_file {"path": "%d.py"}\n!say done'


async def hop_http_prev(urls: list[str], n: int) -> list[dict[str, Any]]:
    """An ``http-prev`` rollout whose every turn goes to the next server (the store carries the chain)."""
    responses: list[dict[str, Any]] = []
    body: dict[str, Any] = {
        "model": MODEL,
        "tools": TOOLS,
        "input": [{"role": "user", "content": SCRIPT % (n, n)}],
    }
    for turn in range(3):
        async with httpx.AsyncClient(base_url=urls[(n + turn) % 2], timeout=GUARD) as http:
            reply = await http.post("/v1/responses", json=body)
        assert reply.status_code == 200, reply.text
        responses.append(reply.json())
        body = {
            "model": MODEL,
            "tools": TOOLS,
            "previous_response_id": responses[-1]["id"],
            "input": outputs(calls_of(responses[-1])),
        }
    return responses


async def hop_ws(urls: list[str], n: int) -> list[dict[str, Any]]:
    """A GA WebSocket rollout that reconnects to the other server every turn (store: true)."""
    responses: list[dict[str, Any]] = []
    event: dict[str, Any] = create(SCRIPT % (n, n), store=True)
    for turn in range(3):
        terminal = await one_ga_turn(ws_of(urls[(n + turn) % 2]), event)
        assert terminal["type"] == "response.completed", terminal
        responses.append(terminal["response"])
        event = follow_up(responses[-1], store=True)
    return responses


async def stay_ws(urls: list[str], n: int) -> list[dict[str, Any]]:
    """A GA WebSocket rollout on one connection (the cached path), store: false."""
    responses: list[dict[str, Any]] = []
    event: dict[str, Any] = create(SCRIPT % (n, n), store=False)
    async with connect(ws_of(urls[n % 2])) as ws:
        for _ in range(3):
            terminal = (await ga_events(ws, event))[-1]
            assert terminal["type"] == "response.completed", terminal
            responses.append(terminal["response"])
            event = follow_up(responses[-1], store=False)
    return responses


async def longlived(urls: list[str], n: int) -> list[dict[str, Any]]:
    ws_url = ws_of(urls[n % 2])

    async def tool(args: dict[str, Any]) -> str:
        return "ok"

    async with LongLivedClient(ws_url) as client:
        result = await client.rollout(
            {"model": MODEL, "input": SCRIPT % (n, n), "tools": TOOLS}, {"grep": tool, "read_file": tool}
        )
    return [result.response]


Rollout = Callable[[list[str], int], Awaitable[list[dict[str, Any]]]]
KINDS: list[Rollout] = [hop_http_prev, hop_ws, stay_ws, longlived]


async def spread(urls: list[str], count: int, concurrency: int = 16) -> list[dict[str, Any]]:
    """``count`` rollouts of every kind in turn over both servers; every response the clients saw end."""
    gate = asyncio.Semaphore(concurrency)

    async def one(n: int) -> list[dict[str, Any]]:
        async with gate:
            return await KINDS[n % len(KINDS)](urls, n)

    return [r for rs in await asyncio.gather(*(one(n) for n in range(count))) for r in rs]


def billed(url: str) -> dict[str, tuple[str, int, int]]:
    rows = sql_rows(url, "SELECT response_id, status, output_tokens, input_tokens FROM usage")
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def sql_rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query).fetchall()


async def test_200_rollouts_over_two_servers_bill_each_response_exactly_once(pg: PostgresServer) -> None:
    url = pg.fresh()
    with running(db=url) as a, running(db=url) as b:
        ended = await spread([a.http_url, b.http_url], 200)
        for srv in (a, b):
            await asyncio.to_thread(state(srv).pipeline.ledger.flush)
        ledgers = [state(srv).pipeline.ledger for srv in (a, b)]
        stores = [state(srv).pipeline.store for srv in (a, b)]
    # 50 rollouts of each kind: 3 responses each, one for a long-lived rollout.
    assert len(ended) == 150 * 3 + 50
    ids = {r["id"] for r in ended}
    assert len(ids) == len(ended)
    # In SQL: one row per response, no more, no fewer, each with the usage its terminal event reported
    # (its whole usage: lab.usage_total; a long-lived terminal event's usage is its last segment's).
    assert sql_rows(url, "SELECT count(*), count(DISTINCT response_id) FROM usage") == [(len(ids), len(ids))]
    rows = billed(url)
    assert set(rows) == ids
    for r in ended:
        total = r["lab"]["usage_total"]
        assert rows[r["id"]] == (r["status"], total["output_tokens"], total["input_tokens"]), r["id"]
    # Both servers billed (the load was spread) and neither saw a duplicate or lost a row.
    assert all(led.rows_written > 0 for led in ledgers) and sum(led.rows_written for led in ledgers) == len(
        ids
    )
    assert [(led.duplicates, led.failed, led.pending) for led in ledgers] == [(0, 0, 0), (0, 0, 0)]
    # The hopping rollouts were served from the store by the other server at every turn after the first.
    assert all(store.reads > 0 for store in stores)


# ------------------------------------------------------------------------------------ one server killed
async def test_killing_one_server_mid_load_leaves_the_other_serving_and_loses_no_ended_response(
    pg: PostgresServer,
) -> None:
    """SIGKILL to one of two server processes while both stream. Every response that had ended has its
    row (committed by the server that served it: the kill cannot take it back), B serves on, A's clients
    continue on B from the store. The ledger's documented crash window — a row accepted in the last
    milliseconds before a crash, still in the dead process's buffer — is not what this checks: at the
    kill every response on A is mid-stream; the ledger's open rows are what bill such a response."""
    url = pg.fresh()
    a, b = ChildServer(FAST_FLAGS, db=url), ChildServer(FAST_FLAGS, db=url)
    try:
        a.wait_ready()
        b.wait_ready()
        urls = [a.http_url, b.http_url]
        # Load that ended: rollouts of every kind over both (hopping ones cross servers every turn).
        ended = await spread(urls, 40, concurrency=8)
        # Load in flight: long streams on both servers, each a continuation of a stored GA response.
        servers = (a, b, a, b)
        heads = [(await one_ga_turn(s.ws_url, create(LONG, store=True)))["response"] for s in servers]
        streaming = [asyncio.Event() for _ in servers]
        streams = [
            asyncio.create_task(_long_stream(s.ws_url, h, e))
            for s, h, e in zip(servers, heads, streaming, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), GUARD)
        a.proc.send_signal(signal.SIGKILL)  # mid-load: four responses streaming, two of them on A
        assert a.proc.wait(GUARD) == -signal.SIGKILL
        results = await asyncio.gather(*streams, return_exceptions=True)
        # B served on: its streams completed; A's ended with the connection, without a terminal event.
        assert [type(r).__name__ if isinstance(r, BaseException) else r["status"] for r in results] == [
            "ConnectionClosedError",
            "completed",
            "ConnectionClosedError",
            "completed",
        ], results
        ended += [r for r in results if isinstance(r, dict)] + heads
        # A's clients reconnect: to B, continuing from the store the responses A had stored.
        for head in heads[0::2]:
            resumed = await one_ga_turn(b.ws_url, follow_up(head, store=True))
            assert (
                resumed["type"] == "response.completed"
                and resumed["response"]["lab"]["work"]["store_reads"] == 1
            )
            ended.append(resumed["response"])
        ended += await spread([b.http_url, b.http_url], 8)  # and B takes new load alone
    finally:
        for server in (a, b):
            server.stop()  # A: already dead (stop() only closes its log)
    pg.wait_sessions_gone(a.proc.pid)
    # Every response that ended, on either server, before or after the kill: exactly one row. None of
    # A's cut streams was invented a row (they never ended; a reconcile bills them from their open row).
    rows = billed(url)
    ids = {r["id"] for r in ended}
    assert len(ids) == len(ended) and ids <= set(rows), sorted(ids - set(rows))
    assert sql_rows(url, "SELECT count(*) = count(DISTINCT response_id) FROM usage") == [(True,)]
    for r in ended:
        assert rows[r["id"]][:2] == (r["status"], r["lab"]["usage_total"]["output_tokens"]), r["id"]
    assert set(rows) - ids == set()


LONG = 'Go.\n!call grep {"q": 1} | !call read_file {"path": "a.py"}\n!tokens 3000 !say done'
STREAM_MODEL = "mock-1000tps"  # turn 1 of LONG streams 3 000 tokens: three seconds


async def _long_stream(url: str, head: dict[str, Any], streaming: asyncio.Event) -> dict[str, Any]:
    """The continuation of ``head`` (a long turn), read to its terminal event; ``streaming`` once it
    streams."""
    event = {**follow_up(head, store=True), "model": STREAM_MODEL}
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "response.create", **event}))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if frame["type"] == "response.output_text.delta":
                streaming.set()
            if frame["type"] in TERMINAL_TYPES:
                response: dict[str, Any] = frame["response"]
                return response
            if frame["type"] == "error":
                raise AssertionError(frame)
