"""Request heads that never finish (docs/operations.md, "Unfinished request heads"): a slowloris client
(half a request line, then a byte now and then) is answered 408 and closed at ``--header-timeout-s``, and
past ``--max-unfinished-headers`` the longest-waiting is closed, so that under a small file-descriptor
limit a valid client, a WebSocket upgrade and ``/healthz`` still get through."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import Iterator

import httpx
import pytest
from helpers import GUARD, MODEL, TERMINAL_OR_ERROR, until
from websockets.asyncio.client import connect

from proto.processes import ChildServer

pytestmark = pytest.mark.process  # every test starts a server or a process

FDS = 256  # the server's descriptor limit: the default cap is a quarter of it
DEADLINE_S = 3.0
HEADS = (
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ",  # a plain request
    b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Slow: ",
)


@contextlib.contextmanager
def descriptor_limit(n: int) -> Iterator[None]:
    """A child started inside inherits a soft ``RLIMIT_NOFILE`` of ``n``; this process gets its own back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Slow:
    """One slowloris connection: an unfinished head, a byte at a time; ``answer`` reads to the server's
    close (what it wrote, and when it closed)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opened: float) -> None:
        self.writer = writer
        self.opened = opened  # before the connect: the server's deadline cannot start earlier
        self.ended: float | None = None
        self.answer = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> bytes:
        try:
            return await reader.read()
        except ConnectionError:
            return b""
        finally:
            self.ended = time.monotonic()

    @classmethod
    async def open(cls, port: int, head: bytes) -> Slow:
        opened = time.monotonic()  # the server's deadline starts when it accepts: after this
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        await writer.drain()
        return cls(reader, writer, opened)

    async def drip(self) -> None:
        """One more byte of the head, while the connection is open."""
        if not self.answer.done():
            with contextlib.suppress(ConnectionError):
                self.writer.write(b"a")
                await self.writer.drain()

    async def closed(self, within_s: float) -> bytes | None:
        """What the server wrote before closing, or None if it is still open after ``within_s``."""
        done, _ = await asyncio.wait([self.answer], timeout=within_s)
        return self.answer.result() if done else None

    def close(self) -> None:
        self.answer.cancel()
        self.writer.close()


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_unfinished_heads_are_capped_then_timed_out_and_valid_clients_get_through(http: str) -> None:
    with descriptor_limit(FDS):
        child = ChildServer(["--header-timeout-s", str(DEADLINE_S), "--http", http])
    with child as server:
        port = server.port
        slow = [await Slow.open(port, HEADS[i % 2]) for i in range(300)]  # more than the limit allows
        try:
            # The cap (a quarter of 256) holds: the longest-waiting were answered 408 and closed.
            answers = await asyncio.gather(*(s.closed(0.5) for s in slow))
            still = [s for s, answer in zip(slow, answers, strict=True) if answer is None]
            assert 0 < len(still) <= FDS // 4, len(still)
            assert set(still) <= set(slow[-FDS // 4 :])  # the newest stay
            assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers if answer is not None)
            # A valid client, /healthz and a WebSocket rollout get through meanwhile.
            async with httpx.AsyncClient(base_url=server.http_url, timeout=GUARD) as http:
                assert (await http.get("/healthz")).status_code == 200
                reply = await http.post("/v1/responses", json={"model": MODEL, "input": "!say ok"})
                assert reply.json()["status"] == "completed", reply.text
            async with connect(server.ws_url) as ws:
                await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "!say ok"}))
                assert (await until(ws, TERMINAL_OR_ERROR))[-1]["type"] == "response.completed"
            # The ones still waiting keep dripping, a byte every half second: each is answered 408 and
            # closed at the deadline, never before it, plain request and WebSocket upgrade alike.
            # (each valid client's connection waited too, and made room as a new slowloris would)
            still = [s for s in still if s.ended is None]
            guard = time.monotonic() + DEADLINE_S + GUARD
            while any(s.ended is None for s in still) and time.monotonic() < guard:
                for s in still:
                    await s.drip()
                await asyncio.sleep(0.5)  # the attacker's pace
            for s in still:
                answer = await s.closed(0)
                assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
                # both ends read the same monotonic clock; opened is before the server accepted
                assert s.ended is not None and s.ended - s.opened >= DEADLINE_S - 0.001
            assert {slow.index(s) % 2 for s in still} == {0, 1}  # plain requests and upgrades
            assert (await asyncio.to_thread(httpx.get, server.http_url + "/healthz")).status_code == 200
        finally:
            for s in slow:
                s.close()
