"""Background responses (docs/protocol.md, "Background mode"): the server, not the request, owns them.

``BackgroundResponses`` is their owner, one per server process: it queues each one (its Response stored
``queued`` with its row, in one transaction), runs it on a task of its own through the same
``ResponseDriver`` as every response, cancels it when asked (here or from another process, through the
store), ends every one still running when the server shuts down, and at start-up ends those a dead
process left running. What a background response says differently from a request's is its ``EventSink``
(``_Background``): its events go to the store, not to a socket.

    create ─▶ store: Response queued + row ─▶ task: driver.run ─▶ start events: store in_progress
                                                              ─▶ events ─▶ log (stream: true)
                                                              ─▶ terminal: stored by the driver (or here,
                                                                 when its owner cut it), row ended

Cancel across processes: a cancel that finds the response running elsewhere sets the row's
``cancel_requested``; every process polls its own running responses' rows every ``POLL_S`` (one indexed
read on the store's reader threads, only while it runs any) and cancels those asked. Followers of a
response (``GET …?stream=true``) read its log from the store: woken at once by this process's writes
when it runs here, every ``POLL_S`` otherwise.

Writes to the store for one response run in the order they were asked for, and a cancel of the response's
task never cuts one short (``_Writes``): the terminal state is always the last one stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final

import msgspec
import structlog

from proto.core.errors import ClientError
from proto.core.events import TERMINAL_EVENTS, TERMINAL_TYPES, ResponseInProgress, ServerEvent
from proto.core.items import Item
from proto.core.longlived import Cancel
from proto.core.response import Response
from proto.server.driver import ResponseDriver
from proto.server.pipeline import Pipeline, Prepared
from proto.server.stages.chain import persist_response, with_ids
from proto.server.storage import background as table
from proto.server.storage.store import ResponseStore, StoreError, StoreUnavailable
from proto.server.transports.timers import deadline

log = structlog.get_logger("proto.server.background")

# Real time, not the limits' clock: a poll interval is the latency of a cross-process signal, not a limit
# (CANCEL_WAIT_S is one: it runs on Pipeline.clock).
POLL_S: Final = 0.1  # a cancel asked on another process is seen within this; a remote follower's lag
LOG_PENDING: Final = 512  # events of one response not yet in its log before the driver waits for the store
LOG_RETRIES: Final = 5  # a log write the store refuses is retried this often (backoff from 50 ms), then lost
CANCEL_WAIT_S: Final = 10.0  # how long a cancel waits for another process to end the response
RUNNING: Final = frozenset({"queued", "in_progress"})

_response = msgspec.json.Decoder(Response)
_encoder = msgspec.json.Encoder()


def check_background(background: bool | None, stores: bool) -> None:
    """A background response must be stored (OpenAI refuses ``store: false`` alike: it is polled from
    the store)."""
    if background and not stores:
        raise ClientError("invalid_request", "background responses require store=true", "store")


def starting_after(value: str | None) -> int:
    """``?starting_after=N``: the last event the client has, a sequence number ≥ 0 (none: from the start)."""
    if value is None:
        return -1
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ClientError(
            "invalid_request", "starting_after must be a sequence number (an integer >= 0)", "starting_after"
        )
    return number


def reconcile_stored(store: ResponseStore, me: str) -> list[str]:
    """Blocking, at start-up before serving (``--workers N`` on SQLite: once, in the supervisor): end the
    background responses a dead process left running (``storage.background.reconcile``)."""
    store.database.migrate(table.COMPONENT, table.MIGRATIONS)
    with store.database.connection(write=True) as conn:
        ended = table.reconcile(me, store.database.dead_owners)(conn)
    if ended:
        log.warning("background.reconciled", count=len(ended), response_ids=ended)
    return ended


class _Writes:
    """One response's store writes, in the order asked for; each runs to its end even when the task that
    asked is cancelled (the next one waits for it)."""

    def __init__(self) -> None:
        self.last: asyncio.Task[None] | None = None

    async def run(self, write: Callable[[], Awaitable[None]]) -> None:
        before = self.last

        async def ordered() -> None:
            if before is not None:
                with contextlib.suppress(Exception):  # its own caller heard its failure
                    await before
            await write()

        task = asyncio.create_task(ordered(), name="background-store-write")
        self.last = task
        await asyncio.shield(task)


class _Background:
    """The ``EventSink`` of one background response: its events go to the store (its log, when created
    with ``stream: true``), its start and its end to its stored Response; it is cut only by its owner (a
    cancel, the server's shutdown), and whoever follows it hears why."""

    def __init__(self, owner: BackgroundResponses, prepared: Prepared, api_key_id: str, stream: bool) -> None:
        self.owner = owner
        self.prepared = prepared
        self.api_key_id = api_key_id
        self.stream = stream
        self.response_id = prepared.rollout.builder.response.id
        self.task: asyncio.Task[None] | None = None
        self.reason: str | None = None  # why its owner cut it
        self.running = False  # past ``opened``: a cut cancels the task (before it, the driver ends it)
        self.writes = _Writes()
        self._log: list[tuple[int, str, bytes]] = []  # events not yet handed to the store
        self._flushing: asyncio.Task[None] | None = None
        self._cancelled = False

    def cut_by_owner(self, reason: str) -> None:
        """End it ``reason`` (``cancelled``, ``server_shutting_down``); idempotent, the first reason wins."""
        if self.reason is None:
            self.reason = reason
        # Once, and only while it samples: a response whose terminal event is made is ending anyway (the
        # driver is storing and billing it), and the cancel returns it as it ended.
        sampling = self.prepared.rollout.builder.response.status in RUNNING
        if self.running and sampling and not self._cancelled and self.task is not None:
            self._cancelled = True
            self.task.cancel()

    # -- EventSink --------------------------------------------------------------------------------------
    def opened(self) -> bool:
        self.running = self.reason is None
        return self.running

    async def send(self, events: Sequence[ServerEvent]) -> None:
        self._append(events)
        last = events[-1] if events else None
        if isinstance(last, TERMINAL_EVENTS):
            if self.reason is not None:  # the driver stores what it ended itself; what its owner cut, here
                await self._put(self.prepared.rollout.builder.response)
            await self._flush(ended=True)
            return
        for event in events:
            if isinstance(event, ResponseInProgress):  # queued → in_progress, in the store too
                await self._put(event.response)
        if len(self._log) > LOG_PENDING:
            await self._flush(ended=False)  # back-pressure: the store is behind
        elif self._log:
            self._kick()

    def offer(self, events: Sequence[ServerEvent]) -> bool:
        if len(self._log) + len(events) > LOG_PENDING:
            return False
        self._append(events)
        if self._log:
            self._kick()
        return True

    suspends = False  # as over HTTP: a response ends at its first local call
    error_replaces_failure = False  # its failed Response is stored and polled as it is

    def queued(self) -> list[Item]:
        return []

    def cut(self) -> Cancel | None:
        return Cancel(self.response_id, self.reason or "cancelled")

    def end_at_boundary(self) -> str | None:
        return None

    # -- the store ------------------------------------------------------------------------------------
    def _append(self, events: Sequence[ServerEvent]) -> None:
        if self.stream:
            self._log.extend(
                (event.sequence_number, str(type(event).__struct_config__.tag), _encoder.encode(event))
                for event in events
            )

    async def _put(self, response: Response) -> None:
        pipeline = self.owner.pipeline
        items = self.prepared.rollout.input_items

        async def write() -> None:
            await persist_response(pipeline.store, response, self.api_key_id, items)

        try:
            await self.writes.run(write)
        except (StoreUnavailable, StoreError) as exc:  # its end, or the next start's reconcile, stores it
            log.warning("background.store_failed", response_id=self.response_id, error=str(exc))

    async def settle(self) -> None:
        """Wait for its writes still under way (the task ends after them)."""
        for task in (self._flushing, self.writes.last):
            if task is not None:
                await asyncio.wait({task})

    def _kick(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush(ended=False), name="background-log")

    async def _flush(self, ended: bool) -> None:
        """Everything logged so far into the store; ``ended``: and the row marked ended with it."""
        store = self.owner.pipeline.store
        while self._log or ended:
            batch, self._log = self._log, []
            write = table.append(self.response_id, batch, ended)
            for attempt in range(LOG_RETRIES):

                async def append(write: Callable[..., None] = write) -> None:
                    await store.run("background_log", write, write=True)

                try:
                    await self.writes.run(append)
                    break
                except (StoreUnavailable, StoreError) as exc:
                    log.warning("background.log_failed", response_id=self.response_id, error=str(exc))
                    await asyncio.sleep(0.05 * 2**attempt)
            else:
                log.error("background.log_lost", response_id=self.response_id, events=len(batch))
            self.owner.wake(self.response_id)
            ended = False


class BackgroundResponses:
    """The owner of every background response this process runs (``Server.background``)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.running: dict[str, _Background] = {}
        self.stopping = False
        self._watch: asyncio.Task[None] | None = None
        self._woken: dict[str, asyncio.Event] = {}  # a follower here waits on its response's next write
        pipeline.store.migrate(table.COMPONENT, table.MIGRATIONS)  # as the store's own: at start

    @property
    def me(self) -> str:
        return self.pipeline.ledger.owner

    async def reconcile(self) -> list[str]:
        """At start-up (``create_app``'s ``reconcile``): end what a dead process left running."""
        return await asyncio.to_thread(reconcile_stored, self.pipeline.store, self.me)

    # -- create ---------------------------------------------------------------------------------------
    async def create(self, prepared: Prepared, api_key_id: str, created: float, stream: bool) -> bytes:
        """Queue it (its Response stored ``queued``, with its row, in one transaction) and start it; the
        queued Response's JSON. Nothing is left behind when the store refuses it."""
        rollout = prepared.rollout
        response = rollout.builder.response
        response.status = "queued"
        response.background = True
        rollout.input_items[:] = with_ids(rollout.input_items)  # stored three times, with the same ids
        row = table.insert(response.id, api_key_id, self.me, stream)
        try:
            await persist_response(self.pipeline.store, response, api_key_id, rollout.input_items, also=row)
        except BaseException:
            rollout.sequence.close()  # the driver never ran: nothing else releases its engine sequence
            prepared.ticket.release()  # nor its admission place (docs/protocol.md, "Admission")
            raise
        queued = _encoder.encode(response)
        sink = _Background(self, prepared, api_key_id, stream)
        driver = ResponseDriver(self.pipeline, prepared, sink, api_key_id, created)
        sink.task = asyncio.create_task(self._run(driver), name=f"background-{response.id}")
        self.running[response.id] = sink
        sink.task.add_done_callback(lambda _: self.running.pop(response.id, None))
        # The driver gives its admission place back when it ends; this too when the task was cut before the
        # driver ran (a create as the server stops).
        sink.task.add_done_callback(lambda _: prepared.ticket.release())
        if self.stopping:
            sink.cut_by_owner("server_shutting_down")
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._watch_cancels(), name="background-cancels")
        return queued

    async def _run(self, driver: ResponseDriver) -> None:
        sink = driver.transport
        assert isinstance(sink, _Background)
        try:
            await driver.run()  # its sink always answers a cut: this returns with the terminal event stored
        finally:
            await sink.settle()

    async def _watch_cancels(self) -> None:
        """While this process runs background responses: the cancels other processes asked of them."""
        store = self.pipeline.store
        while self.running:
            await asyncio.sleep(POLL_S)
            try:
                asked = await store.run("background_cancels", table.cancels_for(self.me), write=False)
            except (StoreUnavailable, StoreError) as exc:
                log.warning("background.poll_failed", error=str(exc))
                continue
            for response_id in asked:
                sink = self.running.get(response_id)
                if sink is not None:
                    sink.cut_by_owner("cancelled")

    # -- cancel ---------------------------------------------------------------------------------------
    async def cancel(self, response_id: str, api_key_id: str) -> bytes:
        """``POST /v1/responses/{id}/cancel``: the Response once it ended (cancelled, unless it ended
        otherwise first); one that has ended already, as it is."""
        store = self.pipeline.store
        stored = await store.get(response_id, api_key_id)
        if stored is None:
            raise not_found(response_id)
        if not _response.decode(stored.response_json).background:
            raise ClientError("invalid_request", "Cannot cancel a synchronous response.", "response_id")
        sink = self.running.get(response_id)
        if sink is not None and sink.task is not None:
            sink.cut_by_owner("cancelled")
            await asyncio.wait({sink.task})  # this request going away does not cancel it
        elif await store.run("background_cancel", table.request_cancel(response_id, api_key_id), write=True):
            return await self._until_ended(response_id, api_key_id)
        return await self._stored(response_id, api_key_id)

    async def _until_ended(self, response_id: str, api_key_id: str) -> bytes:
        """The owner on another process sees the cancel within ``POLL_S``; after ``CANCEL_WAIT_S`` (a limit:
        on ``Pipeline.clock``) the Response as it is (a dead owner's is ended by the next start's
        reconcile)."""
        clock = self.pipeline.clock
        with contextlib.suppress(TimeoutError):
            async with deadline(clock, clock.now() + CANCEL_WAIT_S):
                while True:
                    raw = await self._stored(response_id, api_key_id)
                    if _response.decode(raw).status not in RUNNING:
                        return raw
                    await asyncio.sleep(POLL_S)
        return await self._stored(response_id, api_key_id)

    async def _stored(self, response_id: str, api_key_id: str) -> bytes:
        stored = await self.pipeline.store.get(response_id, api_key_id)
        if stored is None:  # deleted meanwhile
            raise not_found(response_id)
        return stored.response_json

    async def forget(self, response_id: str, api_key_id: str) -> None:
        """Before ``DELETE /v1/responses/{id}``: a background response still running is cancelled first
        (its owner would store it again at its end), then its row and its log go."""
        store = self.pipeline.store
        control = await store.run("background_row", table.control(response_id, api_key_id), write=False)
        if control is None:
            return
        if not control.ended:
            await self.cancel(response_id, api_key_id)
        await store.run("background_delete", table.delete(response_id, api_key_id), write=True)

    # -- follow ---------------------------------------------------------------------------------------
    async def check_streamable(self, response_id: str, api_key_id: str) -> None:
        """``GET …?stream=true`` is for a background response created with ``stream: true`` (OpenAI's
        rule: the others have no events to replay)."""
        store = self.pipeline.store
        control = await store.run("background_row", table.control(response_id, api_key_id), write=False)
        if control is not None and control.stream:
            return
        if control is None and await store.get(response_id, api_key_id) is None:
            raise not_found(response_id)
        raise ClientError(
            "invalid_request",
            "only a background response created with stream=true can be streamed",
            "stream",
        )

    async def follow(
        self, response_id: str, api_key_id: str, after: int
    ) -> AsyncIterator[tuple[int, str, bytes]]:
        """Its logged events after sequence number ``after``, ``(number, type, event JSON)``, then the ones
        still to come, to its terminal event (or to the end of the log of a response that ended without one).
        ``server_shutting_down`` when this process stops while the response runs elsewhere."""
        store = self.pipeline.store
        while True:
            here = response_id in self.running
            woken = self._woken.setdefault(response_id, asyncio.Event()) if here else None
            found = await store.run(
                "background_events", table.events_after(response_id, api_key_id, after), write=False
            )
            if found is None:  # deleted meanwhile
                return
            ended, events = found
            for number, kind, data in events:
                yield number, kind, data
                after = number
                if kind in TERMINAL_TYPES:
                    return
            if ended and len(events) < table.PAGE:
                return
            if events:
                continue
            if self.stopping and woken is None:  # it runs elsewhere: this server will not see it end
                raise ClientError("server_shutting_down", "the server is shutting down; resume elsewhere")
            if woken is None:
                await asyncio.sleep(POLL_S)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S):
                        await woken.wait()

    def wake(self, response_id: str) -> None:
        """Its log grew: followers here read on."""
        woken = self._woken.pop(response_id, None)
        if woken is not None:
            woken.set()

    # -- shutdown -------------------------------------------------------------------------------------
    def stop(self) -> None:
        """The server shuts down: every background response ends ``incomplete`` (``server_shutting_down``),
        stored and billed; ``drain`` waits for them."""
        self.stopping = True
        for sink in list(self.running.values()):
            sink.cut_by_owner("server_shutting_down")

    async def drain(self, grace_s: float) -> None:
        tasks = [sink.task for sink in self.running.values() if sink.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=max(grace_s, 0.0))
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch


def not_found(response_id: str) -> ClientError:
    return ClientError("response_not_found", f"response with id {response_id!r} not found", "response_id")
