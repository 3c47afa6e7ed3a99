"""What both WebSocket sessions share: the outbound queue and its writer, and being told to stop.

**The outbox.** Text frames (each encoded to bytes once, where it was framed) leave in the order they were
framed, a batch at a time: one ``transport.write``. When nothing is queued or being written and the
transport takes data now, the frames are written at once by whoever framed them (the protocol's
``write_now``, see ``serve.LabWSProtocol``): a GPU wake-up's tokens go out before its task does anything
else — before the driver stores, bills and encodes the terminal event after the final answer's last tokens
— with no hop to another task and no deadline (a write that cannot wait cannot time out). Otherwise they
are queued, and one writer task drains the queue: each of its wake-ups takes *every* frame queued so far
and writes them in one go (one ASGI message), under one deadline. ``offer`` is ``put_many`` when that
needs no wait, for frames made on the engine's timer (docs/architecture.md, "The fast path"): all of them
or none, so it never waits for the writer. Policy for a *slow reader* (a client that stops reading while
the model streams):

* back-pressure first: the writer awaits the transport (uvicorn pauses writing past asyncio's high-water
  mark), the queue fills up to ``--send-queue`` frames, then whoever frames an event — the sampler — waits.
  A connection's memory is bounded by the queue plus the transport's buffer, never by the output's length;
* a deadline second: when one frame cannot be handed to the transport within ``--send-timeout-s``, the
  client is declared too slow. The session is told to stop (its response is cancelled and billed for the
  work done), the writer discards whatever is still queued so no producer stays blocked on a dead client,
  and the connection is closed with 1008 — best effort, as a close frame cannot pass a full buffer either:
  after a short wait the session returns and uvicorn closes the transport.

**Stopping from outside.** ``stop()`` (server shutdown, the slow-reader deadline) wakes a reader parked in
``ws.receive()``: the reader is cancelled only while it waits there (``_parked``), so no half-done action
is interrupted; anywhere else it sees the request when it next parks. Either way it gets ``Stopped``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TypeVar

from starlette.websockets import WebSocket, WebSocketDisconnect

from proto.core.actions import error_reply
from proto.core.errors import ClientError
from proto.server.config import Settings
from proto.server.pipeline import Pipeline
from proto.server.transports.timers import deadline
from sampler.clock import Clock

# The ASGI extension our uvicorn protocol (``run.LabWSProtocol``) offers: a ``websocket.send`` message
# carrying already-encoded UTF-8 text frames, written in one go. Any other server gets ``send_text``.
FRAMES_EXTENSION = "responses_lab.text_frames"

CLOSE_GOING_AWAY = 1001  # RFC 6455: the server is going down
CLOSE_POLICY_VIOLATION = 1008  # RFC 6455: the generic code when no other fits (here: a reader too slow)
T = TypeVar("T")
_CLOSE_WAIT_S = 1.0  # how long the close frame may wait for a transport that does not drain


@dataclass(frozen=True)
class Stop:
    """Why a session is told to end: the close it sends, and the error its open response receives."""

    code: int
    reason: str
    error: str | None = None  # an ERROR_CODES code, sent to an open response before the close


SHUTDOWN = Stop(CLOSE_GOING_AWAY, "server shutting down", "server_shutting_down")
SLOW_READER = Stop(CLOSE_POLICY_VIOLATION, "slow reader: the send queue stayed full past --send-timeout-s")


class Outbox:
    """A bounded frame queue and the task that writes it (see the module's policy)."""

    def __init__(self, ws: WebSocket, settings: Settings, clock: Clock, on_slow: Callable[[], None]) -> None:
        self.ws = ws
        self._on_slow = on_slow
        self._clock = clock
        self.bound = settings.send_queue
        self.send_timeout_s = settings.send_timeout_s
        extension = ws.scope.get("extensions", {}).get(FRAMES_EXTENSION)
        self._batched = extension is not None
        # Writes frames at once when a send would not wait; without the extension the writer does every write.
        self._write_ext: Callable[[Sequence[bytes]], bool] = (
            extension.get("write_now", _never) if extension is not None else _never
        )
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=self.bound)
        # held by whoever writes: the writer task, or a producer writing at once
        self._writing = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.peak = 0  # the most frames ever queued at once (≤ bound): what the slow-reader test asserts
        self.gone = False  # the client cannot be written to any more: frames are discarded
        self.slow = False  # the deadline passed (``gone`` too)

    def start(self, name: str) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self._run(), name=name)
        return self._task

    async def put(self, data: bytes | None) -> None:
        """One frame, written at once or queued (waits while the queue is full); ``None`` ends the writer
        after what is queued."""
        if data is not None and self._write_now((data,)):
            return
        await self._queue.put(data)
        size = self._queue.qsize()
        if size > self.peak:
            self.peak = size

    async def put_many(self, frames: Sequence[bytes]) -> None:
        """Frames in order: written at once (one write) when nothing is ahead of them, else queued."""
        if self._write_now(frames):
            return
        for data in frames:
            await self.put(data)

    def offer(self, frames: Sequence[bytes]) -> bool:
        """``put_many`` if it needs no wait: written at once when nothing is ahead of them, else queued behind
        what is (the writer takes them, under its deadline) when the queue has room for all of them. False:
        nothing was taken (the queue is full, or the client is gone); ``put_many`` them."""
        queue = self._queue
        if self.gone or queue.qsize() + len(frames) > self.bound:
            return False
        if self._write_now(frames):
            return True
        for data in frames:
            queue.put_nowait(data)
        size = queue.qsize()
        if size > self.peak:
            self.peak = size
        return True

    def _write_now(self, frames: Sequence[bytes]) -> bool:
        """Write ``frames`` now, if nothing is queued or being written (every frame framed before them has
        been handed to the transport, so the order holds) and the transport takes them without waiting."""
        if self._writing.locked() or not self._queue.empty() or self.gone:
            return False
        return self._write_ext(frames)

    def qsize(self) -> int:
        return self._queue.qsize()

    async def finish(self, close: Stop | None, grace_s: float) -> None:
        """Write what is queued (within ``grace_s``), then close with ``close``'s code (if any, and if the
        client is still there to hear it); the writer is gone when this returns."""
        task = self._task
        if task is not None and not task.done():
            try:
                async with asyncio.timeout(grace_s):  # real time: shutdown's grace, not a protocol limit
                    await self._queue.put(None)
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if close is not None and (self.slow or not self.gone):
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
                async with asyncio.timeout(_CLOSE_WAIT_S):
                    await self.ws.close(close.code, close.reason)

    async def _run(self) -> None:
        queue = self._queue
        while True:
            batch: list[bytes] = []
            data = await queue.get()
            while data is not None:
                batch.append(data)
                if queue.empty():
                    break
                data = queue.get_nowait()
            if batch and not self.gone:  # once gone nobody reads: a producer must not stay blocked on it
                async with self._writing:
                    await self._write(batch)
            if data is None:
                return

    async def _write(self, batch: list[bytes]) -> None:
        clock = self._clock
        try:
            async with deadline(clock, clock.now() + self.send_timeout_s):
                if self._batched:
                    await self.ws.send({"type": "websocket.send", FRAMES_EXTENSION: batch})
                else:
                    for data in batch:
                        await self.ws.send_text(data.decode())
        except TimeoutError:
            self.gone = self.slow = True
            self._on_slow()
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.gone = True  # the reader sees the disconnect and cleans up


def _never(frames: Sequence[bytes]) -> bool:
    return False


class Stopped(Exception):
    """Raised in the reader loop of a session told to ``stop()``."""


class StoppableReader:
    """Mixin for a session whose reader loop may be told to stop from another task."""

    stopping: Stop | None = None
    _reader: asyncio.Task[None] | None = None
    _receiving = False

    def stop(self, why: Stop) -> None:
        """End this session soon (from any task on the server loop): its open response gets ``why.error``,
        the connection ``why.code``. The first reason wins."""
        if self.stopping is not None:
            return
        self.stopping = why
        if self._receiving and self._reader is not None:
            self._reader.cancel()

    async def _parked(self, receive: Awaitable[T]) -> T:
        """Await ``receive`` (the reader's wait for the next message); raises ``Stopped`` once told to
        stop."""
        if self.stopping is not None:
            if isinstance(receive, Coroutine):
                receive.close()
            raise Stopped
        self._reader = asyncio.current_task()
        self._receiving = True
        try:
            result = await receive
        except asyncio.CancelledError:
            if self.stopping is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the cancel was ours, to wake the reader: it is consumed here
            raise Stopped from None
        finally:
            self._receiving = False
        task = asyncio.current_task()
        if self.stopping is not None and task is not None and task.cancelling():
            task.uncancel()  # our cancel lost the race with the message (wait_for swallowed it)
        return result


class WebSocketConnection(StoppableReader):
    """What every WebSocket session holds: its socket, the pipeline, the caller's key, the limit clock,
    its outbox (whose slow-reader deadline stops this session)."""

    def __init__(self, ws: WebSocket, pipeline: Pipeline, api_key_id: str) -> None:
        self.ws = ws
        self.pipeline = pipeline
        self.api_key_id = api_key_id
        self.connection = "ws_" + secrets.token_hex(8)  # sticky routing's key (docs/engine.md)
        self.clock = pipeline.clock
        self.out = Outbox(ws, pipeline.settings, self.clock, lambda: self.stop(SLOW_READER))
        self.task: asyncio.Task[None] | None = None  # the response in flight, owned by this session

    async def _stop_task(self) -> None:
        """Cancel the response's task (if any) and wait for it: its driver bills it, and frames its
        terminal event only where the client asked for the end (``EventSink.cut``)."""
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _teardown(self, was_open: bool, close_core: Callable[[], None], close: Stop | None) -> None:
        """The end of every session: the response in flight is stopped (and billed); on shutdown it hears
        why before the close; the core closes; the outbox writes what is queued, then the close frame."""
        await self._stop_task()
        stop = self.stopping
        if stop is not None and stop.error is not None and was_open:
            await self.out.put(error_reply(ClientError(stop.error, stop.reason)).data)
        close_core()
        await self.out.finish(close, self.pipeline.settings.shutdown_grace_s)
