"""The response driver: one owner for every response, in every transport.

    prepared ─▶ start events ─▶ iterate the sampler ─┬─ Emit ─────▶ sink.send
                                                     ├─ Wait ─────▶ stream from the engine's timer
                                                     ├─ Boundary ─▶ ingest sink.queued()
                                                     └─ Suspend ──▶ sink.suspends?
                                                                     no: the response ends here
                                                                     yes: send response.done,
                                                                          await resume(items), ingest
               ─▶ exactly one terminal event ─▶ persist (store: true) ─▶ bill once ─▶ send it

A transport says only what differs (its ``EventSink``): how events are framed and sent, what a ``Suspend``
means (HTTP and GA WebSocket end the response at its first local call; the long-lived protocol keeps it
open and waits for the core's ``Resume``), which user messages wait for the next turn boundary, and why
its owner cut the response. Everything else — mapping any failure to one terminal event, the GPU
sequence's release, billing exactly once without blocking the loop, storing before the terminal event
leaves (so a client that chains on it at once finds it) — happens here, once.

Appended items enter the context here: scanned, rendered and tokenized once, on arrival
(``Pipeline.ingest``), before the sampler resumes with them.

The fast path (docs/architecture.md, "The fast path") is decided here alone. At a ``Wait`` (a paced engine,
the mock GPU, has nothing due yet) the driver waits on the engine's timer instead of in the engine: at each
deadline it takes the tokens due that fall inside an item already open (``TurnEncoder.inside``, at most
``EMIT_CHUNK``), has the turn's encoder make their events — the encoder that makes every other event of
the turn — and offers them to the sink (``EventSink.offer``), all from the timer, with the response's task
parked on one future. Anything else wakes the task, which resumes the sampler: an item's first or last
token, a burst, the turn's end, a failure; and events the sink has no room for, which the task sends, and
waits (back-pressure as ever).

Billing counts what was delivered. A response leaves a durable trace when it starts (``UsageLedger.started``)
and updates it with what it delivered so far at every turn end and at most every ``--progress-interval-s``
while a turn streams (``progress``: cumulative, coalesced), so that a crash can be reconciled at the next
start. A turn cut short — cancel, disconnect, slow reader, shutdown, an engine failure — is booked before
the terminal event is made (``sampler.loop.cut_turn``): its prompt once its prefill started, and the output
tokens already handed to the transport. The terminal event and the ledger row say the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import Protocol

import structlog

from proto.core.errors import ClientError
from proto.core.events import ServerEvent
from proto.core.items import Item
from proto.core.longlived import Cancel
from proto.core.turn import TurnEncoder
from proto.server.pipeline import Pipeline, Prepared
from proto.server.stages.chain import persist_response, with_ids
from proto.server.stages.conversation import append_response
from proto.server.storage.ledger import LedgerError, LedgerFullError
from proto.server.transports.timers import deadline
from sampler.clock import TimerCall
from sampler.engine import EngineFailure, EngineOverloaded, Pacing
from sampler.loop import (
    EMIT_CHUNK,
    Boundary,
    Emit,
    MaxOutputTokens,
    Suspend,
    Wait,
    cut_turn,
    delivered,
    prewarm,
    sample,
)
from sampler.models import ContextLengthExceeded, context_message

log = structlog.get_logger("proto.server.driver")


class EventSink(Protocol):
    """Where one response's events go, and what its transport says about it."""

    def opened(self) -> bool:
        """The pre-inference work is done and the start events follow. False: the client cancelled
        meanwhile, and the response ends ``cancelled`` at once."""

    async def send(self, events: Sequence[ServerEvent]) -> None:
        """Frame these events (in order) and queue them for the client; may wait (back-pressure)."""

    def offer(self, events: Sequence[ServerEvent]) -> bool:
        """``send`` if that needs no wait: the same framing and order, all of them or none. False: nothing
        was taken (no room, or the client is gone); ``send`` them. Called from the engine's timer (the fast
        path), so it must never block."""

    @property
    def suspends(self) -> bool:
        """What a local tool call means. True: the response is suspended (``response.done``) and waits
        for ``ResponseDriver.resume``; False: the response ends there, its calls in its output."""

    @property
    def error_replaces_failure(self) -> bool:
        """True: nothing reaches the client before the end, and a *failed* response is answered by an
        error body instead of itself (a JSON reply): it delivered nothing, so it bills nothing
        (docs/decisions/0012-bill-what-was-delivered.md). False: its events were the delivery."""

    def queued(self) -> list[Item]:
        """Items the client appended for the next turn boundary (taken: each is handed over once)."""

    def cut(self) -> Cancel | None:
        """Why the owner cancelled the response's task: a ``Cancel`` whose terminal event the client
        hears, or ``None`` when nobody will (the client is gone, the server shuts down)."""

    def end_at_boundary(self) -> str | None:
        """At a turn boundary after the first turn: a reason to end the response there (``incomplete``
        with it: GA WebSocket mode's ``steered``), or ``None`` to sample on."""


class ResponseEnded(Exception):
    """The response ended on the driver's side (``tool_timeout``): it ends ``incomplete`` with this reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ResponseDriver:
    """Runs one prepared response to its terminal event. ``run`` is awaited by the response's owning task;
    ``resume`` is called by the transport when the core says the suspended response may go on."""

    def __init__(
        self,
        pipeline: Pipeline,
        prepared: Prepared,
        transport: EventSink,
        api_key_id: str,
        created: float | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.prepared = prepared
        self.transport = transport
        self.api_key_id = api_key_id
        self.created = time.time() if created is None else created
        self._resume: asyncio.Future[list[Item]] | None = None
        self._billed = False
        self._reported = (0, 0, 0, 0)  # the last progress() figures (the open row starts at zeros)
        self._progress_due = (
            0.0  # time.monotonic() after which a streaming turn reports again: its first token does
        )
        # The classifier's hops beside the prefill (``--safety-placement beside``, docs/lab.md, "Equal
        # rules"): started as a turn's input is ingested, awaited before its first token leaves, cancelled
        # on every way out of ``_sample``.
        self._beside: list[asyncio.Task[None]] = []

    @property
    def response_id(self) -> str:
        return self.prepared.rollout.builder.response.id

    def resume(self, items: list[Item]) -> None:
        """The suspended response's outputs (and any user messages) arrived, all of them."""
        future = self._resume
        if future is None or future.done():
            raise RuntimeError("resume() while the response is not suspended")  # the core orders this: a bug
        future.set_result(items)

    async def run(self, generate: bool = True) -> ServerEvent:
        """To the terminal event, which has been sent (unless the client is gone) when this returns.
        ``generate=False`` (GA warm-up) stops after the pre-inference work. Re-raises the owner's
        cancellation when nobody hears the terminal event; the response is billed either way."""
        builder = self.prepared.rollout.builder
        try:
            terminal = await self._produce(generate)
            # One loop turn before the terminal work (storing the response, billing, encoding the terminal
            # event: milliseconds at 100 k tokens): a transport whose writer is another task (SSE) puts the
            # final answer's last tokens on the wire first. WebSocket outboxes have written them already.
            await asyncio.sleep(0)
            terminal = await self._persist(terminal)
        except asyncio.CancelledError:
            cut_turn(self.prepared.rollout)  # the turn in progress bills what it delivered
            cut = self.transport.cut()
            terminal = builder.incomplete(cut.reason if cut is not None else "cancelled")
            self._bill()
            if cut is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the cancel was the client's own: it is answered, not propagated
            terminal = builder.reissue(terminal)
            await self.transport.send([terminal])
            return terminal
        finally:
            self.prepared.rollout.sequence.close()  # GPU slot and KV pins: released on every path
            self.prepared.ticket.release()  # its place in admission (docs/protocol.md, "Admission")
        terminal = builder.reissue(self._bill() or terminal)
        await self.transport.send([terminal])
        return terminal

    # ------------------------------------------------------------------------------------ stages
    async def _produce(self, generate: bool) -> ServerEvent:
        """The start events, the sampling, and the terminal event every way it can end."""
        builder = self.prepared.rollout.builder
        proceed = self.transport.opened()
        untraced = self._trace_start()
        await self.transport.send(builder.start())
        if untraced is not None:
            return builder.failed(
                "ledger_unavailable", f"usage cannot be recorded ({untraced}); the response did not run"
            )
        if not proceed:
            return builder.incomplete("cancelled")
        if self.prepared.rollout.prewarm:
            await prewarm(
                self.prepared.rollout
            )  # writes the cache, generates nothing, whatever generate says
            return builder.completed()
        if not generate:
            return builder.completed()
        try:
            await self._sample()
        except Exception as exc:
            cut_turn(self.prepared.rollout)  # an engine failure mid-turn still bills what it delivered
            return self._ended(exc)
        return builder.completed()

    def _ended(self, exc: Exception) -> ServerEvent:
        """The terminal event of a response the sampling ended by raising ``exc``."""
        builder = self.prepared.rollout.builder
        match exc:
            case MaxOutputTokens():  # the response's max_output_tokens, the model's max output or its window
                return builder.incomplete("max_output_tokens")
            case ResponseEnded():
                return builder.incomplete(exc.reason)
            case ClientError():  # content_policy on an appended item, too_many_pending_calls
                return builder.failed(exc.code, exc.message)
            case ContextLengthExceeded():  # refused before any prefill; OpenAI fails the response alike
                return builder.failed("context_length_exceeded", context_message(exc))
            case EngineOverloaded():
                return builder.failed("server_overloaded", str(exc))
            case EngineFailure():
                return builder.failed("engine_failure", str(exc))
        # A bug must still end the response, and the server keeps serving.
        log.exception("sampling_failed", response_id=builder.response.id)  # called inside the except block
        return builder.failed("server_error", f"internal error: {type(exc).__name__}")

    def _trace_start(self) -> str | None:
        """The response's durable trace (the ledger's open row); why it could not be taken, if so: then the
        response does not run (nothing is served that could not be billed)."""
        builder = self.prepared.rollout.builder
        response = builder.response
        try:
            self.pipeline.ledger.started(
                response.id, self.api_key_id, response.model, builder.lab.mode, self.created
            )
        except LedgerError as exc:
            log.error("ledger.start_refused", response_id=response.id, error=str(exc))
            return (
                "the usage ledger is full"
                if isinstance(exc, LedgerFullError)
                else "the usage ledger is closed"
            )
        return None

    def _progress(self) -> None:
        """What the response delivered so far, into its crash trace (cumulative; the ledger coalesces
        updates still pending). Best effort: the usage row at the end is what bills."""
        figures = delivered(self.prepared.rollout)
        if figures == self._reported:
            return
        self._reported = figures
        self._progress_due = time.monotonic() + self.pipeline.settings.progress_interval_s
        try:
            self.pipeline.ledger.progress(self.response_id, *figures)
        except LedgerError as exc:
            log.warning("ledger.progress_refused", response_id=self.response_id, error=str(exc))

    async def _sample(self) -> None:
        try:
            self._classify_beside(self.prepared.beside_ms)
            await self._steps()
        finally:
            for task in self._beside:
                task.cancel()
            self._beside.clear()

    def _classify_beside(self, ms: float) -> None:
        if ms > 0:
            rollout = self.prepared.rollout
            self._beside.append(asyncio.create_task(self.pipeline.beside(rollout, ms), name="safety-beside"))

    async def _first_token(self) -> None:
        """The turn's first token waits for the classifier running beside its prefill, if any."""
        if not self._beside:
            return
        tasks, self._beside = self._beside, []
        phases = self.prepared.rollout.pending_phases
        started = time.perf_counter()
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()  # a no-op once done; the way out when this wait was cancelled
        waited = (time.perf_counter() - started) * 1e3
        phases["safety_wait"] = phases.get("safety_wait", 0.0) + waited
        lab = self.prepared.rollout.builder.lab
        lab.phases_ms["safety_wait"] = lab.phases_ms.get("safety_wait", 0.0) + waited

    async def _steps(self) -> None:
        rollout = self.prepared.rollout
        async with aclosing(sample(rollout)) as steps:
            reply: list[Item] | None = None
            sampled = False  # a turn has streamed: the next boundary is between turns
            while True:
                try:
                    step = await steps.asend(reply)
                except StopAsyncIteration:
                    return
                reply = None
                match step:
                    case Emit(events):
                        sampled = True
                        await self._first_token()
                        await self._send(events)
                    case Wait(pacing, turn):
                        await self._first_token()
                        await self._stream(pacing, turn)
                    case Boundary(final):
                        self._progress()  # a turn boundary: the turn before it is booked
                        reason = self.transport.end_at_boundary() if sampled and not final else None
                        if reason is not None:
                            raise ResponseEnded(reason)
                        reply = await self._ingest(self.transport.queued())
                    case Suspend(calls):
                        self._progress()
                        if not self.transport.suspends:
                            return
                        # before done can be answered
                        self._resume = asyncio.get_running_loop().create_future()
                        try:
                            await self.transport.send([rollout.builder.suspend(list(calls))])
                            reply = await self._ingest(await self._wait_resume())
                        finally:
                            self._resume = None

    async def _send(self, events: tuple[ServerEvent, ...]) -> None:
        await self.transport.send(events)
        if time.monotonic() >= self._progress_due:
            self._progress()

    async def _stream(self, pacing: Pacing, turn: TurnEncoder) -> None:
        """The fast path (see the module's docstring): take the turn's next tokens from the engine's timer
        while they fall inside an open item and the sink has room; return when the rest is the task's."""
        at = pacing.next_due()
        if at is None or not turn.inside():
            return  # the turn's end, a failure, or the next token opens or ends an item: the sampler's
        woken: asyncio.Future[tuple[ServerEvent, ...]] = asyncio.get_running_loop().create_future()
        timer = pacing.timer
        transport = self.transport
        call: TimerCall | None = None

        def due() -> None:
            nonlocal call
            if woken.done():
                return  # the task was cancelled (its wait with it) and has not run yet: it is on its way out
            try:
                plain = turn.inside()
                k = pacing.release(plain if plain < EMIT_CHUNK else EMIT_CHUNK)
                events = turn.advance(k) if k else ()
                if events:
                    if not transport.offer(events):
                        woken.set_result(events)  # no room: the task sends them, and waits
                        return
                    if time.monotonic() >= self._progress_due:
                        self._progress()
                # A full chunk may be a burst (a late wake-up, a very fast model): the task takes the rest,
                # as it takes any burst, with other streams going first between its chunks.
                # k < plain: still inside
                nxt = pacing.next_due() if 0 < k < EMIT_CHUNK and k < plain else None
                if nxt is not None:
                    call = timer.call_at(nxt, due)
                    return
            except Exception as exc:  # a bug: the response fails in its task
                woken.set_exception(exc)
                return
            woken.set_result(())

        call = timer.call_at(at, due)
        try:
            events = await woken
        finally:
            call.cancel()  # the task was cancelled meanwhile: nothing more is taken
        if events:
            await self._send(events)

    async def _wait_resume(self) -> list[Item]:
        future = self._resume
        assert future is not None
        clock = self.pipeline.clock
        try:
            async with deadline(clock, clock.now() + self.pipeline.settings.tool_timeout_s):
                return await future
        except TimeoutError:
            raise ResponseEnded("tool_timeout") from None

    async def _ingest(self, items: list[Item]) -> list[Item]:
        if items:
            prepared = self.prepared
            self._classify_beside(await self.pipeline.ingest(prepared.rollout, items, prepared.gpu.limits))
        return items

    async def _persist(self, terminal: ServerEvent) -> ServerEvent:
        builder = self.prepared.rollout.builder
        response = builder.response
        # Its conversation gets the items of a response that ran (docs/protocol.md, "Conversations").
        joins = response.conversation is not None and response.status != "failed"
        if not response.store and not joins:
            return terminal
        inputs = with_ids(self.prepared.rollout.input_items)  # one id, both copies
        try:
            if joins:
                await append_response(self.pipeline.conversations, response, self.api_key_id, inputs)
            if response.store:
                await persist_response(self.pipeline.store, response, self.api_key_id, inputs)
        except Exception as exc:  # a store fault ends this response typed; the connection serves on
            log.warning("store.write_failed", response_id=builder.response.id, error=type(exc).__name__)
            return builder.failed("store_unavailable", f"the response could not be stored: {exc}")
        return terminal

    def _bill(self) -> ServerEvent | None:
        """Once per response, on every path; never blocks the loop. A ledger that cannot take the row
        turns the terminal event into a typed failure (the row is not silently dropped)."""
        if self._billed:
            return None
        self._billed = True
        builder = self.prepared.rollout.builder
        void = builder.response.status == "failed" and self.transport.error_replaces_failure
        try:
            self.pipeline.bill(builder, self.api_key_id, self.created, delivered=not void)
        except LedgerError as exc:  # full (or closed under a shutdown past its grace)
            log.error("ledger.refused", response_id=builder.response.id, error=str(exc))
            return builder.failed("ledger_unavailable", "usage could not be recorded; the response is void")
        return None
