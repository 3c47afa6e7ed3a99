"""A counting client: a WebSocket connection read as raw bytes, its frames counted by a marker, never parsed.

A Python WebSocket client parsing 100 k frames/s would be the bottleneck on a 2-core box, not the server it
measures; counting a marker keeps the client cheap (``stream``, ``capacity``). Only the reading side is its
own: what it sends is built with ``proto.client.messages`` (``workload.say_tokens``), like every client's.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import struct
import time
from typing import Any

import psutil

from proto.perf.schedstat import thread_cpu_seconds

DELTA = b'.delta"'  # in every *.delta event's type, in no other event of these streams
END = b'"response.completed"'
ENDS = (
    END,
    b'"response.incomplete"',
    b'"response.failed"',
)  # a stream that did not complete ends too (an error)


def client_frame(payload: bytes) -> bytes:
    """One masked text frame (RFC 6455 §5.3: a client masks every frame)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    key = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")
    return head + mask + masked


class Counting(asyncio.Protocol):
    """A WebSocket connection whose server frames are counted, never parsed: the time of every read that
    carried deltas, and how many it carried. Server frames are unmasked and (deflate declined) plain text."""

    def __init__(self, path: str, port: int) -> None:
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: "
            f"13\r\n\r\n"
        ).encode()
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._head = b""
        self._tail = b""
        self.reads: list[tuple[float, int]] = []  # (perf_counter, deltas in that read)
        self.bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.opened.done():
            data = self._handshake(data)
            if not data:
                return
        self.bytes += len(data)
        chunk = self._tail + data
        n = chunk.count(DELTA)
        if n:
            self.reads.append((now, n))
        if not self.ended.done():
            self._look_for_end(chunk)
        self._tail = chunk[-(max(map(len, ENDS)) - 1) :]

    def _handshake(self, data: bytes) -> bytes:
        """Collect the upgrade's answer; returns what came after it (frames already)."""
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            return b""
        if not self._head.startswith(b"HTTP/1.1 101"):
            self.opened.set_exception(RuntimeError(self._head[:200].decode(errors="replace")))
            return b""
        data, self._head = self._head[end + 4 :], b""
        self.opened.set_result(None)
        return data

    def _look_for_end(self, chunk: bytes) -> None:
        for end in ENDS:
            if end in chunk:
                if end is END:
                    self.ended.set_result(None)
                else:
                    self.ended.set_exception(RuntimeError(f"the stream ended {end.decode()}"))
                return

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_exception(exc or ConnectionError("closed before the end marker"))

    def send(self, event: dict[str, Any]) -> None:
        assert self.transport is not None
        self.transport.write(client_frame(json.dumps(event).encode()))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.write(struct.pack("!BB", 0x88, 0x80) + os.urandom(4))
            self.transport.close()

    @property
    def deltas(self) -> int:
        return sum(n for _, n in self.reads)

    def rate(self) -> float:
        """Deltas per second between the first read that carried one and the last."""
        if len(self.reads) < 2:
            return 0.0
        return (self.deltas - self.reads[0][1]) / (self.reads[-1][0] - self.reads[0][0])

    def max_gap_ms(self) -> float:
        times = [t for t, _ in self.reads]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0) * 1e3


async def counting(port: int, path: str) -> Counting:
    """A counting connection to ``path`` on loopback, once the upgrade is answered."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: Counting(path, port), "127.0.0.1", port)
    await proto.opened
    return proto


async def count_streams(
    port: int, path: str, first: dict[str, Any] | None, streams: int, process: psutil.Process
) -> tuple[float, int, float]:
    """``streams`` counting connections at once, each sent ``first``; returns (server CPU s, deltas, wall
    s)."""
    conns = [await counting(port, path) for _ in range(streams)]
    cpu0, t0 = thread_cpu_seconds(process), time.perf_counter()
    for conn in conns:
        if first is not None:
            conn.send(first)
    await asyncio.gather(*(c.ended for c in conns))
    cpu, wall = thread_cpu_seconds(process) - cpu0, time.perf_counter() - t0
    for conn in conns:
        conn.close()
    return cpu, sum(c.deltas for c in conns), wall
