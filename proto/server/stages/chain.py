"""Stored responses as a conversation: writing one response to the store, and rebuilding the item list
of a stored chain (``previous_response_id``) in the order its items entered the context.

Every transport that stores or continues a chain uses these (HTTP ``previous_response_id``, GA WebSocket's
store fallback, a long-lived ``response.create`` that continues a stored response).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from proto.core.builder import with_item_id
from proto.core.errors import ClientError
from proto.core.items import Item, ItemReference, item_id_of
from proto.core.response import Response
from proto.core.work import WorkCounters
from proto.server.storage.database import Connection
from proto.server.storage.store import ResponseStore

_items_decoder = msgspec.json.Decoder(list[Item])
_item_decoder = msgspec.json.Decoder(Item)
_response_decoder = msgspec.json.Decoder(Response)
_encoder = msgspec.json.Encoder()


async def persist_response(
    store: ResponseStore,
    response: Response,
    api_key_id: str,
    input_items: list[Item],
    also: Callable[[Connection], None] | None = None,
) -> None:
    """``input_items`` are this response's own inputs (a continuation links to its previous response
    instead of copying the chain). ``also``: written in the same transaction (``ResponseStore.put``)."""
    assert response.lab is not None
    response.lab.work.store_writes += 1
    inputs = with_ids(input_items)
    by_id = [
        (item_id, _encoder.encode(item))
        for item in (*inputs, *response.output)
        if (item_id := item_id_of(item))
    ]
    await store.put(
        response.id,
        api_key_id,
        _encoder.encode(response),
        _encoder.encode(inputs),
        response.previous_response_id,
        response.model,
        created_at=float(response.created_at),
        items=by_id,
        also=also,
    )


def with_ids(items: list[Item]) -> list[Item]:
    """``items``, each with an id (a response stored more than once keeps the same ids: give them first)."""
    return [with_item_id(item) for item in items]


async def resolve_references(
    store: ResponseStore,
    items: list[Item],
    api_key_id: str,
    work: WorkCounters,
    root: str = "",
    field: str = "input",
) -> list[Item]:
    """Each ``item_reference`` replaced by the stored item it names (OpenAI resolves them the same way:
    the AI SDK sends its earlier output items as references when ``store`` is on). ``item_not_found``
    names the first one missing (another key's items do not exist for this key)."""
    wanted = [item.id for item in items if isinstance(item, ItemReference)]
    if not wanted:
        return items
    found = await store.find_items(wanted, api_key_id)
    resolved: list[Item] = []
    for index, item in enumerate(items):
        if not isinstance(item, ItemReference):
            resolved.append(item)
        elif item.id in found:
            resolved.append(_item_decoder.decode(found[item.id]))
            work.references_resolved += 1
        else:
            raise ClientError(
                "item_not_found", f"item with id {item.id!r} not found", f"{root}{field}[{index}].id"
            )
    return resolved


async def load_history(
    store: ResponseStore, previous_response_id: str, api_key_id: str, work: WorkCounters
) -> list[Item]:
    """The stored chain ending at ``previous_response_id`` as one item list: for each response, oldest
    first, its input items then its output items. ``previous_response_not_found`` when any link is gone."""
    chain = await store.chain(previous_response_id, api_key_id)
    if chain is None:
        raise ClientError(
            "previous_response_not_found",
            f"Previous response with id '{previous_response_id}' not found.",
            "previous_response_id",
        )
    work.store_reads += len(chain)
    history: list[Item] = []
    for stored in chain:
        response = _response_decoder.decode(stored.response_json)
        if response.status in ("queued", "in_progress"):  # docs/protocol.md, "Background mode"
            raise ClientError(
                "response_in_progress",
                f"response {stored.response_id!r} is still running in the background",
                "previous_response_id",
            )
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
