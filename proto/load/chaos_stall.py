"""Chaos scenarios for the loop's and the sockets' bounds (docs/decisions/0015-bounded-work-on-the-loop.md;
docs/operations.md, "Unfinished request heads"), registered in ``proto.load.chaos``:

* ``loop_stall`` — texts that offer the tokenizer no cut point (one huge word, no letters, CJK on one line,
  digits, base64), past the context window, over GA WebSocket and HTTP: each is refused typed
  (``context_length_exceeded``) and another connection's ping round trip stays within a bound of its
  round trip beside prose of the same size, in the same run;
* ``slow_heads`` — slowloris connections (half a request line, then a byte now and then), plain requests
  and WebSocket upgrades, past the cap on a server of its own with a short deadline: each is answered 408
  and closed, at most the cap wait at once, and ``/healthz`` and a rollout get through meanwhile.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from websockets.asyncio.client import connect

from proto.core.events import TERMINAL_TYPES
from proto.processes import ChildServer

FAST = "mock-4000tps"
GUARD = 60.0  # seconds: against a hang only
CHARS = 448 * 1024  # characters a shape, each past the window (131 072 tokens): digits 3 a token, `a` 8 (x3)
STALL_FLOOR_S = 0.25  # a stall this long is a regression whatever the control (the defect held seconds)
HEAD_DEADLINE_S = 1.0
HEAD_CAP = 16


def shapes(rng: random.Random) -> dict[str, str]:
    return {
        "one word": "a" * (3 * CHARS),
        "no letters": "".join(rng.choices("!#$%&*+-/<=>?@^_|~", k=CHARS)),
        "CJK": "".join(chr(0x4E00 + rng.randrange(20_000)) for _ in range(CHARS)),
        "digits": "".join(rng.choices("0123456789", k=CHARS)),
        "base64": base64.b64encode(rng.randbytes(CHARS * 3 // 4)).decode(),
    }


def prose(chars: int) -> str:
    """Text of ``chars`` characters with a cut point every word, two characters a token (so as far past
    the window as the shapes are): the control."""
    return ("a " * (chars // 2 + 1))[:chars]


def _body(text: str) -> bytes:
    return json.dumps({"model": FAST, "input": text, "store": False}, ensure_ascii=False).encode()


async def _send(http_url: str, ws_url: str, payloads: list[bytes]) -> list[str]:
    """Each payload as a create, alternately over GA WebSocket and HTTP: the error code or status that
    ended it."""
    ended: list[str] = []
    async with (
        connect(ws_url, max_size=None) as ws,
        httpx.AsyncClient(base_url=http_url, timeout=GUARD) as http,
    ):
        for i, payload in enumerate(payloads):
            if i % 2 == 0:
                await ws.send(b'{"type":"response.create",' + payload[1:], text=True)
                while (event := json.loads(await asyncio.wait_for(ws.recv(), GUARD)))["type"] not in (
                    TERMINAL_TYPES | {"error"}
                ):
                    pass
                ended.append(event["error"]["code"] if event["type"] == "error" else event["type"])
            else:
                reply = await http.post(
                    "/v1/responses", content=payload, headers={"content-type": "application/json"}
                )
                answer = reply.json()
                ended.append(answer["error"]["code"] if reply.status_code >= 400 else answer["status"])
    return ended


async def _worst_ping(http_url: str, ws_url: str, payloads: list[bytes]) -> tuple[float, list[str]]:
    """The longest ping round trip (s) on a connection of its own while ``payloads`` are sent (from a loop
    and thread of their own, so that this loop only pings), and how each payload ended."""
    sent = asyncio.ensure_future(asyncio.to_thread(asyncio.run, _send(http_url, ws_url, payloads)))
    worst = 0.0
    async with connect(ws_url) as ws:
        while not sent.done():
            started = time.perf_counter()
            await asyncio.wait_for(await ws.ping(), GUARD)
            worst = max(worst, time.perf_counter() - started)
            await asyncio.sleep(0.002)
    return worst, await sent


async def loop_stall(server: ChildServer, book: Any, rng: random.Random) -> None:
    texts = shapes(rng)
    payloads = [_body(text) for text in texts.values()]
    control = [_body(prose(len(text))) for text in texts.values()]
    floor, _ = await _worst_ping(server.http_url, server.ws_url, control)
    worst, ended = await _worst_ping(server.http_url, server.ws_url, payloads)
    book.cases += len(payloads)
    book.answers.update({"control_ping_max_ms": round(floor * 1e3), "ping_max_ms": round(worst * 1e3)})
    for shape, how in zip(texts, ended, strict=True):
        book.answered(how)
        if how != "context_length_exceeded":
            book.violate(f"loop_stall: {shape} past the window ended {how}, not context_length_exceeded")
    if worst > max(4 * floor, STALL_FLOOR_S):
        book.violate(
            f"loop_stall: another connection's ping took {worst * 1e3:.0f} ms (prose: {floor * 1e3:.0f})"
        )


class _Slow:
    """A slowloris connection; ``answer`` reads until the server closes it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.answer = asyncio.ensure_future(reader.read())

    async def drip(self) -> None:
        if not self.answer.done():
            with contextlib.suppress(ConnectionError):
                self.writer.write(b"a")
                await self.writer.drain()

    def close(self) -> None:
        self.answer.cancel()
        self.writer.close()


async def slow_heads(book: Any, rng: random.Random) -> None:
    flags = ["--header-timeout-s", str(HEAD_DEADLINE_S), "--max-unfinished-headers", str(HEAD_CAP)]
    server = ChildServer(flags)
    await asyncio.to_thread(server.wait_ready)
    heads = [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ",
        b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Slow: ",
    ]
    slow: list[_Slow] = []
    try:
        for _ in range(HEAD_CAP * 4):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(rng.choice(heads))  # then a header value, a byte at a time
            slow.append(_Slow(reader, writer))
        book.cases += len(slow)
        await asyncio.wait([s.answer for s in slow], timeout=0.2)
        waiting = sum(not s.answer.done() for s in slow)
        if waiting > HEAD_CAP:
            book.violate(f"slow_heads: {waiting} unfinished heads open, past the cap of {HEAD_CAP}")
        async with httpx.AsyncClient(base_url=server.http_url, timeout=GUARD) as http:
            if (await http.get("/healthz")).status_code != 200:
                book.violate("slow_heads: /healthz did not answer beside unfinished heads")
            reply = await http.post("/v1/responses", json={"model": FAST, "input": "!say ok"})
            if reply.json().get("status") != "completed":
                book.violate(f"slow_heads: a create beside unfinished heads: {reply.text[:200]}")
        deadline = time.monotonic() + HEAD_DEADLINE_S + GUARD
        while not all(s.answer.done() for s in slow) and time.monotonic() < deadline:
            for s in slow:
                await s.drip()
            await asyncio.wait([s.answer for s in slow], timeout=0.3)  # the attacker's pace
        for s in slow:
            if not s.answer.done():
                book.violate("slow_heads: an unfinished head outlived the deadline")
                continue
            answer = b"" if s.answer.exception() is not None else s.answer.result()
            book.answered(answer.split(b"\r\n", 1)[0].decode(errors="replace") or "closed")
            if not answer.startswith(b"HTTP/1.1 408 "):
                book.violate(f"slow_heads: closed without 408: {answer[:80]!r}")
    finally:
        for s in slow:
            s.close()
        await asyncio.to_thread(server.stop)


def scenarios(
    server: Callable[[], ChildServer],
) -> list[tuple[str, Callable[[Any, random.Random], Awaitable[None]]]]:
    """(name, scenario) for ``proto.load.chaos.round_of_chaos``; ``server``: the round's target server."""
    return [
        ("loop_stall", lambda book, rng: loop_stall(server(), book, rng)),
        ("slow_heads", slow_heads),
    ]
