"""The outbox writes a batch at once when nothing is ahead of it and the transport takes it (no hop to the
writer task: the frames are out before the producer does anything else), and queues it behind whatever is
queued or being written otherwise — in order, one write per batch either way."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from proto.server.config import Settings
from proto.server.transports.websocket import FRAMES_EXTENSION, Outbox
from sampler.clock import FakeClock


class Socket:
    """What the outbox sees of a starlette WebSocket on our uvicorn protocol: the extension's ``write_now``
    and the ASGI ``send`` (which waits while ``paused``)."""

    def __init__(self) -> None:
        self.writable = True
        self.resumed = asyncio.Event()
        self.writes: list[list[bytes]] = []  # every transport write, in order
        self.scope: dict[str, Any] = {"extensions": {FRAMES_EXTENSION: {"write_now": self.write_now}}}

    def write_now(self, frames: Sequence[bytes]) -> bool:
        if not self.writable:
            return False
        self.writes.append(list(frames))
        return True

    async def send(self, message: dict[str, Any]) -> None:
        while not self.writable:
            await self.resumed.wait()
        self.writes.append(list(message[FRAMES_EXTENSION]))

    def resume(self) -> None:
        self.writable = True
        self.resumed.set()

    async def close(self, code: int, reason: str) -> None:
        pass


def outbox(ws: Socket) -> Outbox:
    return Outbox(ws, Settings(send_queue=8), FakeClock(), lambda: None)  # type: ignore[arg-type]


async def test_an_idle_outbox_writes_a_batch_before_the_producer_goes_on() -> None:
    ws = Socket()
    out = outbox(ws)
    writer = out.start("writer")
    await out.put_many([b"a", b"b", b"c"])
    assert ws.writes == [[b"a", b"b", b"c"]]  # written by put_many itself: no loop iteration has run
    await out.put(b"d")
    assert ws.writes[-1] == [b"d"] and out.peak == 0  # nothing was ever queued
    await out.finish(None, 1.0)
    assert writer.done()


async def test_while_the_transport_waits_frames_queue_and_leave_in_order_in_one_write() -> None:
    ws = Socket()
    out = outbox(ws)
    out.start("writer")
    ws.writable = False
    await out.put_many([b"1", b"2"])
    await asyncio.sleep(0)  # the writer takes them and waits in send()
    await out.put_many([b"3"])  # queued: a write is under way
    ws.writable = True  # the transport drains, but the writer has not run yet: nothing may overtake it
    await out.put_many([b"4"])
    assert ws.writes == []
    ws.resume()
    await out.finish(None, 1.0)
    assert [frame for write in ws.writes for frame in write] == [b"1", b"2", b"3", b"4"]
    assert ws.writes[0] == [b"1", b"2"] and ws.writes[1] == [b"3", b"4"]  # one write per writer wake-up


async def test_once_the_queue_is_drained_batches_are_written_at_once_again() -> None:
    ws = Socket()
    out = outbox(ws)
    out.start("writer")
    ws.writable = False
    await out.put(b"x")
    await asyncio.sleep(0)
    ws.resume()
    for _ in range(5):
        await asyncio.sleep(0)
    assert ws.writes == [[b"x"]]
    await out.put_many([b"y"])
    assert ws.writes == [[b"x"], [b"y"]]
    await out.finish(None, 1.0)


async def test_without_the_extension_the_writer_does_every_write() -> None:
    ws = Socket()
    ws.scope = {"extensions": {}}
    out = outbox(ws)
    sent: list[str] = []

    async def send_text(text: str) -> None:
        sent.append(text)

    ws.send_text = send_text  # type: ignore[attr-defined]
    out.start("writer")
    await out.put_many([b"a", b"b"])
    assert sent == []
    await out.finish(None, 1.0)
    assert sent == ["a", "b"]
