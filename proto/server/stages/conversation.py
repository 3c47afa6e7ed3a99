"""A create's ``conversation`` (docs/protocol.md, "Conversations"): its items as the response's context,
and the response's items appended to it once it ends. Every transport's create uses these (HTTP JSON and
SSE, GA WebSocket mode, the long-lived protocol); the driver appends.
"""

from __future__ import annotations

import msgspec
import structlog

from proto.core.conversations import check_new_ids, conversation_id, item_ids, stored_item
from proto.core.errors import ClientError
from proto.core.events import CreateBody
from proto.core.items import Item, item_id_of
from proto.core.response import Response
from proto.core.work import WorkCounters
from proto.server.stages.chain import interleave, load_history
from proto.server.storage.conversations import ConversationMissing, ConversationStore

log = structlog.get_logger("proto.server.conversation")
_item_decoder = msgspec.json.Decoder(Item)
_encoder = msgspec.json.Encoder()


def not_found(conversation: str, param: str) -> ClientError:
    return ClientError("conversation_not_found", f"conversation with id {conversation!r} not found", param)


async def load_conversation(
    conversations: ConversationStore,
    request: CreateBody,
    items: list[Item],
    api_key_id: str,
    work: WorkCounters,
    root: str = "",
) -> list[Item]:
    """The items of the conversation ``request`` names, oldest first ([] when it names none), to go before
    ``items`` (the request's input, whose ids must be new to it). ``conversation_not_found`` when this key
    has no such conversation."""
    wanted = conversation_id(request)
    if wanted is None:
        return []
    try:
        stored = await conversations.items(wanted, api_key_id)
    except ConversationMissing:
        raise not_found(wanted, f"{root}conversation") from None
    work.store_reads += 1
    history = [_item_decoder.decode(raw) for raw in stored]
    check_new_ids(item_ids(history), items, f"{root}input")
    return history


async def load_context(
    conversations: ConversationStore,
    request: CreateBody,
    items: list[Item],
    api_key_id: str,
    work: WorkCounters,
    root: str = "",
) -> list[Item]:
    """The server-held history a create continues: its stored chain (``previous_response_id``), else its
    conversation's items (``load_conversation``: [] when it names neither)."""
    if request.previous_response_id is not None:
        return await load_history(conversations.store, request.previous_response_id, api_key_id, work)
    return await load_conversation(conversations, request, items, api_key_id, work, root)


async def append_response(
    conversations: ConversationStore, response: Response, api_key_id: str, inputs: list[Item]
) -> None:
    """The response's input items (``inputs``, with the ids its stored copy has) and output items, in the
    order they entered its context, appended to its conversation (``ConversationMissing`` if it was
    deleted meanwhile)."""
    assert response.conversation is not None
    items = [stored_item(item) for item in interleave(inputs, response)]
    try:
        await conversations.append(response.conversation.id, api_key_id, encoded(items))
    except ConversationMissing:  # deleted while the response ran: nothing to join, the response stands
        log.warning("conversation.gone", response_id=response.id, conversation_id=response.conversation.id)


def encoded(items: list[Item]) -> list[tuple[str, bytes]]:
    """(id, JSON) of stored conversation items (each has an id: ``stored_item``)."""
    return [(item_id_of(item) or "", _encoder.encode(item)) for item in items]
