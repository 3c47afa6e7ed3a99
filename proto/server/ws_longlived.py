"""The long-lived protocol over a starlette WebSocket: a thin adapter around ``LongLivedCore``.

Frame in → ``core.receive`` → actions: replies go to the send queue, ``Start`` spawns the response's
sampling task (its only owner is this session, which cancels and awaits it on cancel or disconnect),
``Resume`` resolves the future the suspended loop awaits. One writer task drains a bounded queue, so
replies and response events leave in the order they were framed, and a client that stops reading makes
the sampler wait instead of growing memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import structlog
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from proto.actions import Reply, Start
from proto.builder import ResponseBuilder
from proto.errors import ClientError
from proto.events import ResponseDone, ServerEvent
from proto.items import Item
from proto.longlived import Cancel, Enqueue, Limits, LongLivedCore, Resume
from proto.server.pipeline import Pipeline
from proto.server.respond import load_history, persist
from proto.server.session import SLOW_READER, Outbox, StoppableReader, Stopped
from proto.server.timers import CLOSE_IDLE, IDLE_REASON, ConnectionTimers
from proto.state import State
from sampler.gpu import EngineFailure, EngineOverloaded
from sampler.loop import MaxOutputTokens, Rollout, run

log = structlog.get_logger("proto.server.longlived")


class ToolTimeout(Exception):
    """The client did not send every pending output within ``--tool-timeout-s``."""


class LongLivedSession(StoppableReader):
    """One connection. Implements the sampling loop's ``Host``."""

    def __init__(self, ws: WebSocket, pipeline: Pipeline, api_key_id: str) -> None:
        settings = pipeline.settings
        self.ws = ws
        self.pipeline = pipeline
        self.api_key_id = api_key_id
        self.core = LongLivedCore(
            pipeline.engines.names(),
            Limits(settings.max_input_items, settings.max_tools, settings.max_pending_calls),
        )
        self.out = Outbox(ws, settings, lambda: self.stop(SLOW_READER))
        self.task: asyncio.Task[None] | None = None
        self.builder: ResponseBuilder | None = None
        self.resume: asyncio.Future[list[Item]] | None = None
        self.injected: list[Item] = []
        self.cancel_requested = False
        self.billed = True
        self._created = time.time()
        self.timers = ConnectionTimers(time.monotonic(), settings.connection_max_age_s, settings.idle_timeout_s)

    # --------------------------------------------------------------------------------- connection
    async def serve(self) -> None:
        writer = self.out.start("ws-writer")
        try:
            while True:
                message = await self._receive()
                if await self._limits_due(writer):
                    break
                if message is None:
                    continue
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is not None:
                    actions = self.core.receive(text)
                else:
                    actions = self.core.receive_binary(message.get("bytes") or b"")
                for action in actions:
                    await self._act(action)
        except (WebSocketDisconnect, Stopped):
            pass
        finally:
            was_open = self.core.response_id is not None
            await self._drop_response("cancelled")
            stop = self.stopping  # shutdown: the open response hears why before the close
            if stop is not None and stop.error is not None and was_open:
                await self.out.put(self.core.error(ClientError(stop.error, stop.reason)).data.decode())
            self.core.close()
            await self.out.finish(stop, self.pipeline.settings.shutdown_grace_s)

    async def _receive(self) -> Message | None:
        """The next message, or ``None`` when the idle or age limit must be checked first."""
        try:
            message = await self._parked(asyncio.wait_for(self.ws.receive(), self.timers.due_in(time.monotonic(), self._busy())))
        except TimeoutError:
            return None
        self.timers.touch(time.monotonic())
        return message

    def _busy(self) -> bool:
        return self.core.state in (State.OPENING, State.STREAMING, State.SUSPENDED) or (self.task is not None and not self.task.done())

    async def _limits_due(self, writer: asyncio.Task[None]) -> bool:
        """Idle and age limits; True when the connection was closed.

        Past ``--connection-max-age-s`` a response is never cut without its terminal event: one that
        waits on the client ends ``incomplete`` (reason ``websocket_connection_limit_reached``), one that
        streams is let reach its next suspension or its end; then one ``error`` event, close 1000."""
        now = time.monotonic()
        if self.timers.aged(now):
            if self.core.state is State.SUSPENDED:
                await self._drop_response("websocket_connection_limit_reached", send=True)
            if self._busy():
                return False
            limit = ClientError("websocket_connection_limit_reached", "the connection reached its maximum age; open a new one")
            await self.out.put(self.core.error(limit).data.decode())
            await self._close(writer, 1000, "websocket_connection_limit_reached")
            return True
        if self.timers.idle(now, self._busy()):
            await self._close(writer, CLOSE_IDLE, IDLE_REASON)
            return True
        return False

    async def _close(self, writer: asyncio.Task[None], code: int, reason: str) -> None:
        await self.out.put(None)  # the writer sends what is queued, then stops
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(writer, 5.0)  # a client that reads nothing does not hold the close
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.ws.close(code, reason)

    async def _act(self, action: Reply | Start | Resume | Enqueue | Cancel) -> None:
        match action:
            case Reply(data):
                await self.out.put(data.decode())
            case Start():
                self.cancel_requested = False
                self.builder = None  # the last response's builder must not take this one's cancel
                self.task = asyncio.create_task(self._respond(action), name=f"response-{action.response_id}")
                self.task.add_done_callback(lambda _: self.timers.touch(time.monotonic()))
            case Resume(items):
                if self.resume is not None and not self.resume.done():
                    self.resume.set_result(items)
            case Enqueue(items):
                self.injected.extend(items)
            case Cancel():
                await self._cancel()

    # --------------------------------------------------------------------------------- the response
    async def _respond(self, start: Start) -> None:
        created = self._created = time.time()
        try:
            history: list[Item] = []
            if start.request.previous_response_id is not None:
                # Continuing a stored response: its chain is context, loaded and rendered once.
                history = await load_history(self.pipeline, start.request.previous_response_id, self.api_key_id, start.work)
            prepared = await self.pipeline.prepare(
                start.response_id, start.request, history, start.items, start.work, "longlived", scan_history=False
            )
        except ClientError as exc:
            await self.out.put(self.core.abort(exc).decode())
            return
        rollout = prepared.rollout
        self.builder = rollout.builder
        self.billed = False
        self.core.opened()
        try:
            await self.emit(rollout.builder.start())
            if self.cancel_requested:  # cancelled while the pre-inference pipeline ran
                terminal: ServerEvent = rollout.builder.incomplete("cancelled")
            else:
                terminal = await self._sample(rollout)
            self._bill(created)
            if rollout.builder.response.store:
                # Before the terminal event leaves, so a client that chains on it at once finds it.
                await persist(self.pipeline, rollout.builder.response, self.api_key_id, rollout.input_items)
            await self.emit([terminal])
        finally:
            rollout.sequence.close()  # GPU slot and KV pins: released on every path

    async def _sample(self, rollout: Rollout) -> ServerEvent:
        builder = rollout.builder
        try:
            await run(rollout, self)
        except MaxOutputTokens:
            return builder.incomplete("max_output_tokens")
        except ToolTimeout:
            return builder.incomplete("tool_timeout")
        except ClientError as exc:  # e.g. content_policy on an appended item
            return builder.failed(exc.code, exc.message)
        except EngineOverloaded as exc:
            return builder.failed("server_overloaded", str(exc))
        except EngineFailure as exc:
            return builder.failed("engine_failure", str(exc))
        except Exception as exc:  # a bug must still end the response, and the server keeps serving
            log.exception("sampling_failed", response_id=builder.response.id)
            return builder.failed("server_error", f"internal error: {type(exc).__name__}")
        return builder.completed()

    async def _cancel(self) -> None:
        if self.builder is None or self.task is None:
            self.cancel_requested = True  # still in the pre-inference pipeline: it stops after it
            return
        await self._drop_response("cancelled", send=True)

    async def _drop_response(self, reason: str, send: bool = False) -> None:
        """Stop the sampling task (if any), frame its terminal event, bill it: once."""
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        builder = self.builder
        if builder is not None and not self.billed:
            event = builder.incomplete(reason)
            if send:
                await self.out.put(self.core.frame(event).decode())
            self._bill(self._created)
        self.builder = None

    def _bill(self, created: float) -> None:
        if self.billed or self.builder is None:
            return
        self.billed = True
        self.pipeline.bill(self.builder, self.api_key_id, created)

    # --------------------------------------------------------------------------------- Host
    async def emit(self, events: Sequence[ServerEvent]) -> None:
        for event in events:
            await self.out.put(self.core.frame(event).decode())

    async def suspend(self, done: ResponseDone) -> list[Item] | None:
        limit = self.pipeline.settings.max_pending_calls
        if len(done.pending_calls) > limit:
            # More parallel calls than one response may hold open: the response fails with a typed
            # error (before response.done, so the core never sees the excess) and the connection serves on.
            count = len(done.pending_calls)
            raise ClientError("too_many_pending_calls", f"the model made {count} parallel calls; at most {limit} may be pending (--max-pending-calls)")
        self.resume = asyncio.get_running_loop().create_future()
        await self.emit([done])
        try:
            return await asyncio.wait_for(self.resume, self.pipeline.settings.tool_timeout_s)
        except TimeoutError:
            raise ToolTimeout from None
        finally:
            self.resume = None

    def take_injected(self) -> list[Item]:
        items, self.injected = self.injected, []
        return items
