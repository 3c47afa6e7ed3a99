"""Chaos of credentials and the database file (``proto/load/chaos.py`` runs them with its own scenarios,
against its target, under its invariants):

* ``blank_keys`` — a server configured with an empty or blank key (one way of several, drawn by the
  seed) must refuse to start (it would count as keyed and bind off loopback); a keyed server must
  refuse every blank bearer token, on HTTP routes and the WebSocket upgrade (docs/operations.md,
  "Security");
* ``second_server`` — a second ``serve`` on the target's SQLite file while a long-lived response is
  suspended on it must be refused, and that response, resumed, is billed once as it ended (not
  ``server_crashed``);
* ``read_only`` — a read-only copy of the database must be refused at start-up with its reason;
* ``db_locked`` — a burst of stored creates behind a held lock: each answered 503 ``store_unavailable``
  within its own deadline (the busy timeout), not one timeout after another: the slowest refusal is
  compared with the same burst unlocked, measured in the same run.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
from websockets.asyncio.client import connect

from proto.client import messages
from proto.client.frames import decode, encode
from proto.core.events import TERMINAL_TYPES
from proto.processes import ChildServer


class Book(Protocol):
    """What these scenarios record in ``proto.load.chaos.Book`` (not imported: chaos imports this)."""

    cases: int
    blind: int

    def answered(self, how: str) -> None: ...

    def violate(self, what: str) -> None: ...

    def note(self, transport: str, event: dict[str, Any], current: str | None) -> str | None: ...


class Target(Protocol):
    """What they use of ``proto.load.chaos.Target``: its database file and its server."""

    db: Path

    @property
    def child(self) -> ChildServer: ...


Scenario = Callable[[Any, random.Random], Awaitable[None]]
FAST = "mock-4000tps"  # the chaos target overrides it to a 1 ms prefill
TOOLS = [{"type": "function", "name": "grep"}]
GUARD = 15.0  # seconds: against a hang only
KEY = "sk-chaos-0123456789abcdef"
BLANK_TOKENS = ("Bearer ", "Bearer  ", "Bearer \t", "Bearer \xa0", "bearer \xa0 \xa0")
ROUTES = (("POST", "/v1/responses"), ("GET", "/v1/models"), ("GET", "/healthz"), ("GET", "/v1/responses/r"))
START_S = 60.0  # a refused start ends in about a second; one still running after this started


def scenarios(target: Target, burst: int, busy_s: float) -> list[tuple[str, Scenario]]:
    """This module's scenarios, bound to ``target`` (``burst``: stored creates behind the lock;
    ``busy_s``: the target's ``--db-busy-timeout-s``)."""
    return [
        ("blank_keys", lambda book, rng: blank_keys(book, rng)),
        ("second_server", lambda book, rng: second_server(target, book, rng)),
        ("read_only", lambda book, rng: read_only(target, book, rng)),
        ("db_locked", lambda book, rng: db_locked(target, book, rng, burst, busy_s)),
    ]


def body(script: str, **fields: Any) -> dict[str, Any]:
    return messages.body(FAST, [messages.user_message(script)], tools=TOOLS, **fields)


async def refused_start(book: Book, what: str, flags: list[str], env: dict[str, str], expect: str) -> None:
    """``serve`` with these flags must exit non-zero within ``START_S``, saying ``expect``."""
    book.cases += 1
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proto", "serve", "--port", "0", *flags,
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _, raw = await asyncio.wait_for(process.communicate(), START_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        book.violate(f"{what}: the server started")
        return
    said = raw.decode(errors="replace")
    if process.returncode == 0 or expect not in said:
        book.violate(f"{what}: exit {process.returncode}, {said.strip()[-300:]!r}")
    else:
        book.answered(what)


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}, **extra}


# ------------------------------------------------------------------------------------------- blank keys
async def blank_keys(book: Book, rng: random.Random) -> None:
    """One of the ways to configure an empty key (drawn by the seed), refused to start, while a keyed
    server starts beside it; then every blank token on that server."""
    public = ["--host", "0.0.0.0", "--db", ":memory:"]
    what, flags, env = rng.choice(
        [
            ("flag empty beside a key", [*public, "--api-key", KEY, "--api-key="], _env()),
            ("flag blank", [*public, "--api-key", rng.choice([" ", "\t", "\xa0"])], _env()),
            ("env blank", public, _env(RESPONSES_LAB_API_KEY=rng.choice([" ", f"{KEY}, "]))),
        ]
    )
    server = ChildServer(["--log-level", "warning"], api_key=KEY, db=":memory:")
    try:
        await asyncio.gather(
            refused_start(book, what, flags, env, "empty key"), asyncio.to_thread(server.wait_ready)
        )
        host, port = server.http_url.removeprefix("http://").split(":")
        for method, path in ROUTES:
            for token in BLANK_TOKENS:
                await _expect(book, host, int(port), method, path, token, upgrade=False)
        for query in ("", "?protocol=longlived"):
            for token in BLANK_TOKENS:
                await _expect(book, host, int(port), "GET", "/v1/responses" + query, token, upgrade=True)
    finally:
        await asyncio.to_thread(server.stop)


async def _expect(
    book: Book, host: str, port: int, method: str, path: str, token: str, upgrade: bool
) -> None:
    """One request on a plain socket (HTTP clients will not send a header value ending in whitespace):
    401 wanted."""
    book.cases += 1
    reader, writer = await asyncio.open_connection(host, port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Authorization: {token}", "Content-Length: 0"]
    if upgrade:
        lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13"]
        lines += ["Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    try:
        status = (await asyncio.wait_for(reader.readline(), 15)).split()
    finally:
        writer.close()
    code = int(status[1]) if len(status) > 1 else 0
    if code != 401:
        book.violate(f"blank token {token!r} on {method} {path}{' (upgrade)' if upgrade else ''}: {code}")
    else:
        book.answered("401")


# ------------------------------------------------------------------------------------------- second server
async def second_server(target: Target, book: Book, rng: random.Random) -> None:
    calls = 'Work.\n!call grep {"q": 1}\n!tokens 20 !say done'
    async with connect(target.child.ws_url + "?protocol=longlived", max_size=None) as ws:
        await ws.send(encode(messages.create(body(calls))).decode())
        last, current = await _until_end(ws, book, None)
        await refused_start(
            book, "a second server on the file", ["--db", str(target.db)], _env(), "another live process"
        )
        while last.get("type") == "response.done":  # the response a second server would bill crashed
            answers = [
                messages.function_call_output(c["call_id"], "ok") for c in last.get("pending_calls", [])
            ]
            await ws.send(encode({"type": "response.append", "input": answers}).decode())
            last, current = await _until_end(ws, book, current)
        if last.get("type") != "response.completed":
            book.violate(f"second_server: the first server's response ended {last}")


async def _until_end(ws: Any, book: Book, current: str | None) -> tuple[dict[str, Any], str | None]:
    """Frames into ``book`` up to a suspension, a terminal event or an error; the last one."""
    while True:
        event: dict[str, Any] = decode(await asyncio.wait_for(ws.recv(decode=False), GUARD))
        current = book.note("longlived", event, current)
        if event.get("type") in TERMINAL_TYPES | {"response.done", "error"}:
            return event, current


# ------------------------------------------------------------------------------------------- read-only
async def read_only(target: Target, book: Book, rng: random.Random) -> None:
    copy = target.db.with_name("read-only.db")
    with sqlite3.connect(target.db) as source, sqlite3.connect(copy) as dest:
        source.backup(dest)  # a consistent copy of the live file, schema and rows
    source.close()
    dest.close()
    copy.chmod(0o444)
    immutable = os.access(copy, os.W_OK) and _chattr(copy, "+i")
    try:
        if os.access(copy, os.W_OK) and not immutable:
            book.answered("no read-only file here (root without chattr +i)")
            return
        await refused_start(book, "a read-only database", ["--db", str(copy)], _env(), "readonly")
    finally:
        if immutable:
            _chattr(copy, "-i")
        copy.chmod(0o644)


def _chattr(path: Path, flag: str) -> bool:
    chattr = shutil.which("chattr")
    return (
        chattr is not None and subprocess.run([chattr, flag, str(path)], capture_output=True).returncode == 0
    )


# ------------------------------------------------------------------------------------------- locked
async def db_locked(target: Target, book: Book, rng: random.Random, burst: int, busy_s: float) -> None:
    async with httpx.AsyncClient(base_url=target.child.http_url, timeout=GUARD) as http:

        async def one(store: bool) -> tuple[float, int, str]:
            started = time.monotonic()
            reply = await http.post("/v1/responses", json=body("!say stored", store=store))
            code = reply.json().get("error", {}).get("code", "") if reply.status_code != 200 else ""
            if reply.status_code == 200:
                book.note("json", {"type": "response.completed", "response": reply.json()}, None)
            return time.monotonic() - started, reply.status_code, code

        floor = max(elapsed for elapsed, _, _ in await asyncio.gather(*(one(False) for _ in range(burst))))
        holder = sqlite3.connect(target.db, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            results = await asyncio.gather(*(one(True) for _ in range(burst)))
        finally:
            holder.rollback()
            holder.close()
        book.cases += burst
        book.blind += sum(status != 200 for _, status, _ in results)  # a 503 body names no response
        for _, status, code in results:
            if (status, code) != (503, "store_unavailable"):
                book.violate(f"db_locked: a stored create answered {status} {code}")
        slowest = max(elapsed for elapsed, _, _ in results)
        # Each waits at most its own busy timeout; one after another would be burst x busy_s.
        if slowest > floor + 2 * busy_s + 0.25:
            book.violate(
                f"db_locked: the slowest of {burst} refusals took {slowest:.2f} s (unlocked burst "
                f"{floor:.2f} s, busy timeout {busy_s} s): the waits add up"
            )
        book.answered(f"slowest {slowest:.2f} s vs floor {floor:.2f} s")
