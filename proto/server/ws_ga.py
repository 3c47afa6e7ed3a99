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
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from starlette.websockets import WebSocket, WebSocketDisconnect

from proto import codec
from proto.actions import Reply, Start
from proto.create import CreateLimits, check_outputs
from proto.errors import ClientError
from proto.events import ResponseCompleted, ServerEvent
from proto.ga import Close, GaCore
from proto.items import Item, Tool
from proto.longlived import Cancel
from proto.server.chain import load_history
from proto.server.driver import ResponseDriver
from proto.server.pipeline import Pipeline, Prepared, timed, typed_faults
from proto.server.session import Stop, Stopped, WebSocketSession
from proto.server.timers import CLOSE_IDLE, IDLE_REASON, ConnectionTimers, deadline
from sampler.engine import Engine
from sampler.tokens import Conversation

log = structlog.get_logger("proto.server.ga")


@dataclass
class Cached:
    """The connection's most recent completed response, as the next turn needs it."""

    response_id: str
    conversation: Conversation  # every item so far, rendered and tokenized
    gpu: Engine  # the resolved engine
    model: str
    instructions: str | None
    tools: list[Tool]


class GaSession(WebSocketSession):
    """One connection; the ``Transport`` of its response in flight (which ends at its first local call)."""

    def __init__(self, ws: WebSocket, pipeline: Pipeline, api_key_id: str) -> None:
        super().__init__(ws, pipeline, api_key_id)
        settings = pipeline.settings
        self.core = GaCore(
            pipeline.engines.names(),
            CreateLimits(settings.max_input_items, settings.max_tools),
            self.clock.now(),
            settings.connection_max_age_s,
        )
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
                    now = self.clock.now()
                    async with deadline(self.clock, now + self.timers.due_in(now, self.task is not None)):
                        message = await self._parked(self.ws.receive())
                except TimeoutError:
                    if self.timers.idle(self.clock.now(), self.task is not None):
                        self._close = (CLOSE_IDLE, IDLE_REASON)
                        await self.out.put(None)  # the writer sends what is queued, then closes
                        break
                    if not self.timers.aged(self.clock.now()):
                        continue  # a response in flight: the idle clock starts when it ends
                    if self.task is not None:  # a response in flight ends before the connection does
                        await asyncio.shield(self.task)
                    if await self._act_all(self.core.expire()):
                        break
                    continue
                self.timers.touch(self.clock.now())
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is not None:
                    actions = self.core.receive(text, self.clock.now())
                else:
                    actions = self.core.receive_binary(message.get("bytes") or b"")
                if await self._act_all(actions):
                    break
        except (WebSocketDisconnect, Stopped):
            pass
        finally:
            close = self.stopping or (Stop(*self._close) if self._close else None)
            await self._teardown(self.task is not None, self.core.close, close)

    async def _act_all(self, actions: list[Reply | Start | Close]) -> bool:
        """Carry out the core's actions; True when the connection must close."""
        for action in actions:
            match action:
                case Reply(data):
                    await self.out.put(data)
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
        try:
            try:
                with typed_faults():
                    prepared = await self._prepare(start)
            except ClientError as exc:
                await self.out.put(self.core.error(exc).data)
                return
            terminal = await ResponseDriver(self.pipeline, prepared, self, self.api_key_id).run(start.request.generate)
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
            self.timers.touch(self.clock.now())
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

    # --------------------------------------------------------------------------------- Transport
    def opened(self) -> bool:
        return True

    async def send(self, events: Sequence[ServerEvent]) -> None:
        encode = codec.encode
        await self.out.put_many([encode(event) for event in events])

    suspends = False  # a response ends at its first local call: the calls are in its output

    def queued(self) -> list[Item]:
        return []  # nothing is appended to a GA response: the next turn is a new response.create

    def cut(self) -> Cancel | None:
        return None  # cut only when the client went away or the server shuts down
