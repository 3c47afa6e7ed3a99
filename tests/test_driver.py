"""The response driver's guarantees, over a real server on loopback: events are snapshots, a stalled
ledger stalls nobody, ``response.done`` carries only what is new."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import MODEL, running, state
from websockets.asyncio.client import ClientConnection, connect

pytestmark = pytest.mark.process  # every test starts a server or a process

# Every token due at once (1 µs apart): one GPU wake-up releases a whole item, added → deltas → done in
# one batch. An event that held the live item would show it finished in its own ``added`` frame.
BURST = f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0,inter-token-latency=0.001"
SCRIPT = (
    'Go.\n!call grep {"pattern": "def mean", "path": "src/stats.py"}\n'
    "!tokens 40 !say All done, the bug is fixed."
)
TOOLS = [{"type": "function", "name": "grep"}]


def create(script: str = SCRIPT, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": [{"role": "user", "content": script}], "tools": TOOLS, **fields}


async def events_until(ws: ClientConnection, types: set[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in types:
        events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    return events


def assert_added_are_snapshots(events: list[dict[str, Any]]) -> None:
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert {item["type"] for item in added} >= {"function_call"} or {item["type"] for item in added} >= {
        "message"
    }
    for item in added:
        assert item["status"] == "in_progress", item
        if item["type"] == "function_call":
            assert item["arguments"] == "", item
        if item["type"] == "message":
            assert item["content"] == [], item
    for event in events:  # the deltas that follow build what the done event says
        if event["type"] == "response.output_item.done":
            assert event["item"]["status"] == "completed"
    numbers = [e["sequence_number"] for e in events if "sequence_number" in e]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


async def test_output_item_added_carries_the_item_as_it_was_when_added_over_websocket() -> None:
    with running(model_override=[BURST]) as srv:
        async with connect(srv.url + "?protocol=longlived") as ws:
            await ws.send(json.dumps({"type": "response.create", **create()}))
            first = await events_until(ws, {"response.done"})
            assert_added_are_snapshots(first)
            call = next(e["item"] for e in first if e["type"] == "response.output_item.done")
            output = {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": "src/stats.py:3: def mean",
            }
            await ws.send(json.dumps({"type": "response.append", "input": [output]}))
            rest = await events_until(ws, {"response.completed", "response.failed", "response.incomplete"})
            assert rest[-1]["type"] == "response.completed"
            assert_added_are_snapshots(rest)
        async with connect(srv.url) as ws:  # GA WebSocket mode: the same builder, the same rule
            await ws.send(json.dumps({"type": "response.create", **create(store=False)}))
            assert_added_are_snapshots(await events_until(ws, {"response.completed"}))


async def test_output_item_added_carries_the_item_as_it_was_when_added_over_sse() -> None:
    with running(model_override=[BURST]) as srv:
        async with (
            httpx.AsyncClient(base_url=srv.http_url, timeout=30) as client,
            client.stream("POST", "/v1/responses", json=create(stream=True)) as reply,
        ):
            body = "".join([chunk async for chunk in reply.aiter_text()])
    events = [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.completed"
    assert_added_are_snapshots(events)


async def test_response_done_size_does_not_grow_with_the_turn_number() -> None:
    turns = 50
    script = "\n".join(
        ["Work.", *(f'!call grep {{"pattern": "p{n:02d}"}}' for n in range(turns)), "!say done"]
    )
    with running() as srv:
        async with connect(srv.url + "?protocol=longlived", max_size=None) as ws:
            await ws.send(json.dumps({"type": "response.create", **create(script)}))
            sizes: list[int] = []
            while True:
                frame = await asyncio.wait_for(ws.recv(), 10)
                event = json.loads(frame)
                if event["type"] == "response.done":
                    sizes.append(len(frame))
                    assert len(event["response"]["lab"]["turns"]) == 1  # the report of the segment it ends
                    assert event["response"]["lab"].get("input_positions") is None
                    call = event["pending_calls"][0]
                    output = {
                        "type": "function_call_output",
                        "call_id": call["call_id"],
                        "output": "no match",
                    }
                    await ws.send(json.dumps({"type": "response.append", "input": [output]}))
                elif event["type"] == "response.completed":
                    terminal = event["response"]
                    break
    assert len(sizes) == turns
    # Only counters' digits may grow (tokens, items validated): not the O(turns) lists of before.
    assert sizes[-1] - sizes[0] < 100, (sizes[0], sizes[-1])
    assert len(terminal["lab"]["turns"]) == turns + 1  # the terminal event carries the whole report


def _lock(path: Path) -> sqlite3.Connection:
    """Another process's write transaction on the server's database, held until released."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


@pytest.mark.serial
async def test_a_stalled_ledger_stalls_no_stream_and_every_response_gets_its_row_back(tmp_path: Path) -> None:
    db = tmp_path / "lab.db"
    with running(db=str(db)) as srv:
        server = state(srv)
        ledger = server.pipeline.ledger
        async with connect(srv.url + "?protocol=longlived") as warm:  # the schema exists before the lock
            await warm.send(json.dumps({"type": "response.create", **create("!say hi", store=False)}))
            await events_until(warm, {"response.completed"})
        await asyncio.to_thread(ledger.flush)
        written = ledger.rows_written
        holder = _lock(db)
        try:
            streams = 4
            tokens = 2000  # 0.5 s of modelled decode at 4000 tokens/s

            async def one_stream() -> tuple[float, dict[str, Any]]:
                async with connect(srv.url + "?protocol=longlived") as ws:
                    await ws.send(
                        json.dumps(
                            {"type": "response.create", **create(f"!tokens {tokens} !say long", store=False)}
                        )
                    )
                    events = await events_until(
                        ws, {"response.completed", "response.failed", "response.incomplete"}
                    )
                    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
                    assert deltas and events[-1]["type"] == "response.completed", events[-1]
                    return time.perf_counter(), events[-1]["response"]

            started = time.perf_counter()
            ended = await asyncio.gather(*(one_stream() for _ in range(streams)))
            assert ledger.rows_written == written  # nothing could be written: the database is locked
            assert ledger.pending >= streams  # the rows wait, none dropped, and no stream waited for them
            for finished, response in ended:
                [turn] = response["lab"]["turns"]
                modelled_s = (turn["prefill_ms"] + turn["queue_wait_ms"] + turn["decode_ms"]) / 1e3
                # A ratio in the same run: each stream kept to its modelled pace (before, billing on a full
                # queue blocked the loop for 5 s per response).
                assert (finished - started) / modelled_s < 3, (finished - started, modelled_s)
        finally:
            holder.rollback()
            holder.close()
        await asyncio.to_thread(ledger.flush)
        assert ledger.rows_written == written + streams and ledger.pending == 0
        ids = {response["id"] for _, response in ended}
        assert {row.response_id for row in ledger.rows()} >= ids
