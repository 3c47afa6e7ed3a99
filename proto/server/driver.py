"""The response driver: one owner for every response, in every transport.

    prepared ─▶ start events ─▶ iterate the sampler ─┬─ Emit ─────▶ transport.send
                                                     ├─ Boundary ─▶ ingest transport.queued()
                                                     └─ Suspend ──▶ transport.suspends?
                                                                     no: the response ends here
                                                                     yes: send response.done,
                                                                          await resume(items), ingest
               ─▶ exactly one terminal event ─▶ persist (store: true) ─▶ bill once ─▶ send it

A transport says only what differs (``Transport``): how events are framed and sent, what a ``Suspend``
means (HTTP and GA WebSocket end the response at its first local call; the long-lived protocol keeps it
open and waits for the core's ``Resume``), which user messages wait for the next turn boundary, and why
its owner cut the response. Everything else — mapping any failure to one terminal event, the GPU
sequence's release, billing exactly once without blocking the loop, storing before the terminal event
leaves (so a client that chains on it at once finds it) — happens here, once.

Appended items enter the context here: scanned, rendered and tokenized once, on arrival
(``Pipeline.ingest``), before the sampler resumes with them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import Protocol

import structlog

from proto.errors import ClientError
from proto.events import ServerEvent
from proto.items import Item
from proto.longlived import Cancel
from proto.server.chain import persist_response
from proto.server.ledger import LedgerFullError
from proto.server.pipeline import Pipeline, Prepared
from proto.server.timers import deadline
from sampler.gpu import EngineFailure, EngineOverloaded
from sampler.loop import Boundary, Emit, MaxOutputTokens, Suspend, sample

log = structlog.get_logger("proto.server.driver")


class Transport(Protocol):
    """What one transport says about the response it carries."""

    def opened(self) -> bool:
        """The pre-inference work is done and the start events follow. False: the client cancelled
        meanwhile, and the response ends ``cancelled`` at once."""

    async def send(self, events: Sequence[ServerEvent]) -> None:
        """Frame these events (in order) and queue them for the client; may wait (back-pressure)."""

    @property
    def suspends(self) -> bool:
        """What a local tool call means. True: the response is suspended (``response.done``) and waits
        for ``ResponseDriver.resume``; False: the response ends there, its calls in its output."""

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

    def __init__(self, pipeline: Pipeline, prepared: Prepared, transport: Transport, api_key_id: str, created: float | None = None) -> None:
        self.pipeline = pipeline
        self.prepared = prepared
        self.transport = transport
        self.api_key_id = api_key_id
        self.created = time.time() if created is None else created
        self._resume: asyncio.Future[list[Item]] | None = None
        self._billed = False

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
            terminal = await self._persist(terminal)
        except asyncio.CancelledError:
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
        terminal = builder.reissue(self._bill() or terminal)
        await self.transport.send([terminal])
        return terminal

    # ------------------------------------------------------------------------------------ stages
    async def _produce(self, generate: bool) -> ServerEvent:
        """The start events, the sampling, and the terminal event every way it can end."""
        builder = self.prepared.rollout.builder
        proceed = self.transport.opened()
        await self.transport.send(builder.start())
        if not proceed:
            return builder.incomplete("cancelled")
        if not generate:
            return builder.completed()
        try:
            await self._sample()
        except MaxOutputTokens:
            return builder.incomplete("max_output_tokens")
        except ResponseEnded as ended:
            return builder.incomplete(ended.reason)
        except ClientError as exc:  # content_policy on an appended item, too_many_pending_calls
            return builder.failed(exc.code, exc.message)
        except EngineOverloaded as exc:
            return builder.failed("server_overloaded", str(exc))
        except EngineFailure as exc:
            return builder.failed("engine_failure", str(exc))
        except Exception as exc:  # a bug must still end the response, and the server keeps serving
            log.exception("sampling_failed", response_id=builder.response.id)
            return builder.failed("server_error", f"internal error: {type(exc).__name__}")
        return builder.completed()

    async def _sample(self) -> None:
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
                        await self.transport.send(events)
                    case Boundary(final):
                        reason = self.transport.end_at_boundary() if sampled and not final else None
                        if reason is not None:
                            raise ResponseEnded(reason)
                        reply = self._ingest(self.transport.queued())
                    case Suspend(calls):
                        if not self.transport.suspends:
                            return
                        self._resume = asyncio.get_running_loop().create_future()  # before done can be answered
                        try:
                            await self.transport.send([rollout.builder.suspend(list(calls))])
                            reply = self._ingest(await self._wait_resume())
                        finally:
                            self._resume = None

    async def _wait_resume(self) -> list[Item]:
        future = self._resume
        assert future is not None
        clock = self.pipeline.clock
        try:
            async with deadline(clock, clock.now() + self.pipeline.settings.tool_timeout_s):
                return await future
        except TimeoutError:
            raise ResponseEnded("tool_timeout") from None

    def _ingest(self, items: list[Item]) -> list[Item]:
        if items:
            self.pipeline.ingest(self.prepared.rollout, items)
        return items

    async def _persist(self, terminal: ServerEvent) -> ServerEvent:
        builder = self.prepared.rollout.builder
        if not builder.response.store:
            return terminal
        try:
            await persist_response(self.pipeline, builder.response, self.api_key_id, self.prepared.rollout.input_items)
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
        try:
            self.pipeline.bill(builder, self.api_key_id, self.created)
        except LedgerFullError as exc:
            log.error("ledger.refused", response_id=builder.response.id, error=str(exc))
            return builder.failed("ledger_unavailable", "usage could not be recorded; the response is void")
        return None
