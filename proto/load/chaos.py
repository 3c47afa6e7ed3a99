"""Chaos against a real ``responses-lab serve`` on loopback: faults of every kind, each run checked against
the invariants below. Seeded, bounded in count and time; ``tests/test_chaos.py`` runs the short version
in ``make test``, ``responses-lab chaos --minutes N`` the long one (:func:`main`).

Scenarios:

* ``disconnects`` — a client leaves (close or abort) in every state of every transport: before a create,
  while it opens, streaming, suspended on a call, right after an append (a GA continuation), after the
  terminal event; SSE and JSON while their response runs;
* ``fuzz`` — frames mutated from valid ones (truncated, flipped, inserted bytes, values retyped, keys
  dropped, deep nesting, unknown types) over the long-lived protocol, GA WebSocket mode and HTTP bodies:
  every one answered typed (a registered code), the connection serving a valid rollout now and then;
* ``load`` — concurrent multi-turn rollouts over every transport on a model with injected engine failures
  (``--model-override NAME:fail-rate=…``);
* ``db_lock`` — the database locked past the busy timeout while rollouts store their responses;
* ``crash`` — SIGKILL with responses in flight on every transport, a restart on the same file;
* credentials and the database file (blank keys, a second server, read-only, locked): ``chaos_store``.

Invariants, after each scenario, read from ``/metrics`` and the database file:

* no leak — no WebSocket session left, the server's tasks back to their baseline, every engine's batch
  slots free, nothing waiting, KV pins back to their baseline, no ledger operation pending;
* one ledger row per response, with the delivered usage — a response whose terminal event was heard has a
  row equal to that event's usage; one cut short bills at least the output tokens its client received;
  rows the clients could not name (a JSON error body carries no id, a client that left before
  ``response.created``) never outnumber those blind starts; nothing billed twice, nothing given up on;
  no crash trace (open row) left;
* every response ends with one terminal event — never two, and exactly one for a client that stayed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from proto.client import messages
from proto.client.errors import ClientError
from proto.client.frames import decode, encode
from proto.client.http import HttpClient
from proto.core.errors import ERROR_CODES
from proto.core.events import TERMINAL_TYPES
from proto.helpfmt import HelpFormatter
from proto.load import chaos_stall, chaos_store
from proto.processes import ChildServer
from sampler.tokens import Tokenizer

FAST = "mock-4000tps"  # overridden to a 1 ms prefill
SLOW = "mock-65tps"  # 15 ms a token: a stream is always there to cut
FLAKY = "mock-1000tps"  # fail-rate set by the run
BUSY_S = 0.05  # --db-busy-timeout-s: a lock of more than this fails a store write
GUARD = 15.0  # seconds: against a hang only; a hang is reported as a violation
DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
TOOLS = [{"type": "function", "name": "grep"}, {"type": "function", "name": "read_file"}]
LONG = "Write at length.\n!tokens 5000 !say never"
CALLS = 'Work.\n!call grep {"q": 1}\n!call read_file {"path": "a.py"}\n!tokens 40 !say done'
_tokenizer = Tokenizer()


def body(script: str, model: str = FAST, **fields: Any) -> dict[str, Any]:
    return messages.body(model, [messages.user_message(script)], tools=TOOLS, **fields)


def frame_text(event: dict[str, Any]) -> str:
    """A valid event as the frame's text (the mutations work on ``json.dumps`` of the same dict)."""
    return encode(event).decode()


def create(script: str, model: str = FAST, **fields: Any) -> str:
    return frame_text(messages.create(body(script, model, **fields)))


def outputs(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [messages.function_call_output(call["call_id"], f"{call['name']}: ok") for call in calls]


# ------------------------------------------------------------------------------------------- bookkeeping
@dataclass
class Seen:
    """One response, as its client saw it."""

    transport: str
    terminals: int = 0
    usage: dict[str, Any] | None = None  # the terminal event's usage, when heard
    received: int = 0  # output tokens the client counted in deltas
    left: bool = False  # the client went away (or was cut) before a terminal event
    crashed: bool = (
        False  # the server died under it: billed from its durable trace, at most what was received
    )


@dataclass
class Book:
    """Every response the clients of one scenario saw, and the starts they could not name."""

    seen: dict[str, Seen] = field(default_factory=dict)
    blind: int = 0
    cases: int = 0  # faults injected
    violations: list[str] = field(default_factory=list)
    answers: dict[str, int] = field(default_factory=dict)  # fuzz: how each mutated frame was answered

    def answered(self, how: str) -> None:
        self.answers[how] = self.answers.get(how, 0) + 1

    def note(self, transport: str, event: dict[str, Any], current: str | None) -> str | None:
        """One event a client received; returns the id of the response it belongs to."""
        kind = event.get("type")
        response = event.get("response")
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            current = response["id"]
            self.seen.setdefault(current, Seen(transport))
        if current is None:
            return None
        seen = self.seen[current]
        if kind in DELTAS:
            seen.received += _tokenizer.count(str(event.get("delta", "")))
        elif kind in TERMINAL_TYPES:
            seen.terminals += 1
            # The response's total: a long-lived terminal event's own ``usage`` is only what is new since
            # its last response.done (so a client that sums every event gets the total).
            response = event["response"]
            seen.usage = (response.get("lab") or {}).get("usage_total") or response.get("usage")
        return current

    def left(self, response_id: str | None) -> None:
        if response_id is not None and self.seen[response_id].terminals == 0:
            self.seen[response_id].left = True

    def violate(self, what: str) -> None:
        self.violations.append(what)


def registered(error: Any) -> bool:
    return isinstance(error, dict) and error.get("code") in ERROR_CODES


# ------------------------------------------------------------------------------------------- the server
@dataclass
class Row:
    mode: str
    status: str
    reason: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int


class Target:
    """``responses-lab serve`` as a child process on a file database (restartable on the same file)."""

    def __init__(self, workdir: Path, fail_rate: float) -> None:
        self.db = workdir / "chaos.db"
        self.flags = [
            "--db-busy-timeout-s", str(BUSY_S), "--progress-interval-s", "0.05", "--send-timeout-s", "5",
            "--model-override", f"{FAST}:prefill-overhead=1,prefill-time-per-token=0",
            "--model-override", f"{FLAKY}:prefill-overhead=1,prefill-time-per-token=0,fail-rate={fail_rate}",
        ]  # fmt: skip
        self.server: ChildServer | None = None
        self.baseline: dict[str, float] = {}

    async def start(self) -> None:
        self.server = ChildServer(self.flags, db=str(self.db))
        await asyncio.to_thread(self.server.wait_ready)
        self.baseline = await self.metrics()

    @property
    def child(self) -> ChildServer:
        assert self.server is not None, "the target is not started"
        return self.server

    async def stop(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None

    def kill(self) -> None:
        self.child.kill()
        self.server = None

    async def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics``, summed over labels (``responses_lab_engine_running`` = all
        models)."""
        async with httpx.AsyncClient(base_url=self.child.http_url, timeout=GUARD) as http:
            text = (await http.get("/metrics")).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            key = name.split("{", 1)[0]
            values[key] = values.get(key, 0.0) + float(value)
        return values

    def rows(self) -> dict[str, Row]:
        with sqlite3.connect(self.db) as db:
            found = db.execute(
                "SELECT response_id, mode, status, reason, input_tokens, cached_tokens, output_tokens FROM "
                "usage"
            ).fetchall()
        db.close()
        return {r[0]: Row(*r[1:]) for r in found}

    def open_rows(self) -> int:
        with sqlite3.connect(self.db) as db:
            (count,) = db.execute("SELECT count(*) FROM open_responses").fetchone()
        db.close()
        return int(count)

    async def settle(self, book: Book) -> None:
        """The no-leak invariant: poll (bounded) until the server is back to its baseline."""
        base = self.baseline
        want = {
            "responses_lab_ws_sessions": 0.0,
            "responses_lab_engine_running": 0.0,
            "responses_lab_engine_waiting": 0.0,
            "responses_lab_engine_kv_blocks_used": base.get("responses_lab_engine_kv_blocks_used", 0.0),
            "responses_lab_ledger_pending": 0.0,
        }
        now: dict[str, float] = {}
        for _ in range(300):
            now = await self.metrics()
            if (
                all(now.get(k, 0.0) == v for k, v in want.items())
                and now["responses_lab_tasks"] <= base["responses_lab_tasks"]
            ):
                break
            await asyncio.sleep(0.05)
        else:
            left = {
                k: now.get(k)
                for k in (*want, "responses_lab_tasks")
                if now.get(k) != want.get(k, base["responses_lab_tasks"])
            }
            book.violate(f"leak: {left} (baseline tasks {base['responses_lab_tasks']})")
        for name in (
            "responses_lab_ledger_failed",
            "responses_lab_ledger_duplicates",
            "responses_lab_ledger_overflow",
        ):
            if now.get(name, 0.0):
                book.violate(f"{name} = {now[name]}")

    def check_ledger(self, book: Book, before: set[str]) -> None:
        """One row per response, with the delivered usage; every response ends with one terminal event."""
        rows = self.rows()
        for response_id, seen in book.seen.items():
            found = rows.get(response_id)
            if found is None:
                book.violate(f"{seen.transport} {response_id}: no ledger row")
                continue
            if seen.terminals > 1:
                book.violate(f"{seen.transport} {response_id}: {seen.terminals} terminal events")
            if seen.usage is not None:
                heard = (
                    seen.usage["input_tokens"],
                    seen.usage["input_tokens_details"]["cached_tokens"],
                    seen.usage["output_tokens"],
                )
                billed = (found.input_tokens, found.cached_tokens, found.output_tokens)
                if heard != billed:
                    book.violate(f"{seen.transport} {response_id}: terminal usage {heard} != ledger {billed}")
                if (
                    seen.transport != "json" and heard[2] != seen.received
                ):  # the client heard every token it pays for
                    book.violate(
                        f"{seen.transport} {response_id}: terminal usage says {heard[2]} output tokens, the "
                        f"client received {seen.received}"
                    )
            elif not seen.left:
                book.violate(f"{seen.transport} {response_id}: no terminal event though the client stayed")
            elif not seen.crashed and found.output_tokens < seen.received:
                book.violate(
                    f"{seen.transport} {response_id}: billed {found.output_tokens} < received {seen.received}"
                )
        unnamed = set(rows) - before - set(book.seen)
        if len(unnamed) > book.blind:
            book.violate(
                f"{len(unnamed)} ledger rows for responses no client saw start, {book.blind} blind starts"
            )
        if self.open_rows():
            book.violate(f"{self.open_rows()} crash-trace rows left open")


# ------------------------------------------------------------------------------------------- clients
async def recv(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = decode(await asyncio.wait_for(ws.recv(decode=False), GUARD))
    return event


async def ws_until(
    ws: ClientConnection,
    book: Book,
    transport: str,
    stop: frozenset[str],
    current: str | None = None,
    deltas: int = 0,
) -> tuple[dict[str, Any], str | None]:
    """Frames into ``book`` until one of ``stop`` (or an error), or until ``deltas`` deltas; the last
    frame."""
    count = 0
    while True:
        event = await recv(ws)
        current = book.note(transport, event, current)
        count += event.get("type") in DELTAS
        if event.get("type") in stop | {"error"} or (deltas and count >= deltas):
            return event, current


async def leave(ws: ClientConnection, how: str) -> None:
    if how == "abort":
        ws.transport.abort()
    else:
        with contextlib.suppress(WebSocketException, OSError):
            await ws.close()


def ws_url(target: Target, protocol: str) -> str:
    return target.child.ws_url + ("?protocol=longlived" if protocol == "longlived" else "")


# ------------------------------------------------------------------------------------------- disconnects
WS_STATES = ("before_create", "opening", "streaming", "suspended", "mid_append", "after_terminal")
HTTP_STATES = ("opening", "streaming", "after_terminal")


async def _ws_case(
    target: Target, book: Book, protocol: str, where: str, how: str, rng: random.Random
) -> None:
    transport = protocol
    terminal = TERMINAL_TYPES if protocol == "ga" else TERMINAL_TYPES | {"response.done"}
    current: str | None = None
    async with connect(ws_url(target, protocol), max_size=None) as ws:
        if where == "opening":
            await ws.send(create(LONG, SLOW))
            book.blind += 1  # it may leave before response.created names the response
        elif where == "streaming":
            await ws.send(create(LONG, SLOW))
            _, current = await ws_until(ws, book, transport, frozenset(), deltas=rng.randint(1, 30))
        elif where in ("suspended", "mid_append"):
            await ws.send(create(CALLS, FAST if where == "suspended" else SLOW))
            last, current = await ws_until(ws, book, transport, terminal)
            if where == "mid_append" and last["type"] in ("response.done", "response.completed"):
                calls = last.get("pending_calls") or [
                    i for i in last["response"]["output"] if i["type"] == "function_call"
                ]
                if protocol == "longlived":
                    await ws.send(frame_text(messages.append(outputs(calls))))
                else:  # the GA spelling: a continuation (the cached response), left as soon as it is sent
                    follow = messages.body(
                        SLOW, outputs(calls), tools=TOOLS, previous_response_id=current, store=False
                    )
                    await ws.send(frame_text(messages.create(follow)))
                    book.blind += 1
        elif where == "after_terminal":
            await ws.send(create("!say done"))
            _, current = await ws_until(ws, book, transport, TERMINAL_TYPES)
        await leave(ws, how)
    book.left(current)


async def _http_case(target: Target, book: Book, transport: str, where: str, rng: random.Random) -> None:
    async with HttpClient(target.child.http_url, timeout=GUARD) as http:
        if transport == "json":
            if where == "after_terminal":
                reply = await http.post(body("!say done"))
                for event in ({"type": "response.completed", "response": reply.json()},):
                    book.note("json", event, None)
                return
            request = asyncio.create_task(http.post(body(LONG, SLOW)))
            book.blind += 1
            await asyncio.sleep(0.0 if where == "opening" else rng.uniform(0.05, 0.3))
            request.cancel()  # the client gives up: its connection closes
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await request
            return
        current: str | None = None
        async with http.stream(body("!say done" if where == "after_terminal" else LONG, SLOW)) as events:
            if where == "opening":
                book.blind += 1
                return
            wanted = rng.randint(1, 30)
            count = 0
            async for got in events:
                current = book.note("sse", got.data, current)
                count += got.type in DELTAS
                if where == "streaming" and count >= wanted:
                    break
        book.left(current)


async def disconnects(target: Target, book: Book, rng: random.Random, rounds: int) -> None:
    cases = [(p, s) for p in ("longlived", "ga") for s in WS_STATES] + [
        (p, s) for p in ("sse", "json") for s in HTTP_STATES
    ]
    for _ in range(rounds):
        rng.shuffle(cases)
        for transport, where in cases:
            book.cases += 1
            try:
                if transport in ("longlived", "ga"):
                    await _ws_case(target, book, transport, where, rng.choice(("close", "abort")), rng)
                else:
                    await _http_case(target, book, transport, where, rng)
            except (TimeoutError, ConnectionClosed, httpx.HTTPError, ClientError) as exc:
                book.violate(f"disconnect {transport}/{where}: {type(exc).__name__} {exc}")


# ------------------------------------------------------------------------------------------- fuzz
_VALUES: tuple[Any, ...] = (
    None,
    0,
    -1,
    2**63,
    1.5,
    "",
    "x" * 1000,
    [],
    {},
    True,
    [1, "a", None],
    {"type": "message"},
)


def mutate(rng: random.Random, frame: dict[str, Any], binary: bool = False) -> str | bytes:
    """One seeded mutation of a valid frame: the text (or, where ``binary``, sometimes bytes) to send."""
    text = json.dumps(frame)
    kinds = ("truncate", "flip", "insert", "retype", "drop", "nest", "type", "empty", "garbage")
    kind = rng.choice((*kinds, "binary") if binary else kinds)
    if kind == "binary":
        return text.encode()
    if kind == "truncate":
        return text[: rng.randrange(len(text))]
    if kind == "flip":
        at = rng.randrange(len(text))
        return text[:at] + chr(rng.randrange(32, 127)) + text[at + 1 :]
    if kind == "insert":
        at = rng.randrange(len(text))
        return text[:at] + "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randint(1, 8))) + text[at:]
    if kind == "empty":
        return rng.choice(("", " ", "{}", "[]", "null", '"response.create"'))
    if kind == "garbage":
        return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randint(1, 64)))
    if kind == "nest":
        depth = rng.choice((10, 200, 5000, 50000))
        return text.replace('"input":', '"input":' + "[" * depth + "1" + "]" * depth + ',"x":', 1)
    if kind == "type":
        return json.dumps(
            {**frame, "type": rng.choice(("response.creat", "session.update", "", "response.append.x", 7))}
        )
    mutated = json.loads(text)
    target: Any = mutated
    path: list[Any] = []
    while isinstance(target, dict | list) and target and rng.random() < 0.7:  # walk down into a random field
        key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
        path.append(key)
        target = target[key]
    parent: Any = mutated
    for key in path[:-1]:
        parent = parent[key]
    if not path:
        return json.dumps(rng.choice(_VALUES))
    if kind == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(_VALUES)
    return json.dumps(mutated)


async def _fuzz_ws(target: Target, book: Book, protocol: str, rng: random.Random, count: int) -> None:
    bases: list[dict[str, Any]] = [messages.create(body("!say hi"))]
    if protocol == "longlived":
        bases += [
            messages.append(outputs([{"call_id": "call_x", "name": "grep"}])),
            messages.cancel(),
            messages.inject("resp_x", []),
        ]
    terminal = TERMINAL_TYPES | {"response.done", "response.inject.failed", "response.inject.created"}
    async with connect(ws_url(target, protocol), max_size=None) as ws:
        for n in range(count):
            book.cases += 1
            if protocol == "longlived" and n % 5 == 4:
                await _fuzz_suspended(ws, book, rng)
                continue
            frame = mutate(rng, rng.choice(bases), binary=True)
            await ws.send(frame)
            try:
                last, current = await ws_until(ws, book, protocol, terminal)
                book.answered(
                    str(last["error"].get("code")) if last["type"] == "error" else str(last["type"])
                )
                if last["type"] == "error" and not registered(last.get("error")):
                    book.violate(f"fuzz {protocol}: unregistered error {last} for {frame[:120]!r}")
                if last["type"] == "response.done":  # a mutation that is still a valid create: end it
                    await ws.send(frame_text(messages.cancel()))
                    await ws_until(ws, book, protocol, TERMINAL_TYPES, current)
                if n % 10 == 9:  # the connection still serves a valid rollout
                    await ws.send(create("!say ok"))
                    ok, _ = await ws_until(ws, book, protocol, TERMINAL_TYPES)
                    if ok["type"] != "response.completed":
                        book.violate(f"fuzz {protocol}: the connection no longer serves: {ok}")
            except (TimeoutError, ConnectionClosed) as exc:
                book.violate(f"fuzz {protocol}: no typed answer to {frame[:120]!r}: {type(exc).__name__}")
                return


async def _fuzz_suspended(ws: ClientConnection, book: Book, rng: random.Random) -> None:
    """Mutated appends to a suspended response, each followed by the valid one: every refusal is typed, the
    response goes on to its terminal event. (An append that is valid but incomplete is accepted silently,
    as the protocol has it, so the valid one is sent right behind it instead of waiting for an answer.)"""
    await ws.send(create(CALLS))
    last, current = await ws_until(ws, book, "longlived", TERMINAL_TYPES | {"response.done"})
    while last["type"] == "response.done":
        valid = messages.append(outputs(last["pending_calls"]))
        frame = mutate(rng, valid, binary=True)
        await ws.send(frame)
        await ws.send(frame_text(valid))
        while True:
            last, current = await ws_until(ws, book, "longlived", TERMINAL_TYPES | {"response.done"}, current)
            if last["type"] != "error":
                break
            book.answered(f"suspended {last['error'].get('code')}")
            if not registered(last.get("error")):
                book.violate(f"fuzz suspended: unregistered error {last} for {frame[:120]!r}")
    if last["type"] != "response.completed":
        book.violate(f"fuzz suspended: the response ended {last['type']}")


async def _fuzz_http(target: Target, book: Book, rng: random.Random, count: int) -> None:
    base = body("!say hi")
    async with httpx.AsyncClient(base_url=target.child.http_url, timeout=GUARD) as http:
        for n in range(count):
            book.cases += 1
            text = mutate(rng, base)
            try:
                data = text if isinstance(text, bytes) else text.encode()
                reply = await http.post(
                    "/v1/responses", content=data, headers={"content-type": "application/json"}
                )
                answer = reply.json()
            except (httpx.HTTPError, ValueError) as exc:
                book.violate(f"fuzz http: no JSON answer to {text[:120]!r}: {type(exc).__name__}")
                continue
            book.answered(f"http {reply.status_code} {(answer.get('error') or {}).get('code', '')}".strip())
            if reply.status_code == 200:
                book.note("json", {"type": "response.completed", "response": answer}, None)
            elif not registered(answer.get("error")):
                book.violate(f"fuzz http: {reply.status_code} without a registered error: {reply.text[:200]}")
                if reply.status_code >= 500:
                    book.blind += 1
            elif reply.status_code >= 500:
                book.blind += 1  # a response that ran and failed: its id is not in the error body
            if n % 10 == 9:
                ok = await http.post("/v1/responses", json=body("!say ok"))
                book.note("json", {"type": "response.completed", "response": ok.json()}, None)


async def fuzz(target: Target, book: Book, rng: random.Random, count: int) -> None:
    await _fuzz_ws(target, book, "longlived", rng, count)
    await _fuzz_ws(target, book, "ga", rng, count)
    await _fuzz_http(target, book, rng, count)


# ------------------------------------------------------------------------------------------- load
async def rollout(
    target: Target, book: Book, transport: str, model: str, store: bool = False
) -> list[dict[str, Any]]:
    """One multi-turn rollout to its end over ``transport``; the terminal events (or error bodies) it got."""
    ends: list[dict[str, Any]] = []
    if transport == "longlived":
        async with connect(ws_url(target, "longlived"), max_size=None) as longlived:
            await longlived.send(create(CALLS, model, store=store))
            current: str | None = None  # one response over every turn
            while True:
                last, current = await ws_until(
                    longlived, book, transport, TERMINAL_TYPES | {"response.done"}, current
                )
                if last["type"] != "response.done":
                    return [*ends, last]
                await longlived.send(frame_text(messages.append(outputs(last["pending_calls"]))))
    payload = body(CALLS, model, store=store or transport in ("sse", "json"))  # HTTP continues a stored chain
    async with contextlib.AsyncExitStack() as stack:
        ws: ClientConnection | None = None
        if transport == "ga":
            ws = await stack.enter_async_context(connect(ws_url(target, "ga"), max_size=None))
        http = await stack.enter_async_context(HttpClient(target.child.http_url, timeout=GUARD))
        while True:
            last = await _one(book, transport, payload, ws, http)
            ends.append(last)
            response = last.get("response") or {}
            calls = [i for i in response.get("output", []) if i.get("type") == "function_call"]
            if last.get("type") != "response.completed" or not calls:
                return ends
            payload = messages.continuation(
                body("", model, store=payload["store"]), outputs(calls), response["id"]
            )


async def _one(
    book: Book, transport: str, payload: dict[str, Any], ws: ClientConnection | None, http: HttpClient
) -> dict[str, Any]:
    if ws is not None:
        await ws.send(frame_text(messages.create(payload)))
        last, _ = await ws_until(ws, book, transport, TERMINAL_TYPES)
        return last
    if transport == "sse":
        last = {}
        current: str | None = None
        async with http.stream(payload) as events:
            async for got in events:
                last = got.data
                current = book.note("sse", last, current)
        return last
    reply = await http.post(payload)
    answer: dict[str, Any] = reply.json()
    if reply.status_code == 200:
        event = {
            "type": "response.completed" if answer.get("status") == "completed" else "response.incomplete",
            "response": answer,
        }
        book.note("json", event, None)
        return event
    book.blind += 1  # failed before any byte: the OpenAI error body, without the response's id
    return {"type": "error", "error": answer.get("error")}


async def load(target: Target, book: Book, rng: random.Random, rollouts: int, concurrency: int = 30) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        transport = rng.choice(("longlived", "ga", "sse", "json"))
        model = rng.choice((FAST, FLAKY, FLAKY))
        async with gate:
            book.cases += 1
            try:
                ends = await rollout(target, book, transport, model)
            except (TimeoutError, ConnectionClosed, httpx.HTTPError, ClientError) as exc:
                book.violate(f"load {transport}: {type(exc).__name__} {exc}")
                return
            last = ends[-1]
            error = (last.get("response") or {}).get("error") or last.get("error")
            book.answered(
                f"{transport} {last['type']} {error.get('code') if isinstance(error, dict) else ''}".strip()
            )
            if last["type"] in ("response.failed", "error") and not (
                isinstance(error, dict) and error.get("code") == "engine_failure"
            ):
                book.violate(f"load {transport}: ended {last['type']} {error}")

    await asyncio.gather(*(one() for _ in range(rollouts)))


# ------------------------------------------------------------------------------------------- database lock
async def db_lock(target: Target, book: Book, rng: random.Random, rollouts: int) -> None:
    """Hold the file's write lock for several busy timeouts while rollouts store their responses."""
    holder = sqlite3.connect(target.db, isolation_level=None, check_same_thread=False)
    hold_s = rng.uniform(4, 10) * BUSY_S
    holder.execute("BEGIN EXCLUSIVE")
    locked_at = time.monotonic()
    try:
        transports = [rng.choice(("longlived", "ga", "sse", "json")) for _ in range(rollouts)]
        book.cases += len(transports)
        results = await asyncio.gather(
            *(rollout(target, book, t, FAST, store=True) for t in transports), return_exceptions=True
        )
        for transport, result in zip(transports, results, strict=True):
            if isinstance(result, BaseException):
                book.violate(f"db_lock {transport}: {type(result).__name__} {result}")
                continue
            for end in result:
                error = (end.get("response") or {}).get("error") or end.get("error")
                if end["type"] in ("response.failed", "error") and not (
                    isinstance(error, dict) and error.get("code") == "store_unavailable"
                ):
                    book.violate(f"db_lock {transport}: ended {end['type']} {error}")
        await asyncio.sleep(max(0.0, hold_s - (time.monotonic() - locked_at)))
    finally:
        holder.rollback()
        holder.close()
    for transport in ("longlived", "ga", "sse", "json"):  # the lock gone, every transport stores again
        ends = await rollout(target, book, transport, FAST, store=True)
        if ends[-1]["type"] != "response.completed":
            book.violate(f"db_lock: after the lock, {transport} ended {ends[-1]}")


# ------------------------------------------------------------------------------------------- crash
async def crash(target: Target, book: Book, rng: random.Random) -> None:
    """SIGKILL with responses in flight on every transport; restart on the same file; reconcile."""
    in_flight: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        sockets = {
            name: await stack.enter_async_context(connect(ws_url(target, name), max_size=None))
            for name in ("longlived", "ga")
        }
        for name, ws in sockets.items():
            await ws.send(create(LONG, SLOW))
            _, streaming = await ws_until(ws, book, name, frozenset(), deltas=rng.randint(1, 20))
            if streaming is not None:
                in_flight[streaming] = name
        http = await stack.enter_async_context(HttpClient(target.child.http_url, timeout=GUARD))
        events = await stack.enter_async_context(http.stream(body(LONG, SLOW)))
        current: str | None = None
        count = 0
        async for event in events:
            current = book.note("sse", event.data, current)
            count += 1
            if count > 8:
                break
        if current is not None:
            in_flight[current] = "sse"
        if len(in_flight) != 3:
            book.violate(f"crash: only {sorted(in_flight.values())} started streaming")
        for _ in range(300):  # every trace durable with some output (bounded poll)
            with sqlite3.connect(target.db) as db:
                traced = db.execute("SELECT count(*) FROM open_responses WHERE output_tokens > 0").fetchone()[
                    0
                ]
            db.close()
            if traced >= len(in_flight):
                break
            await asyncio.sleep(0.02)
        book.cases += 1
        target.kill()
        for name, ws in sockets.items():  # what the dead server had written still arrives
            with contextlib.suppress(ConnectionClosed, TimeoutError):
                while True:
                    book.note(name, await recv(ws), next(r for r, t in in_flight.items() if t == name))
        with contextlib.suppress(httpx.HTTPError):
            async for event in events:
                book.note("sse", event.data, current)
    for response_id in in_flight:
        book.left(response_id)
        book.seen[response_id].crashed = True
    await target.start()  # the same file: reconciled before it serves
    rows = target.rows()
    for response_id, transport in in_flight.items():
        found = rows.get(response_id)
        if found is None or (found.status, found.reason) != ("incomplete", "server_crashed"):
            book.violate(f"crash {transport} {response_id}: billed {found} (want incomplete, server_crashed)")
        elif found.output_tokens > book.seen[response_id].received:
            book.violate(
                f"crash {transport} {response_id}: billed {found.output_tokens} > received "
                f"{book.seen[response_id].received}"
            )
    ends = await rollout(target, book, "longlived", FAST)
    if ends[-1]["type"] != "response.completed":
        book.violate(f"crash: the restarted server does not serve: {ends[-1]}")


# ------------------------------------------------------------------------------------------- the run
@dataclass
class Outcome:
    scenario: str
    seed: int
    cases: int
    responses: int
    blind: int
    seconds: float
    violations: list[str]
    answers: dict[str, int]


@dataclass
class Sizes:
    """How much of each scenario one round runs."""

    disconnect_rounds: int = 2  # every (transport, state) pair, shuffled, per round
    fuzz_frames: int = 60  # per transport
    load_rollouts: int = 80  # multi-turn rollouts, 30 at a time
    lock_rollouts: int = 12  # stored rollouts while the database is locked
    fail_rate: float = 0.3  # FLAKY's injected engine failures per turn

    @classmethod
    def long(cls) -> Sizes:
        return cls(disconnect_rounds=5, fuzz_frames=200, load_rollouts=300, lock_rollouts=40)


async def round_of_chaos(seed: int, sizes: Sizes, workdir: Path | None = None) -> list[Outcome]:
    """Every scenario once, on one server (the crash restarts it), each checked against the invariants."""
    outcomes: list[Outcome] = []
    with contextlib.ExitStack() as cleanup:
        root = workdir or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        target = Target(root, sizes.fail_rate)
        await target.start()
        try:
            scenarios: list[tuple[str, Callable[[Book, random.Random], Awaitable[None]]]] = [
                ("disconnects", lambda book, rng: disconnects(target, book, rng, sizes.disconnect_rounds)),
                ("fuzz", lambda book, rng: fuzz(target, book, rng, sizes.fuzz_frames)),
                ("load", lambda book, rng: load(target, book, rng, sizes.load_rollouts)),
                ("db_lock", lambda book, rng: db_lock(target, book, rng, sizes.lock_rollouts)),
                ("crash", lambda book, rng: crash(target, book, rng)),
                *chaos_store.scenarios(target, sizes.lock_rollouts, BUSY_S),
                *chaos_stall.scenarios(lambda: target.child),
            ]
            for name, scenario in scenarios:
                rng = random.Random(f"{seed}:{name}")
                book = Book()
                before = set(target.rows())
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(120 + 10 * sizes.load_rollouts):
                        await scenario(book, rng)
                except Exception as exc:  # a scenario that breaks is a finding, reported with the rest
                    book.violate(f"{name} aborted: {type(exc).__name__} {exc}")
                if target.server is not None:
                    await target.settle(book)
                    target.check_ledger(book, before)
                seconds = round(time.perf_counter() - started, 2)
                outcomes.append(
                    Outcome(
                        name,
                        seed,
                        book.cases,
                        len(book.seen),
                        book.blind,
                        seconds,
                        book.violations,
                        book.answers,
                    )
                )
        finally:
            await target.stop()
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| scenario | seed | faults | responses seen | blind starts | s | violations |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.scenario} | {o.seed} | {o.cases} | {o.responses} | {o.blind} | {o.seconds} | "
            f"{len(o.violations)} |"
        )
    for o in outcomes:
        lines.extend(f"- {o.scenario} (seed {o.seed}): {v}" for v in o.violations[:20])
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- the long run
async def rounds_for(minutes: float, seed: int, sizes: Sizes) -> list[Outcome]:
    """Round after round, a new seed each (``seed``, ``seed + 1``, …), until ``minutes`` have passed; each
    round's table printed as it ends."""
    deadline = time.monotonic() + minutes * 60
    outcomes: list[Outcome] = []
    round_seed = seed
    while True:
        batch = await round_of_chaos(round_seed, sizes)
        outcomes += batch
        print(table(batch), flush=True)
        round_seed += 1
        if time.monotonic() >= deadline:
            return outcomes


def totals(outcomes: list[Outcome]) -> str:
    """Rounds, faults, responses seen and violations per scenario, over every round."""
    sums: dict[str, list[int]] = {}
    for o in outcomes:
        total = sums.setdefault(o.scenario, [0, 0, 0, 0])
        total[0] += 1
        total[1] += o.cases
        total[2] += o.responses
        total[3] += len(o.violations)
    lines = ["| scenario | rounds | faults | responses seen | violations |", "|---|---|---|---|---|"]
    lines += [
        f"| {name} | {rounds} | {cases} | {responses} | {violations} |"
        for name, (rounds, cases, responses, violations) in sums.items()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``responses-lab chaos``: every scenario, round after round with a new seed each, until ``--minutes``
    have passed, each round on a fresh ``responses-lab serve``; the table of faults and violations, and exit
    status 1 if any invariant broke. ``--short``: the sizes of ``tests/test_chaos.py`` (one round takes ~30 s
    on 2 cores); the default sizes are :meth:`Sizes.long` (300 rollouts under injected engine failures, 200
    fuzzed frames per transport, five rounds of disconnects in every state)."""
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter, prog="responses-lab chaos", description=main.__doc__
    )
    run = parser.add_argument_group("the run")
    output = parser.add_argument_group("output")
    run.add_argument("--minutes", type=float, default=5.0, help="how long to go on, round after round")
    run.add_argument("--seed", type=int, default=1, help="seed of the scenarios' random choices")
    run.add_argument("--short", action="store_true", help="the test suite's sizes")
    output.add_argument("--json", type=Path, default=None, help="write every outcome here")
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcomes = asyncio.run(rounds_for(args.minutes, args.seed, Sizes() if args.short else Sizes.long()))
    print(f"\n{len({o.seed for o in outcomes})} rounds in {time.monotonic() - started:.0f} s")
    print(totals(outcomes))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 1 if any(o.violations for o in outcomes) else 0
