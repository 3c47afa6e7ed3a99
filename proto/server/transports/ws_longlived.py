"""The long-lived protocol over a starlette WebSocket: a thin adapter around ``LongLivedCore``.

A ladder, as uvicorn's protocols are: read a frame → ``core.receive`` → carry out its actions. ``Reply``
goes to the outbox; ``Start`` spawns the response's task (its only owner is this session, which cancels and
awaits it on cancel or disconnect) running the pre-inference pipeline and then the ``ResponseDriver``;
``Resume`` hands the appended items to the driver; ``Cancel`` cancels the task (the driver frames the
terminal event the core asked for); ``Close`` ends the connection. Every event of the response leaves
through ``core.frame`` into the outbox. The session decides nothing about the response itself: the core
does (cancel while opening, queued messages and their cap, the pending-call limit, the age policy).

One tool round-trip: frame in → core (``Resume``) → driver → sampler → driver → core (``frame``) → outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import structlog
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from proto.core.actions import Reply, Start
from proto.core.create import check_outputs
from proto.core.errors import ClientError
from proto.core.events import ServerEvent
from proto.core.items import Item
from proto.core.longlived import Action, Cancel, Close, EventLimits, LongLivedCore, OpenNext, Resume
from proto.server.designs import DESIGNS
from proto.server.driver import ResponseDriver
from proto.server.pipeline import Context, Pipeline, Prepared, Source, typed_faults
from proto.server.stages.chain import resolve_references
from proto.server.stages.conversation import load_context
from proto.server.transports.timers import CLOSE_IDLE, IDLE_REASON, ConnectionTimers, deadline
from proto.server.transports.websocket import Stopped, WebSocketConnection

log = structlog.get_logger("proto.server.longlived")


class LongLivedConnection(WebSocketConnection):
    """One connection; the ``EventSink`` of its open response."""

    def __init__(self, ws: WebSocket, pipeline: Pipeline, api_key_id: str) -> None:
        super().__init__(ws, pipeline, api_key_id)
        settings = pipeline.settings
        self.core = LongLivedCore(
            pipeline.engines.names(),
            EventLimits(
                settings.max_input_items,
                settings.max_tools,
                settings.max_pending_calls,
                settings.max_queued_items,
            ),
        )
        self.driver: ResponseDriver | None = None
        self.timers = ConnectionTimers(
            self.clock.now(), settings.connection_max_age_s, settings.idle_timeout_s
        )

    # --------------------------------------------------------------------------------- connection
    async def serve(self) -> None:
        writer = self.out.start("ws-writer")
        try:
            while not await self._next(writer):
                pass
        except (WebSocketDisconnect, Stopped):
            pass
        finally:
            await self._teardown(self.core.busy, self.core.close, self.stopping)

    async def _next(self, writer: asyncio.Task[None]) -> bool:
        """Read one frame (or see a limit come due) and carry out the core's actions; True when the
        connection is done. A method of its own so the frame is not held while the next one is awaited:
        a suspended response must not keep its create's text alive twice (the decoded items have it)."""
        message = await self._receive()
        if message is None:  # a limit came due
            return await self._act_all(self._limits_due(), writer)
        if message["type"] == "websocket.disconnect":
            return True
        text = message.get("text")
        if text is not None:
            actions = self.core.receive(text)
        else:
            actions = self.core.receive_binary(message.get("bytes") or b"")
        return await self._act_all(actions, writer)

    async def _receive(self) -> Message | None:
        """The next message, or ``None`` when the idle or age limit must be checked first."""
        now = self.clock.now()
        try:
            async with deadline(self.clock, now + self.timers.due_in(now, self._busy())):
                message = await self._parked(self.ws.receive())
        except TimeoutError:
            return None
        self.timers.touch(self.clock.now())
        return message

    def _busy(self) -> bool:
        return self.core.busy or (self.task is not None and not self.task.done())

    def _limits_due(self) -> list[Action]:
        now = self.clock.now()
        if self.timers.aged(now):
            return self.core.expire()
        if self.timers.idle(now, self._busy()):
            return [Close(CLOSE_IDLE, IDLE_REASON)]
        return []

    async def _act_all(self, actions: list[Action], writer: asyncio.Task[None]) -> bool:
        """Carry out the core's actions, in order; True when the connection was closed."""
        for action in actions:
            match action:
                case Reply(data):
                    await self.out.put(data)
                case Start():
                    self.task = asyncio.create_task(
                        self._respond(action), name=f"response-{action.response_id}"
                    )
                case Resume(items):
                    assert self.driver is not None
                    self.driver.resume(items)
                case Cancel():
                    await self._stop_task()
                case OpenNext():
                    if await self._act_all(self.core.open_next(), writer):
                        return True
                case Close(code, reason):
                    await self._close(writer, code, reason)
                    return True
        return False

    async def _close(self, writer: asyncio.Task[None], code: int, reason: str) -> None:
        await self.out.put(None)  # the writer sends what is queued, then stops
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(writer, 5.0)  # a client that reads nothing does not hold the close
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.ws.close(code, reason)

    # --------------------------------------------------------------------------------- the response
    async def _respond(self, start: Start) -> None:
        try:
            try:
                with typed_faults():
                    prepared = await self._prepare(start)
            except ClientError as exc:
                await self.out.put(self.core.abort(exc))
                return
            # The create's raw items (msgspec.Raw views of its frame) are rendered and tokenized now: the
            # frame is not kept for the response's whole life (100 k tokens of text: ~0.5 MB).
            del start
            self.driver = ResponseDriver(self.pipeline, prepared, self, self.api_key_id)
            await self.driver.run()
        finally:
            self.driver = None
            self.timers.touch(self.clock.now())

    async def _prepare(self, start: Start) -> Prepared:
        request = start.request
        items = await resolve_references(
            self.pipeline.store, start.items, self.api_key_id, start.work, root="$."
        )
        # A stored chain or a conversation's items are context, loaded and rendered once (docs/protocol.md,
        # "Conversations"), the conversation's scanned with the input.
        history = await load_context(
            self.pipeline.conversations, request, items, self.api_key_id, start.work, root="$."
        )
        check_outputs(history, items, root="$.")
        source: Source = "none"
        if request.previous_response_id is not None:
            source = "chain"
        elif request.conversation is not None:
            source = "conversation"
        return await self.pipeline.prepare(
            Context(
                start.response_id,
                request,
                DESIGNS["longlived"],
                items,
                start.work,
                {},
                history=history,
                source=source,
                api_key_id=self.api_key_id,
                connection=self.connection,
            )
        )

    # --------------------------------------------------------------------------------- EventSink
    def opened(self) -> bool:
        return self.core.opened()

    async def send(self, events: Sequence[ServerEvent]) -> None:
        frame = self.core.frame
        await self.out.put_many([frame(event) for event in events])

    def offer(self, events: Sequence[ServerEvent]) -> bool:
        frame = self.core.frame
        return self.out.offer([frame(event) for event in events])

    suspends = True  # see EventSink
    error_replaces_failure = False

    def queued(self) -> list[Item]:
        return self.core.take_queued()

    def cut(self) -> Cancel | None:
        return self.core.cancelling

    def end_at_boundary(self) -> str | None:
        return None  # appended user messages join at the boundary instead (queued)
