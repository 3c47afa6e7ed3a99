"""The GPU in its own process (docs/engine.md): ``responses-lab engine`` and API processes sharing it.

Every test runs real processes on loopback: the engine (``responses-lab engine``) and two API workers
(``responses-lab serve --engine URL``, each its own process on its own port, so a test chooses which worker
a client talks to), or ``serve --workers 2`` on one port. What the engine holds is read from its own
``/metrics`` (vLLM's metric names); what an API process holds, from its ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil
import pytest
from helpers import create as create_event
from helpers import until
from prometheus_client.parser import text_string_to_metric_families
from test_lab_e2e import TINY
from virtual import virtual
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from proto.core.events import TERMINAL_TYPES
from proto.engine.client import _failure, _report
from proto.engine.wire import EventStream, StreamChunk
from proto.lab.bench import main as bench_main
from proto.processes import ChildEngine, ChildServer, free_port
from proto.server.config import Settings
from proto.server.serve import ThreadedServer
from sampler.engine import EngineFailure, EngineOverloaded

pytestmark = pytest.mark.process  # every test starts a server or a process

FAST = "mock-4000tps"  # a 1 ms prefill, 0.25 ms per token
SLOW = "mock-65tps"  # 65 tokens/s, two batch slots: `!tokens 5000` streams for over a minute unless cancelled
ONE_SLOT = "mock-1000tps"  # one batch slot, no waiting room: a second request is refused
FAST_OVERRIDE = f"{FAST}:prefill-overhead=1,prefill-time-per-token=0"
ENGINE_FLAGS = [
    "--model-override",
    FAST_OVERRIDE,
    "--model-override",
    f"{SLOW}:max-num-seqs=2",
    "--model-override",
    f"{ONE_SLOT}:max-num-seqs=1,max-waiting=0",
]
GUARD = 15.0  # seconds, against hangs only: no assertion depends on timing
STREAM_FOREVER = "!tokens 5000 !say never"


# ------------------------------------------------------------------------------------------ processes
@dataclass
class Topology:
    engine: ChildEngine
    a: ChildServer
    b: ChildServer


def start_workers(engine: ChildEngine, count: int = 2) -> list[ChildServer]:
    workers = [ChildServer(["--engine", engine.http_url, "--log-level", "warning"]) for _ in range(count)]
    for worker in workers:
        worker.wait_ready()
    return workers


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """One engine, two API workers in front of it (each test leaves the engine as it found it)."""
    engine = ChildEngine(ENGINE_FLAGS)
    started: list[ChildServer] = []
    try:
        engine.wait_ready()
        started = start_workers(engine)
        yield Topology(engine, *started)
    finally:
        for process in [*started, engine]:
            process.stop()


def scrape(url: str) -> dict[tuple[str, str], float]:
    """``/metrics`` as {(sample name, model_name label or ""): value}."""
    text = httpx.get(url + "/metrics", timeout=GUARD).text
    return {
        (s.name, s.labels.get("model_name", s.labels.get("model", ""))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def until_true(check: Any, what: str) -> None:
    """Poll a condition over the wire (bounded: a guard against hangs, not a timing assertion)."""
    for _ in range(500):
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def engine_idle(url: str) -> bool:
    m = scrape(url)
    busy = [
        k
        for k, v in m.items()
        if k[0] in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
        and v
    ]
    return (
        not busy
        and m[("responses_lab_engine_pinned_sequences", "")] == 0
        and m[("responses_lab_engine_streams", "")] == 0
    )


def client_idle(url: str) -> bool:
    m = scrape(url)
    return (
        m[("responses_lab_engine_client_streams_open", "")] == 0
        and m[("responses_lab_engine_client_sequences_pinned", "")] == 0
    )


async def assert_all_released(t: Topology) -> None:
    """Nothing held on either side: no running or waiting request, no KV block in use, no pin, no stream."""
    await until_true(lambda: engine_idle(t.engine.http_url), "the engine holds nothing")
    for worker in (t.a, t.b):
        await until_true(lambda w=worker: client_idle(w.http_url), "the API workers hold nothing")


# ------------------------------------------------------------------------------------------ clients
def create(script: str, model: str = FAST, **fields: Any) -> str:
    return json.dumps(create_event(script, model=model, **fields))


async def recv_until(ws: ClientConnection, stop: set[str]) -> list[dict[str, Any]]:
    return await until(ws, stop | {"error"})


async def streaming(url: str, model: str = SLOW) -> ClientConnection:
    """A long-lived connection whose response is streaming (its first token arrived)."""
    ws = await connect(url + "?protocol=longlived")
    await ws.send(create(STREAM_FOREVER, model))
    assert (await recv_until(ws, {"response.output_text.delta"}))[-1]["type"] == "response.output_text.delta"
    return ws


def ws_url(server: ChildServer) -> str:
    return server.ws_url


def nonce() -> str:
    return f"{uuid.uuid4().int % 10**12:012d}"  # a fresh prefix: nothing of it is cached yet


# ------------------------------------------------------------------------------------------ one engine, two
# workers
async def test_a_prefix_cached_through_worker_a_hits_through_worker_b(topology: Topology) -> None:
    text = f"Session {nonce()}. " + "Review the module and list what it imports. " * 60
    body = {"model": FAST, "input": text, "store": False}
    before = scrape(topology.engine.http_url)[("vllm:prefix_cache_hits_total", FAST)]
    async with httpx.AsyncClient(timeout=GUARD) as http:
        first = (await http.post(topology.a.http_url + "/v1/responses", json=body)).json()
        second = (await http.post(topology.b.http_url + "/v1/responses", json=body)).json()
    [turn_a], [turn_b] = first["lab"]["turns"], second["lab"]["turns"]
    assert turn_a["prompt_tokens"] == turn_b["prompt_tokens"] > 500
    assert turn_a["cached_tokens"] == 0
    # Every full block but the one holding the last prompt token (recomputed, as vLLM does): B hit A's blocks.
    assert turn_b["cached_tokens"] == (turn_b["prompt_tokens"] - 1) // 16 * 16
    assert second["usage"]["input_tokens_details"]["cached_tokens"] == turn_b["cached_tokens"]
    after = scrape(topology.engine.http_url)[("vllm:prefix_cache_hits_total", FAST)]
    assert after - before == turn_b["cached_tokens"]
    await assert_all_released(topology)


async def test_batch_slots_are_shared_queue_wait_appears_across_workers(topology: Topology) -> None:
    engine = topology.engine.http_url
    first, second = (
        await streaming(ws_url(topology.a)),
        await streaming(ws_url(topology.b)),
    )  # SLOW's two slots
    try:
        assert scrape(engine)[("vllm:num_requests_running", SLOW)] == 2
        async with connect(ws_url(topology.a) + "?protocol=longlived") as third:
            await third.send(create("!tokens 3 !say ok", SLOW))
            await until_true(
                lambda: scrape(engine)[("vllm:num_requests_waiting", SLOW)] == 1, "the third waits for a slot"
            )
            await first.send(json.dumps({"type": "response.cancel"}))  # worker A's stream gives its slot up
            assert (await recv_until(first, TERMINAL_TYPES))[-1]["response"]["incomplete_details"][
                "reason"
            ] == "cancelled"
            done = (await recv_until(third, TERMINAL_TYPES))[-1]
            assert done["type"] == "response.completed", done
            [turn] = done["response"]["lab"]["turns"]
            # it waited in the engine's one queue, behind both workers' streams
            assert turn["queue_wait_ms"] > 0
        await second.send(json.dumps({"type": "response.cancel"}))
        await recv_until(second, TERMINAL_TYPES)
    finally:
        await first.close()
        await second.close()
    await assert_all_released(topology)


@pytest.mark.parametrize("how", ["cancel", "disconnect"])
async def test_an_api_side_cancel_frees_the_engines_slot_and_pins(topology: Topology, how: str) -> None:
    engine = topology.engine.http_url
    suspended = await connect(ws_url(topology.a) + "?protocol=longlived")
    await suspended.send(create("!call grep {}\n" + STREAM_FOREVER))
    assert (await recv_until(suspended, {"response.done"}))[-1]["type"] == "response.done"
    stream = await streaming(ws_url(topology.b))
    held = scrape(engine)
    # Both are long-lived responses, so both sequences are leased; A's suspended one keeps its prefix pinned.
    assert held[("responses_lab_engine_pinned_sequences", "")] == 2
    assert held[("vllm:kv_cache_usage_perc", FAST)] > 0
    assert held[("vllm:num_requests_running", SLOW)] == 1  # worker B's stream holds a slot
    assert scrape(topology.a.http_url)[("responses_lab_engine_client_sequences_pinned", "")] == 1
    assert scrape(topology.b.http_url)[("responses_lab_engine_client_streams_open", "")] == 1
    for ws in (suspended, stream):
        if how == "cancel":
            await ws.send(json.dumps({"type": "response.cancel"}))
            assert (await recv_until(ws, TERMINAL_TYPES))[-1]["response"]["incomplete_details"][
                "reason"
            ] == "cancelled"
            await ws.close()
        else:
            ws.transport.abort()
    await assert_all_released(topology)


async def test_a_cancel_through_the_engine_bills_what_was_delivered_and_limits_come_from_its_cards(
    topology: Topology,
) -> None:
    """Billing what was delivered, over the engine hop: the cut turn bills its prompt and the tokens the
    client received; the
    context window the API tier enforces before the hop is the engine's card's (``max-model-len``)."""
    async with connect(ws_url(topology.a) + "?protocol=longlived") as ws:
        await ws.send(create(STREAM_FOREVER, SLOW))
        events = await recv_until(ws, {"response.output_text.delta"})
        while sum(e["type"] == "response.output_text.delta" for e in events) < 20:
            events.append(json.loads(await asyncio.wait_for(ws.recv(), GUARD)))
        await ws.send(json.dumps({"type": "response.cancel"}))
        events += await recv_until(ws, TERMINAL_TYPES)
        usage = events[-1]["response"]["usage"]
        assert usage["output_tokens"] == sum(e["type"] == "response.output_text.delta" for e in events) >= 20
        assert usage["input_tokens"] > 0  # the cut turn's prompt, from the sequence's live report
        await ws.send(create("word " * 140_000, FAST))  # past the engine's 131 072-token window
        # refused while it is tokenized, against the card's window, before any response starts
        refused = (await recv_until(ws, TERMINAL_TYPES | {"error"}))[-1]
        assert refused["type"] == "error" and refused["error"]["code"] == "context_length_exceeded", refused
    await assert_all_released(topology)


async def test_a_full_engine_is_refused_at_the_door_and_admitted_work_waits(topology: Topology) -> None:
    """Admission over the engine hop (docs/protocol.md, "Admission"). Worker a knows the engine's room from
    its model card (one slot, no waiting place): its second create is refused at the door. Worker b does
    not know what a holds: its create is admitted, the engine refuses its turn, and the turn waits and asks
    again (admitted work is never shed) while b's door stays closed for the engine's hint."""
    body = {"model": ONE_SLOT, "input": "!say served", "store": False}
    ws = await streaming(ws_url(topology.a), ONE_SLOT)  # the one place, and the engine's one slot
    try:
        async with httpx.AsyncClient(timeout=GUARD) as http:
            refused = await http.post(topology.a.http_url + "/v1/responses", json=body)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded", (
                refused.text
            )
            assert refused.headers["retry-after-ms"] and refused.headers["retry-after"]
            waiting = asyncio.create_task(http.post(topology.b.http_url + "/v1/responses", json=body))
            await until_true(
                lambda: scrape(topology.b.http_url)[("responses_lab_engine_client_refusals", "")] >= 1,
                "the engine refused b's admitted turn",
            )
            shut = await http.post(topology.b.http_url + "/v1/responses", json=body)
            assert shut.status_code == 429 and shut.json()["error"]["code"] == "rate_limit_exceeded", (
                shut.text
            )
            assert not waiting.done()
            await ws.send(json.dumps({"type": "response.cancel"}))  # a's response ends: the slot is free
            await recv_until(ws, TERMINAL_TYPES)
            served = await waiting
            assert served.status_code == 200 and served.json()["status"] == "completed", served.text
    finally:
        await ws.close()
    await assert_all_released(topology)


# ------------------------------------------------------------------------------------------ the same rollout,
# both ways
SCRIPT = "\n".join(
    [
        "Fix the failing test.",
        '!call grep {"q": "assert"}',
        '!call read_file {"path": "a.py"}',
        '!call grep {"q": "def mean"}',
        '!call read_file {"path": "b.py"}',
        "!say Fixed.",
    ]
)


async def timed_rollout(url: str) -> tuple[dict[str, Any], list[float]]:
    """One long-lived rollout of SCRIPT: the terminal response and each turn's TTFT (send → first delta,
    ms)."""
    ttfts: list[float] = []
    async with connect(url + "?protocol=longlived") as ws:
        sent = time.perf_counter()
        # The nonce heads the instructions, which head the prompt: the tool definitions that follow them
        # are the same in every test, and the shared engine would otherwise hold their block cached.
        session = nonce()
        await ws.send(
            create(f"Session {session}.\n" + SCRIPT, tool_choice="auto", instructions=f"Session {session}.")
        )
        first_seen = False
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), GUARD))
            kind = event["type"]
            if (
                kind in ("response.output_text.delta", "response.function_call_arguments.delta")
                and not first_seen
            ):
                ttfts.append((time.perf_counter() - sent) * 1e3)
                first_seen = True
            if kind == "response.done":
                answers = [
                    {
                        "type": "function_call_output",
                        "call_id": c["call_id"],
                        "output": f"{c['name']}: ok " * 30,
                    }
                    for c in event["pending_calls"]
                ]
                sent, first_seen = time.perf_counter(), False
                await ws.send(json.dumps({"type": "response.append", "input": answers}))
            elif kind in TERMINAL_TYPES | {"error"}:
                assert kind == "response.completed", event
                return event["response"], ttfts


async def test_a_rollout_through_the_engine_reports_the_same_usage_and_its_overhead_includes_the_hop(
    topology: Topology,
) -> None:
    local = ThreadedServer(Settings(db=":memory:", port=0, model_override=[FAST_OVERRIDE]))
    local.start()
    try:
        in_process, _ = await timed_rollout(local.url)
    finally:
        local.stop()
    remote, ttfts = await timed_rollout(ws_url(topology.a))
    assert remote["usage"] == in_process["usage"]
    assert [(t["prompt_tokens"], t["cached_tokens"], t["output_tokens"]) for t in remote["lab"]["turns"]] == [
        (t["prompt_tokens"], t["cached_tokens"], t["output_tokens"]) for t in in_process["lab"]["turns"]
    ]
    assert all("engine_hop" not in t["phases_ms"] for t in in_process["lab"]["turns"])
    turns = remote["lab"]["turns"]
    assert len(turns) == len(ttfts) == 5
    for turn, ttft in zip(turns, ttfts, strict=True):
        hop = turn["phases_ms"]["engine_hop"]
        assert hop > 0
        # The client's turn overhead (TTFT − the engine's prefill and queue wait) contains the measured hop.
        assert ttft - turn["prefill_ms"] - turn["queue_wait_ms"] >= hop
    assert remote["lab"]["phases_ms"]["engine_hop"] == pytest.approx(
        sum(t["phases_ms"]["engine_hop"] for t in turns)
    )
    await assert_all_released(topology)


# ------------------------------------------------------------------------------------------ the engine
# failing
async def test_an_engine_crash_mid_stream_gives_each_open_response_one_typed_terminal_event() -> None:
    engine = ChildEngine(["--model-override", f"{ONE_SLOT}:fail-rate=1"])  # every turn of it dies mid-stream
    workers: list[ChildServer] = []
    try:
        engine.wait_ready()
        workers = start_workers(engine)
        async with connect(
            ws_url(workers[0]) + "?protocol=longlived"
        ) as ws:  # an engine fault: its error chunk
            await ws.send(create("!tokens 50 !say hi", ONE_SLOT))
            failed = (await recv_until(ws, TERMINAL_TYPES))[-1]
            assert (
                failed["type"] == "response.failed"
                and failed["response"]["error"]["code"] == "engine_failure"
            )
            assert "injected engine failure" in failed["response"]["error"]["message"]
        sockets = [await streaming(ws_url(w)) for w in workers for _ in range(2)]
        engine.proc.kill()  # SIGKILL: the connections drop mid-stream
        engine.proc.wait()
        for ws in sockets:
            events = await recv_until(ws, TERMINAL_TYPES)
            assert [e["type"] for e in events if e["type"] in TERMINAL_TYPES | {"error"}] == [
                "response.failed"
            ], events[-1]
            assert events[-1]["response"]["error"]["code"] == "engine_failure"
            # The next frame is the next response's: nothing else ended the first one.
            await ws.send(create("!say hi"))
            after = await recv_until(ws, TERMINAL_TYPES)
            assert (
                after[0]["type"] == "response.created"
                and after[0]["response"]["id"] != events[-1]["response"]["id"]
            )
            assert (
                after[-1]["type"] == "response.failed"
                and after[-1]["response"]["error"]["code"] == "engine_failure"
            )  # unreachable
            assert "unreachable" in after[-1]["response"]["error"]["message"]
            await ws.close()
        for worker in workers:
            assert client_idle(worker.http_url)
    finally:
        for process in [*workers, engine]:
            process.stop()


async def test_an_engine_that_stalls_fails_the_response_after_the_timeout_on_virtual_time() -> None:
    with ChildEngine(["--model-override", FAST_OVERRIDE]) as engine:
        async with virtual(engine=engine.http_url, engine_timeout_s=5.0) as server:
            async with connect(server.url + "?protocol=longlived") as ws:
                os.kill(engine.proc.pid, signal.SIGSTOP)  # the engine stops answering: a real stall
                try:
                    await ws.send(create("!say hello"))
                    assert (await recv_until(ws, {"response.in_progress"}))[-1][
                        "type"
                    ] == "response.in_progress"
                    await server.advance(4.9)
                    with pytest.raises(TimeoutError):  # not yet: the timeout is 5 s of the server's clock
                        await asyncio.wait_for(ws.recv(), 0.3)
                    await server.advance(0.2)
                    failed = (await recv_until(ws, TERMINAL_TYPES))[-1]
                finally:
                    os.kill(engine.proc.pid, signal.SIGCONT)
                assert (
                    failed["type"] == "response.failed"
                    and failed["response"]["error"]["code"] == "engine_failure"
                )
                assert "sent nothing for 5 s" in failed["response"]["error"]["message"]
            # The engine, woken, finds the request's connection closed and lets it go.
            await until_true(lambda: engine_idle(engine.http_url), "the stalled request was let go")


# ------------------------------------------------------------------------------------------ serve --workers N
def workers_of(supervisor: psutil.Process) -> list[psutil.Process]:
    return [p for p in supervisor.children() if "multiprocessing.spawn" in " ".join(p.cmdline())]


def established(process: psutil.Process, port: int) -> int:
    return sum(
        1
        for c in process.net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port
    )


async def test_sigterm_with_two_workers_drains_every_websocket_with_1001(tmp_path: Path) -> None:
    db, port = tmp_path / "lab.db", free_port()
    script = Path(sys.executable).with_name("responses-lab")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "proto"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}
    server = await asyncio.create_subprocess_exec(
        *command,
        "serve",
        "--port",
        str(port),
        "--db",
        str(db),
        "--workers",
        "2",
        "--shutdown-grace-s",
        "5",
        "--model-override",
        FAST_OVERRIDE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    supervisor = psutil.Process(server.pid)
    url = f"ws://127.0.0.1:{port}/v1/responses"
    sockets: list[ClientConnection] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=GUARD) as http:
            for _ in range(500):
                try:
                    if (await http.get("/healthz")).status_code == 200 and len(workers_of(supervisor)) == 2:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        [engine] = [
            p for p in supervisor.children() if "engine" in p.cmdline()
        ]  # --workers 2 started one engine
        ids: list[str] = []
        busy: list[ClientConnection] = []
        # Connections go to whichever worker accepts first: open them until both workers hold some.
        while len(sockets) < 64 and not all(established(w, port) >= 2 for w in workers_of(supervisor)):
            streaming_ws = await connect(url + "?protocol=longlived")
            await streaming_ws.send(create(STREAM_FOREVER, SLOW))
            ids.append((await recv_until(streaming_ws, {"response.output_text.delta"}))[0]["response"]["id"])
            busy.append(streaming_ws)
            sockets += [streaming_ws, await connect(url)]
        assert all(established(w, port) >= 2 for w in workers_of(supervisor))
        server.send_signal(signal.SIGTERM)
        for ws in sockets:
            if ws in busy:
                error = (await recv_until(ws, set()))[-1]
                assert error["type"] == "error" and error["error"]["code"] == "server_shutting_down", error
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), GUARD)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert await asyncio.wait_for(server.wait(), 60) == 0
        assert not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE
    finally:
        for ws in sockets:
            await ws.close()
        if server.returncode is None:
            server.kill()
            await server.wait()
    with sqlite3.connect(db) as sql:
        billed = dict(sql.execute("SELECT response_id, status FROM usage").fetchall())
    assert billed == dict.fromkeys(ids, "cancelled")  # both workers' ledgers flushed into the one store


def test_workers_refuse_a_memory_database() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proto",
            "serve",
            "--workers",
            "2",
            "--db",
            ":memory:",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "give --db a file" in result.stderr


# ------------------------------------------------------------------------------------------ the wire, piece
# by piece
def test_the_event_stream_reassembles_chunks_split_anywhere() -> None:
    raw = b'data: {"a": 1}\r\n\r\n: keep-alive\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    for cut in range(len(raw)):
        stream = EventStream()
        got = stream.push(raw[:cut]) + stream.push(raw[cut:])
        assert got == [b'{"a": 1}', b'{"b": 2}', b"[DONE]"] and not stream.pending


def test_a_vllm_final_chunk_gives_the_report_its_metrics_say() -> None:
    # vLLM's last chunk with --enable-per-request-metrics and --enable-prompt-tokens-details (no extension).
    chunk = msgspec.json.decode(
        b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny","choices":[],'
        b'"usage":{"prompt_tokens":900,"completion_tokens":40,"total_tokens":940,"prompt_tokens_details":{"cached_tokens":880}},'
        b'"metrics":{"time_to_first_token_ms":12.5,"generation_time_ms":80.0,"queue_time_ms":0.5,"mean_itl_ms":2.05}}',
        type=StreamChunk,
    )
    report = _report(900, 40, chunk, sent_at=10.0, first_at=10.020)
    assert (report.cached_tokens, report.prefill_ms, report.queue_wait_ms, report.decode_ms) == (
        880,
        12.5,
        0.5,
        80.0,
    )
    assert report.phases_ms["engine_hop"] == pytest.approx(20.0 - 12.5 - 0.5)
    # an engine without timing: no hop to tell
    bare = _report(900, 40, StreamChunk(), sent_at=10.0, first_at=10.020)
    assert bare.prefill_ms == pytest.approx(20.0) and bare.phases_ms == {}


def test_engine_statuses_map_to_the_typed_failures() -> None:
    assert isinstance(_failure(503, "full"), EngineOverloaded) and isinstance(
        _failure(429, "slow down"), EngineOverloaded
    )
    assert isinstance(_failure(500, "boom"), EngineFailure) and isinstance(_failure(None, "?"), EngineFailure)


async def test_the_engine_refuses_bad_requests_as_vllm_does(topology: Topology) -> None:
    url = topology.engine.http_url
    async with httpx.AsyncClient(base_url=url, timeout=GUARD) as http:
        unknown = await http.post(
            "/v1/completions", json={"model": "gpt-9", "prompt": [1, 2], "max_tokens": 2}
        )
        assert (
            unknown.status_code == 404
            and unknown.json()["error"]["code"] == 404
            and unknown.json()["error"]["param"] == "model"
        )
        text = await http.post("/v1/completions", json={"model": FAST, "prompt": "words", "max_tokens": 2})
        assert text.status_code == 400 and text.json()["error"]["type"] == "BadRequestError"
        short = await http.post(
            "/v1/completions", json={"model": FAST, "prompt": [1], "max_tokens": 3, "min_tokens": 4}
        )
        assert short.status_code == 400 and short.json()["error"]["param"] == "min_tokens"
        whole = (
            await http.post(
                "/v1/completions",
                json={"model": FAST, "prompt": list(range(40)), "max_tokens": 3, "return_token_ids": True},
            )
        ).json()
        assert whole["usage"]["completion_tokens"] == 3 and len(whole["choices"][0]["token_ids"]) == 3
        assert (await http.delete("/v1/sequences/seq_nobody")).status_code == 404
        # A pin with a short TTL is dropped by the sweep even if nobody releases it (an API process died).
        lab = {"sequence_id": "seq_orphan", "pin": True, "pin_ttl_s": 0.1}
        body = {
            "model": FAST,
            "prompt": list(range(64)),
            "max_tokens": 2,
            "stream": True,
            "responses_lab": lab,
        }
        async with http.stream("POST", "/v1/completions", json=body) as reply:
            assert b"[DONE]" in b"".join([part async for part in reply.aiter_raw()])
        assert scrape(url)[("responses_lab_engine_pinned_sequences", "")] == 1
    await until_true(lambda: engine_idle(url), "the orphaned pin expired")


# ------------------------------------------------------------------------------------------ the lab on this
# topology
def test_the_lab_runs_on_a_spawned_engine_behind_two_workers_and_shows_the_hop(tmp_path: Path) -> None:
    workload = tmp_path / "tiny.json"
    workload.write_text(json.dumps(TINY), encoding="utf-8")
    out = tmp_path / "out"
    code = bench_main(
        [
            "--modes",
            "longlived,http",
            "--workload",
            str(workload),
            "--model",
            FAST,
            "--profile",
            "local",
            "--sessions",
            "1",
            "--rollouts",
            "1",
            "--warmup",
            "1",
            "--pings",
            "20",
            "--no-plots",
            "--out",
            str(out),
            "--engine",
            "spawn",
            "--workers",
            "2",
            "--model-override",
            FAST_OVERRIDE,
            # the fast model's calibration (240 rounds a mode) is test_lab_e2e's subject, not this one's
            "--no-predict",
        ]
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert "--engine spawn --workers 2" in results["command"]
    for run in results["runs"]:
        assert run["phases_ms"]["engine_hop"] > 0, run["mode"]  # a measured span of every turn's breakdown
        assert run["server_cpu_ms_per_turn"] >= 0  # psutil counts in 10 ms ticks: a tiny cell may read 0
        assert run["usage"]["output_tokens"] > 0
    # The supervisor's workers and the lab's engine, read by psutil: together they did cost CPU.
    assert sum(run["server_cpu_ms_per_turn"] for run in results["runs"]) > 0


async def test_the_engine_serves_the_calibrated_classes_and_its_step_metrics(topology: Topology) -> None:
    """The engine lists the calibrated classes with their profile and sources, runs one (a completion on
    mock-h200-llama8b is timed from its step tables), and exports the step loop's counters per model:
    vLLM's ``vllm:num_preemptions_total``, the steps run, the blocks pinned by suspended sequences."""
    url = topology.engine.http_url
    calibrated = "mock-h200-llama8b"
    before = scrape(url)
    async with httpx.AsyncClient(base_url=url, timeout=GUARD) as http:
        models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
        for name, profile in (
            (calibrated, "h200-llama3.1-8b-tp1-vllm"),
            ("mock-h200-llama70b", "h200-llama3.1-70b-tp8-vllm"),
            ("mock-h100-llama70b-fp8", "h100-llama3.1-70b-fp8-tp2-vllm"),
        ):
            assert models[name]["settings"]["step-profile"] == profile
            sources = models[name]["calibration"]["sources"]
            assert "aiconfigurator-core" in sources["step-profile"] and profile in sources["kv-cache-size"]
        done = await http.post(
            "/v1/completions",
            json={"model": calibrated, "prompt": [1, 2, 3], "max_tokens": 4, "stream": False},
        )
        assert done.status_code == 200, done.text
    after = scrape(url)
    for name in models:
        assert ("vllm:num_preemptions_total", name) in after
        assert ("responses_lab_engine_kv_blocks_pinned_suspended", name) in after
    # one prefill step (its first token) and three decode steps
    steps = ("responses_lab_engine_steps_total", calibrated)
    assert after[steps] - before[steps] == 4
    assert after[("vllm:num_preemptions_total", calibrated)] == 0
