"""The Conversations API's requests, objects and rules, sans-IO (docs/protocol.md, "Conversations").

OpenAI's shapes (the ``openai`` SDK's ``types/conversations``): a ``conversation`` object (``conv_…`` id,
``created_at``, ``metadata``), ``conversation.deleted``, and the items list (``first_id``, ``last_id``,
``has_more``). OpenAI's documented limits: at most 20 items per create or add, metadata of at most 16 pairs
with keys of at most 64 characters and values of at most 512 (``proto/core/limits.py``); a list's
``limit`` is 1–100 (default 20), its ``order`` ``asc`` or ``desc`` (default ``desc``).

Items are decoded one by one as a create's input is (``codec.decode_items``: a bad one names its path,
``items[2].content``) and stored as OpenAI returns conversation items: every item has an ``id``, a
``status`` where its type has one, and a message's content as a list of parts (a string becomes one
``input_text`` part, ``output_text`` for the assistant).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, get_args, get_type_hints

import msgspec

from proto.core import codec
from proto.core import openai_types as oa
from proto.core.builder import with_item_id
from proto.core.errors import ClientError
from proto.core.events import CreateBody
from proto.core.items import InputText, Item, ItemReference, Message, OutputText, item_id_of

MAX_ITEMS = 20  # per create or add (OpenAI: "You may add up to 20 items at a time")
MAX_LIMIT = 100
DEFAULT_LIMIT = 20

# ``include`` of the items endpoints takes the Responses API's includables (the SDK's ``ResponseIncludable``).
INCLUDABLE = frozenset(
    get_args(get_args(get_args(get_type_hints(oa.ResponseCreateParamsBase)["include"])[0])[0])
)


class CreateConversation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations``."""

    items: list[msgspec.Raw] | None = None
    metadata: dict[str, Any] | None = None  # values checked by ``check_metadata`` (it names the key)


class UpdateConversation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations/{id}``: ``metadata`` is required (``null`` clears it)."""

    metadata: dict[str, Any] | None


class AddItems(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations/{id}/items``."""

    items: list[msgspec.Raw]


class Conversation(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class ConversationDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


class ItemList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[msgspec.Raw]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ListQuery(msgspec.Struct, frozen=True):
    """A list request's query: ``after`` (an item id), ``limit``, ``order``."""

    after: str | None = None
    limit: int = DEFAULT_LIMIT
    order: Literal["asc", "desc"] = "desc"


def new_conversation_id() -> str:
    return "conv_" + secrets.token_hex(24)


def decode_items(raw: Sequence[msgspec.Raw], path: str = "items") -> list[Item]:
    """A create's or an add's items: at most 20, each a valid item (``param`` names the bad one)."""
    if len(raw) > MAX_ITEMS:
        raise ClientError("too_many_items", f"at most {MAX_ITEMS} items may be added at a time", path)
    return codec.decode_items(list(raw), path)


def item_ids(items: Sequence[Item]) -> set[str]:
    return {item_id for item in items if (item_id := item_id_of(item)) is not None}


def check_new_ids(existing: Collection[str], items: Sequence[Item], path: str) -> None:
    """An item joining a conversation brings an id none of the conversation's ``existing`` ids is (OpenAI
    refuses a duplicate item); ``path[i].id`` names the first that does."""
    seen = set(existing)
    for index, item in enumerate(items):
        item_id = item_id_of(item)
        if item_id is None or isinstance(item, ItemReference):
            continue
        if item_id in seen:
            raise ClientError(
                "invalid_request", f"duplicate item found with id {item_id!r}", f"{path}[{index}].id"
            )
        seen.add(item_id)


def stored_item(item: Item) -> Item:
    """The item as a conversation holds and returns it: an id, a status where its type has one, a
    message's content as parts (a reference is resolved before, never stored)."""
    item = with_item_id(item)
    fields: dict[str, Any] = {}
    if "status" in item.__struct_fields__ and getattr(item, "status", None) is None:
        fields["status"] = "completed"
    if isinstance(item, Message):
        if isinstance(item.content, str):
            part = OutputText(text=item.content) if item.role == "assistant" else InputText(text=item.content)
            fields["content"] = [part]
        parts = fields.get("content", item.content)
        fields["content"] = [
            msgspec.structs.replace(p, annotations=[])
            if isinstance(p, OutputText) and p.annotations is None
            else p
            for p in parts
        ]
    return msgspec.structs.replace(item, **fields) if fields else item


def conversation_id(request: CreateBody) -> str | None:
    """The conversation a create names (a string or ``{"id": …}``)."""
    ref = request.conversation
    if ref is None:
        return None
    return ref if isinstance(ref, str) else ref.id


def parse_list_query(query: Mapping[str, str]) -> ListQuery:
    """``limit`` 1–100 (default 20), ``order`` ``asc``/``desc`` (default ``desc``), ``after``; ``include``
    values must be includables (``check_include``)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ClientError("invalid_request", f"order must be 'asc' or 'desc', not {order!r}", "order")
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw_limit)
    except ValueError:
        raise ClientError(
            "invalid_request", f"limit must be an integer, not {raw_limit!r}", "limit"
        ) from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ClientError("invalid_request", f"limit must be between 1 and {MAX_LIMIT}, not {limit}", "limit")
    return ListQuery(query.get("after"), limit, "asc" if order == "asc" else "desc")


def check_include(values: Sequence[str]) -> None:
    """Every ``include`` value is one the Responses API documents. Stored items keep every field they
    have, so an accepted value changes nothing in the reply (docs/protocol.md, "Conversations")."""
    for index, value in enumerate(values):
        if value not in INCLUDABLE:
            raise ClientError("invalid_request", f"unknown include value {value!r}", f"include[{index}]")


def item_list(data: Sequence[bytes], has_more: bool) -> ItemList:
    """The list shape around stored items (their JSON as stored)."""
    return ItemList(
        data=[msgspec.Raw(raw) for raw in data],
        first_id=_raw_id(data[0]) if data else None,  # only the ends are named: nothing else is decoded
        last_id=_raw_id(data[-1]) if data else None,
        has_more=has_more,
    )


class _Id(msgspec.Struct):
    id: str | None = None


_id_decoder = msgspec.json.Decoder(_Id)


def _raw_id(raw: bytes) -> str | None:
    return _id_decoder.decode(raw).id
