"""GA WebSocket mode over a starlette WebSocket: a thin adapter around ``GaCore``, plus the connection-local
cache of each lane's most recent response.

The cache is what makes this mode cheap: a continuation of a cached response (``previous_response_id``
equal to its id, same instructions and tools) tokenizes only its new items onto the cached rendering and
reuses the resolved engine. Anything else falls back to the store (``store: true`` responses; counted in
``store_reads``; the chain is re-rendered) or fails with ``previous_response_not_found``. Each lane
(``stream_id``) keeps its own entry; a create on a lane takes that lane's entry out (the conversation it
holds is handed to the response and mutated), so a failed continuation leaves that id evicted; a completed
response becomes the lane's entry. A continuation of a response another lane holds forks it (a copy of its
rendering), leaving that lane's entry in place.

Responses on different lanes run concurrently, each on its own task with its own ``_LaneResponse``
transport; their frames share the connection's outbox and carry their lane's ``stream_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import structlog
from starlette.websockets import WebSocket, WebSocketDisconnect

from proto.core import codec
from proto.core.actions import Reply, Start
from proto.core.builder import ResponseBuilder
from proto.core.create import CreateLimits, check_outputs
from proto.core.errors import ClientError
from proto.core.events import CreateBody, ResponseCompleted, ServerEvent, TerminalEvent
from proto.core.ga import Action, Close, GaCore, Outcome, SteerReply, lane_frame
from proto.core.items import CALL_ITEMS, Item, Tool, item_type
from proto.core.longlived import Cancel
from proto.core.work import WorkCounters
from proto.server.admission import Ticket
from proto.server.designs import DESIGNS
from proto.server.driver import ResponseDriver
from proto.server.pipeline import Context, Pipeline, Prepared, Source, timed, typed_faults
from proto.server.stages.chain import load_history, resolve_references
from proto.server.stages.conversation import load_conversation
from proto.server.tiers import serve
from proto.server.transports.timers import CLOSE_IDLE, IDLE_REASON, ConnectionTimers, deadline
from proto.server.transports.websocket import Stop, Stopped, WebSocketConnection
from sampler.engine import Engine
from sampler.tokens import Conversation

log = structlog.get_logger("proto.server.ga")


@dataclass
class Cached:
    """A lane's most recent completed response, as its next turn needs it."""

    response_id: str
    conversation: Conversation  # every item so far, rendered and tokenized
    gpu: Engine  # the resolved engine
    model: str  # the engine's name: the model at its service tier (``proto/server/tiers.py``)
    instructions: str | None
    tools: list[Tool]


class _LaneResponse:
    """The ``EventSink`` of one response on one lane: it ends at its first local call, nothing is appended
    to it, and at a turn boundary it ends ``steered`` when steering input waits on it."""

    def __init__(self, session: GaConnection, start: Start) -> None:
        self.session = session
        self.start = start

    def opened(self) -> bool:
        return True

    async def send(self, events: Sequence[ServerEvent]) -> None:
        lane = self.start.stream_id
        await self.session.out.put_many([lane_frame(codec.encode(event), lane) for event in events])

    def offer(self, events: Sequence[ServerEvent]) -> bool:
        lane = self.start.stream_id
        return self.session.out.offer([lane_frame(codec.encode(event), lane) for event in events])

    suspends = False  # a response ends at its first local call: the calls are in its output
    error_replaces_failure = False  # see EventSink: its events were delivered

    def queued(self) -> list[Item]:
        return []  # nothing is appended to a GA response: the next turn is a new response.create

    def cut(self) -> Cancel | None:
        return None  # cut only when the client went away or the server shuts down

    def end_at_boundary(self) -> str | None:
        return "steered" if self.session.core.steering_due(self.start.response_id) else None


class GaConnection(WebSocketConnection):
    """One connection: its lanes' responses in flight (``tasks``, not the base's single ``task``), and
    their cache."""

    def __init__(self, ws: WebSocket, pipeline: Pipeline, api_key_id: str) -> None:
        super().__init__(ws, pipeline, api_key_id)
        settings = pipeline.settings
        self.core = GaCore(
            pipeline.engines.names(),
            CreateLimits(settings.max_input_items, settings.max_tools),
            self.clock.now(),
            settings.connection_max_age_s,
        )
        self.tasks: dict[str, asyncio.Task[None]] = {}  # response id -> its task
        self.builders: dict[
            str, ResponseBuilder
        ] = {}  # responses streaming: steering events join their sequence
        self.cached: dict[str | None, Cached] = {}  # by lane
        self._close: tuple[int, str] | None = None
        opened = self.core.deadline - settings.connection_max_age_s
        self.timers = ConnectionTimers(opened, settings.connection_max_age_s, settings.idle_timeout_s)

    @property
    def busy(self) -> bool:
        return bool(self.tasks)

    # --------------------------------------------------------------------------------- connection
    async def serve(self) -> None:
        self.out.start("ws-ga-writer")
        try:
            while True:
                try:
                    now = self.clock.now()
                    async with deadline(self.clock, now + self.timers.due_in(now, self.busy)):
                        message = await self._parked(self.ws.receive())
                except TimeoutError:
                    if self.timers.idle(self.clock.now(), self.busy):
                        self._close = (CLOSE_IDLE, IDLE_REASON)
                        await self.out.put(None)  # the writer sends what is queued, then closes
                        break
                    if not self.timers.aged(self.clock.now()):
                        continue  # a response in flight: the idle clock starts when it ends
                    await self._drain()  # responses in flight end before the connection does
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
            had_tasks = bool(self.tasks)
            self.core.close()  # nothing more starts, not even a steered successor
            for task in list(self.tasks.values()):
                task.cancel()  # the driver bills what was done
            for task in list(self.tasks.values()):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            close = self.stopping or (Stop(*self._close) if self._close else None)
            await self._teardown(had_tasks, self.core.close, close)

    async def _drain(self) -> None:
        while self.tasks:
            await asyncio.shield(next(iter(self.tasks.values())))

    async def _act_all(self, actions: list[Action]) -> bool:
        """Carry out the core's actions; True when the connection must close."""
        for action in actions:
            match action:
                case Reply(data):
                    await self.out.put(data)
                case Start():
                    task = asyncio.create_task(self._respond(action), name=f"response-{action.response_id}")
                    self.tasks[action.response_id] = task
                case SteerReply(event, response_id, stream_id):
                    builder = self.builders.get(response_id) if response_id else None
                    number = builder.next_sequence() if builder is not None else 0
                    stamped = msgspec.structs.replace(event, sequence_number=number)
                    await self.out.put(lane_frame(codec.encode(stamped), stream_id))
                case Close(code, reason):
                    await self._drain()  # responses in flight end before the connection does
                    await self.out.put(None)  # the writer sends what is queued, then closes
                    self._close = (code, reason)
                    return True
        return False

    # --------------------------------------------------------------------------------- one response
    async def _respond(self, start: Start) -> None:
        outcome = Outcome("refused")
        try:
            try:
                with typed_faults():
                    prepared = await self._prepare(start)
            except ClientError as exc:
                await self.out.put(self.core.error(exc, start.stream_id).data)
                return
            builder = prepared.rollout.builder
            self.builders[start.response_id] = builder
            terminal = await ResponseDriver(
                self.pipeline, prepared, _LaneResponse(self, start), self.api_key_id
            ).run(start.request.generate)
            outcome = _outcome(terminal)
            # A steered response is continued by its successor: kept like a completed one.
            if isinstance(terminal, ResponseCompleted) or outcome.reason == "steered":
                request = start.request
                self.cached[start.stream_id] = Cached(
                    start.response_id,
                    prepared.rollout.conversation,
                    prepared.gpu,
                    self._engine(request),
                    request.instructions,
                    list(request.tools),
                )
        finally:
            self.tasks.pop(start.response_id, None)
            self.builders.pop(start.response_id, None)
            self.timers.touch(self.clock.now())
            follow = self.core.finished(start, outcome)
            if follow:
                await self._act_all(follow)

    async def _prepare(self, start: Start) -> Prepared:
        """Admitted first: a continuation refused at the door leaves its lane's cache entry in place, so
        that its retry finds it (docs/protocol.md, "Admission")."""
        self.pipeline.check_ledger()
        ticket = self.pipeline.admission.admit(self._engine(start.request))
        try:
            return await self._prepare_admitted(start, ticket)
        except BaseException:
            ticket.release()
            raise

    async def _prepare_admitted(self, start: Start, ticket: Ticket) -> Prepared:
        """The pre-inference pipeline for this lane's state: a cache hit reuses the rendering and the
        engine; a miss loads the chain from the store and redoes it."""
        request, work = start.request, start.work
        previous = request.previous_response_id
        cached = self._cached_for(start.stream_id, previous, work)
        phases: dict[str, float] = {}
        context = functools.partial(
            Context,
            start.response_id,
            request,
            DESIGNS["ws"],
            work=work,
            phases=phases,
            api_key_id=self.api_key_id,
            connection=self.connection,
            ticket=ticket,
        )
        with timed(phases, "store_load"):
            items = await resolve_references(self.pipeline.store, start.items, self.api_key_id, work)
        if previous is None:
            with timed(phases, "store_load"):  # a conversation is read from the store, never the cache
                history = await load_conversation(
                    self.pipeline.conversations, request, items, self.api_key_id, work
                )
            check_outputs(history, items)
            source: Source = "conversation" if request.conversation is not None else "none"
            return await self.pipeline.prepare(context(items, history=history, source=source))
        if cached is not None:
            check_outputs(cached.conversation.items, items)
            # Reasoning its rendering withheld (``reasoning.context: current_turn``) stays out only under
            # the same setting.
            current = request.reasoning is not None and request.reasoning.context == "current_turn"
            if (
                cached.instructions == request.instructions
                and cached.tools == request.tools
                and (current or not cached.conversation.withheld)
            ):
                gpu = cached.gpu if cached.model == self._engine(request) else None
                return await self.pipeline.prepare(
                    context(items, source="connection", conversation=cached.conversation, gpu=gpu)
                )
            # New instructions or tools head the prompt, or withheld reasoning is back: the items are in
            # memory, their rendering is not reusable.
            history = cached.conversation.history()
            return await self.pipeline.prepare(context(items, history=history, source="connection"))
        with timed(phases, "store_load"):
            history = await load_history(self.pipeline.store, previous, self.api_key_id, work)
        check_outputs(history, items)
        return await self.pipeline.prepare(context(items, history=history, source="chain"))

    def _engine(self, request: CreateBody) -> str:
        return serve(request.model, request.service_tier, self.pipeline.engines.names()).engine

    def _cached_for(self, lane: str | None, previous: str | None, work: WorkCounters) -> Cached | None:
        """This lane's entry is taken (a failure leaves it evicted); another lane's is forked."""
        own = self.cached.pop(lane, None)
        if own is not None and own.response_id == previous:
            return own
        for other_lane, entry in self.cached.items():
            if entry.response_id == previous and other_lane != lane:
                return Cached(
                    entry.response_id,
                    entry.conversation.fork(work),
                    entry.gpu,
                    entry.model,
                    entry.instructions,
                    entry.tools,
                )
        return None


def _outcome(terminal: ServerEvent) -> Outcome:
    assert isinstance(terminal, TerminalEvent)
    response = terminal.response
    reason = response.incomplete_details.reason if response.incomplete_details else None
    owed = tuple(
        (item_type(item), item.call_id, item.name) for item in response.output if isinstance(item, CALL_ITEMS)
    )
    return Outcome(response.status, reason, owed)
