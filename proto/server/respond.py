"""One response of the request/response transports (HTTP, GA WebSocket): it ends at the first local call.

Shared by ``http.py`` and ``ws_ga.py`` so both do the same thing after the pre-inference pipeline:
sample, bill once, persist (unless ``store: false``), then frame the terminal event — persisting *before*
the terminal event leaves, so a client that chains on it at once always finds it in the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import structlog

from proto.builder import new_item_id
from proto.errors import ClientError
from proto.events import ResponseDone, ServerEvent
from proto.items import FunctionCall, FunctionCallOutput, Item, Message
from proto.response import Response
from proto.server.pipeline import Pipeline, Prepared
from proto.work import WorkCounters
from sampler.gpu import EngineFailure, EngineOverloaded
from sampler.loop import MaxOutputTokens, run

log = structlog.get_logger("proto.server.respond")

_items_decoder = msgspec.json.Decoder(list[Item])
_response_decoder = msgspec.json.Decoder(Response)
_encoder = msgspec.json.Encoder()


class EndAtCalls:
    """The sampling loop's ``Host`` for transports where a response ends at a local call: ``suspend``
    returns ``None`` and the calls stay in the output. Stamps ``sequence_number`` (per response, from 0)
    and hands each event to ``send``."""

    def __init__(self, send: Callable[[ServerEvent], Awaitable[None]]) -> None:
        self._send = send
        self._sequence = 0

    async def emit(self, events: Sequence[ServerEvent]) -> None:
        for event in events:
            event.sequence_number = self._sequence
            self._sequence += 1
            await self._send(event)

    async def suspend(self, done: ResponseDone) -> list[Item] | None:
        del done
        return None

    def take_injected(self) -> list[Item]:
        return []


async def respond(
    pipeline: Pipeline,
    prepared: Prepared,
    host: EndAtCalls,
    api_key_id: str,
    input_items: list[Item],
    created: float,
    generate: bool = True,
) -> ServerEvent:
    """Run one prepared response to its terminal event (already sent through ``host``), billed and stored.

    ``input_items`` are what the store keeps as this response's input: this request's new items only (a
    continuation links to its previous response instead of copying the chain). ``generate=False`` (GA
    warm-up) stops after the pre-inference work: created, then completed with an empty output.
    """
    rollout = prepared.rollout
    builder = rollout.builder
    try:
        await host.emit(builder.start())
        try:
            if generate:
                await run(rollout, host)
            terminal: ServerEvent = builder.completed()
        except MaxOutputTokens:
            terminal = builder.incomplete("max_output_tokens")
        except ClientError as exc:  # e.g. content_policy raised while sampling
            terminal = builder.failed(exc.code, exc.message)
        except EngineOverloaded as exc:
            terminal = builder.failed("server_overloaded", str(exc))
        except EngineFailure as exc:
            terminal = builder.failed("engine_failure", str(exc))
        except Exception as exc:  # a bug must still end the response, and the server keeps serving
            log.exception("sampling_failed", response_id=builder.response.id)
            terminal = builder.failed("server_error", f"internal error: {type(exc).__name__}")
    except asyncio.CancelledError:
        # The client went away (SSE disconnect, WebSocket closed): the work done so far is still billed.
        builder.incomplete("cancelled")
        pipeline.bill(builder, api_key_id, created)
        raise
    finally:
        rollout.sequence.close()  # GPU slot and KV pins: released on every path (cancellation included)
    pipeline.bill(builder, api_key_id, created)
    if builder.response.store:
        await persist(pipeline, builder.response, api_key_id, input_items)
    await host.emit([terminal])
    return terminal


async def persist(pipeline: Pipeline, response: Response, api_key_id: str, input_items: list[Item]) -> None:
    assert response.lab is not None
    response.lab.work.store_writes += 1
    pipeline.totals.store_writes += 1  # bill() merged the counters before this write happened
    await pipeline.store.put(
        response.id,
        api_key_id,
        _encoder.encode(response),
        _encoder.encode([_with_id(item) for item in input_items]),
        response.previous_response_id,
        response.model,
        created_at=float(response.created_at),
    )


def _with_id(item: Item) -> Item:
    """Stored input items carry ids, as OpenAI's ``input_items`` list does (the rendering ignores them)."""
    if item.id is not None:
        return item
    prefix = {Message: "msg", FunctionCall: "fc", FunctionCallOutput: "fco"}.get(type(item), "item")
    return msgspec.structs.replace(item, id=new_item_id(prefix))


async def load_history(pipeline: Pipeline, previous_response_id: str, api_key_id: str, work: WorkCounters) -> list[Item]:
    """The stored chain ending at ``previous_response_id`` as one item list: for each response, oldest
    first, its input items then its output items. ``previous_response_not_found`` when any link is gone."""
    chain = await pipeline.store.chain(previous_response_id, api_key_id)
    if chain is None:
        raise ClientError(
            "previous_response_not_found",
            f"previous response with id {previous_response_id!r} not found",
            "previous_response_id",
        )
    work.store_reads += len(chain)
    history: list[Item] = []
    for stored in chain:
        response = _response_decoder.decode(stored.response_json)
        history.extend(interleave(_items_decoder.decode(stored.input_items_json), response))
    return history


def interleave(inputs: list[Item], response: Response) -> list[Item]:
    """One stored response's items in conversation order: each input item goes before the output item
    that followed it (``lab.input_positions``); without positions, every input precedes the output."""
    positions = response.lab.input_positions if response.lab is not None else None
    if positions is None or len(positions) != len(inputs):
        positions = [0] * len(inputs)
    merged: list[Item] = []
    pending = iter(zip(positions, inputs, strict=True))
    nxt = next(pending, None)
    for index, out in enumerate([*response.output, None]):
        while nxt is not None and nxt[0] <= index:
            merged.append(nxt[1])
            nxt = next(pending, None)
        if out is not None:
            merged.append(out)
    return merged


def decode_stored(data: bytes) -> Response:
    return _response_decoder.decode(data)
