"""GA WebSocket mode over a starlette WebSocket: a thin adapter around ``GaCore``, plus the connection-local
cache of the most recent response.

The cache is what makes this mode cheap: a continuation of the cached response (``previous_response_id``
equal to its id, same model and instructions) tokenizes only its new items onto the cached rendering and
reuses the resolved engine. Anything else falls back to the store (``store: true`` responses; counted in
``store_reads``; the chain is re-rendered) or fails with ``previous_response_not_found``. The entry is
taken out of the cache when a continuation starts (the conversation it holds is handed to that response
and mutated), so a failed continuation leaves that id evicted; a completed response becomes the entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import structlog
from starlette.websockets import WebSocket, WebSocketDisconnect

from proto import codec
from proto.actions import Reply, Start
from proto.create import CreateLimits, check_outputs
from proto.errors import ClientError
from proto.events import ResponseCompleted, ServerEvent
from proto.ga import Close, GaCore
from proto.items import Tool
from proto.server.pipeline import Pipeline, Prepared, timed
from proto.server.respond import EndAtCalls, load_history, respond
from proto.server.session import SLOW_READER, Outbox, Stop, StoppableReader, Stopped
from proto.server.timers import CLOSE_IDLE, IDLE_REASON, ConnectionTimers
from sampler.gpu import MockGPU
from sampler.tokens import Conversation

log = structlog.get_logger("proto.server.ga")


@dataclass
class Cached:
    """The connection's most recent completed response, as the next turn needs it."""

    response_id: str
    conversation: Conversation  # every item so far, rendered and tokenized
    gpu: MockGPU  # the resolved engine
    model: str
    instructions: str | None
    tools: list[Tool]


class GaSession(StoppableReader):
    def __init__(self, ws: WebSocket, pipeline: Pipeline, api_key_id: str) -> None:
        settings = pipeline.settings
        self.ws = ws
        self.pipeline = pipeline
        self.api_key_id = api_key_id
        self.core = GaCore(
            pipeline.engines.names(),
            CreateLimits(settings.max_input_items, settings.max_tools),
            time.monotonic(),
            settings.connection_max_age_s,
        )
        self.out = Outbox(ws, settings, lambda: self.stop(SLOW_READER))
        self.task: asyncio.Task[None] | None = None
        self.cached: Cached | None = None
        self._close: tuple[int, str] | None = None
        opened = self.core.deadline - settings.connection_max_age_s
        self.timers = ConnectionTimers(opened, settings.connection_max_age_s, settings.idle_timeout_s)

    # --------------------------------------------------------------------------------- connection
    async def serve(self) -> None:
        self.out.start("ws-ga-writer")
        try:
            while True:
                try:
                    message = await self._parked(asyncio.wait_for(self.ws.receive(), self.timers.due_in(time.monotonic(), self.task is not None)))
                except TimeoutError:
                    if self.timers.idle(time.monotonic(), self.task is not None):
                        self._close = (CLOSE_IDLE, IDLE_REASON)
                        await self.out.put(None)  # the writer sends what is queued, then closes
                        break
                    if not self.timers.aged(time.monotonic()):
                        continue  # a response in flight: the idle clock starts when it ends
                    if self.task is not None:  # a response in flight ends before the connection does
                        await asyncio.shield(self.task)
                    if await self._act_all(self.core.expire()):
                        break
                    continue
                self.timers.touch(time.monotonic())
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is not None:
                    actions = self.core.receive(text, time.monotonic())
                else:
                    actions = self.core.receive_binary(message.get("bytes") or b"")
                if await self._act_all(actions):
                    break
        except (WebSocketDisconnect, Stopped):
            pass
        finally:
            task, self.task = self.task, None
            if task is not None and not task.done():
                task.cancel()  # respond() bills what was done
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            stop = self.stopping  # shutdown: a response in flight hears why before the close
            if stop is not None and stop.error is not None and task is not None:
                await self.out.put(self.core.error(ClientError(stop.error, stop.reason)).data.decode())
            self.core.close()
            close = stop or (Stop(*self._close) if self._close else None)
            await self.out.finish(close, self.pipeline.settings.shutdown_grace_s)

    async def _act_all(self, actions: list[Reply | Start | Close]) -> bool:
        """Carry out the core's actions; True when the connection must close."""
        for action in actions:
            match action:
                case Reply(data):
                    await self.out.put(data.decode())
                case Start():
                    self.task = asyncio.create_task(self._respond(action), name=f"response-{action.response_id}")
                case Close(code, reason):
                    if self.task is not None:  # a response in flight ends before the connection does
                        await asyncio.shield(self.task)
                    await self.out.put(None)  # the writer sends what is queued, then closes
                    self._close = (code, reason)
                    return True
        return False

    # --------------------------------------------------------------------------------- one response
    async def _respond(self, start: Start) -> None:
        created = time.time()
        try:
            try:
                prepared = await self._prepare(start)
            except ClientError as exc:
                await self.out.put(self.core.error(exc).data.decode())
                return
            terminal = await respond(
                self.pipeline, prepared, EndAtCalls(self._send), self.api_key_id, start.items, created, start.request.generate
            )
            if isinstance(terminal, ResponseCompleted):
                rollout = prepared.rollout
                self.cached = Cached(
                    terminal.response.id,
                    rollout.conversation,
                    prepared.gpu,
                    start.request.model,
                    start.request.instructions,
                    list(start.request.tools),
                )
        finally:
            self.task = None
            self.timers.touch(time.monotonic())
            self.core.finished()

    async def _prepare(self, start: Start) -> Prepared:
        """The pre-inference pipeline for this connection's state: a cache hit reuses the rendering and
        the engine; a miss loads the chain from the store and redoes it."""
        request, work = start.request, start.work
        previous = request.previous_response_id
        cached, self.cached = self.cached, None  # taken for this response: a failure leaves it evicted
        if previous is None:
            return await self.pipeline.prepare(start.response_id, request, [], start.items, work, "ws", scan_history=True)
        if cached is not None and cached.response_id == previous:
            check_outputs(cached.conversation.items, start.items)
            if cached.instructions == request.instructions:
                gpu = cached.gpu if cached.model == request.model else None
                return await self.pipeline.prepare(
                    start.response_id, request, [], start.items, work, "ws", scan_history=False, conversation=cached.conversation, gpu=gpu
                )
            # New instructions head the prompt: the items are in memory, their rendering is not reusable.
            history = list(cached.conversation.items)
            return await self.pipeline.prepare(start.response_id, request, history, start.items, work, "ws", scan_history=False)
        phases: dict[str, float] = {}
        with timed(phases, "store_load"):
            history = await load_history(self.pipeline, previous, self.api_key_id, work)
        check_outputs(history, start.items)
        return await self.pipeline.prepare(start.response_id, request, history, start.items, work, "ws", scan_history=False, phases=phases)

    async def _send(self, event: ServerEvent) -> None:
        await self.out.put(codec.encode(event).decode())
