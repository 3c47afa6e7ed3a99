"""The Conversations API over HTTP (docs/protocol.md, "Conversations"): a thin adapter between the wire
(``proto.core.conversations``: requests, objects, rules) and the storage
(``proto.server.storage.conversations``, on the store's threads).

Every endpoint answers bad input with the OpenAI error body and a typed code before anything is written:
``conversation_not_found`` / ``item_not_found`` (404: another key's are not found either),
``invalid_request`` with the field (``items[2].content``, ``metadata``, ``limit``), ``too_many_items``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proto.core import codec
from proto.core import conversations as conv
from proto.core.errors import ClientError
from proto.core.items import Item
from proto.core.limits import check_metadata
from proto.core.work import WorkCounters
from proto.server.auth import Auth, error_response
from proto.server.pipeline import Pipeline, typed_faults
from proto.server.stages.chain import resolve_references
from proto.server.stages.conversation import encoded, not_found
from proto.server.storage.conversations import ConversationMissing, ItemMissing, StoredConversation

_encoder = msgspec.json.Encoder()
_metadata_decoder = msgspec.json.Decoder(dict[str, str])
JSON = "application/json"
# Built once, as every decoder (``proto/core/codec.py``).
_CREATE = msgspec.json.Decoder(conv.CreateConversation)
_UPDATE = msgspec.json.Decoder(conv.UpdateConversation)
_ADD = msgspec.json.Decoder(conv.AddItems)
Handler = Callable[[Request, str], Awaitable[Response]]


class ConversationRoutes:
    """``/v1/conversations[/{conversation_id}[/items[/{item_id}]]]``. ``read_body``: a request's body as
    the create endpoint reads it (size limit, ``Content-Encoding``)."""

    def __init__(
        self, auth: Auth, pipeline: Pipeline, read_body: Callable[[Request], Awaitable[bytes]]
    ) -> None:
        self.auth = auth
        self.pipeline = pipeline
        self.store = pipeline.conversations
        self.read_body = read_body

    def routes(self) -> list[Route]:
        base = "/v1/conversations"
        one = base + "/{conversation_id}"
        item = one + "/items/{item_id}"
        table: list[tuple[str, str, Handler]] = [
            (base, "POST", self.create),
            (one, "GET", self.retrieve),
            (one, "POST", self.update),
            (one, "DELETE", self.delete),
            (one + "/items", "POST", self.add_items),
            (one + "/items", "GET", self.list_items),
            (item, "GET", self.retrieve_item),
            (item, "DELETE", self.delete_item),
        ]
        return [
            Route(path, self.auth.guard(_typed(handler)), methods=[method]) for path, method, handler in table
        ]

    # ------------------------------------------------------------------------------ conversations
    async def create(self, request: Request, key: str) -> Response:
        body: conv.CreateConversation = codec.decode_request(await self.read_body(request), _CREATE)
        metadata = check_metadata(body.metadata)
        items = await self._new_items(body.items or [], key, set())
        conversation = conv.Conversation(
            id=conv.new_conversation_id(), created_at=int(time.time()), metadata=metadata
        )
        await self.store.create(
            conversation.id, key, conversation.created_at, _encoder.encode(metadata), encoded(items)
        )
        return _json(conversation)

    async def retrieve(self, request: Request, key: str) -> Response:
        return _json(_conversation(await self.store.get(_conversation_id(request), key)))

    async def update(self, request: Request, key: str) -> Response:
        body: conv.UpdateConversation = codec.decode_request(await self.read_body(request), _UPDATE)
        metadata = check_metadata(body.metadata)
        stored = await self.store.update(_conversation_id(request), key, _encoder.encode(metadata))
        return _json(_conversation(stored))

    async def delete(self, request: Request, key: str) -> Response:
        conversation_id = _conversation_id(request)
        await self.store.delete(conversation_id, key)
        return _json(conv.ConversationDeleted(id=conversation_id))

    # ------------------------------------------------------------------------------ items
    async def add_items(self, request: Request, key: str) -> Response:
        conv.check_include(_include(request))
        body: conv.AddItems = codec.decode_request(await self.read_body(request), _ADD)
        conversation_id = _conversation_id(request)
        items = await self._new_items(body.items, key, await self.store.item_ids(conversation_id, key))
        rows = encoded(items)
        await self.store.append(conversation_id, key, rows)
        return _json(conv.item_list([body for _, body in rows], has_more=False))

    async def list_items(self, request: Request, key: str) -> Response:
        query = conv.parse_list_query(request.query_params)
        conv.check_include(_include(request))
        page, more = await self.store.page(
            _conversation_id(request), key, query.after, query.limit, query.order == "asc"
        )
        return _json(conv.item_list(page, more))

    async def retrieve_item(self, request: Request, key: str) -> Response:
        conv.check_include(_include(request))
        raw = await self.store.item(_conversation_id(request), key, request.path_params["item_id"])
        return Response(raw, media_type=JSON)

    async def delete_item(self, request: Request, key: str) -> Response:
        stored = await self.store.delete_item(_conversation_id(request), key, request.path_params["item_id"])
        return _json(_conversation(stored))

    async def _new_items(self, raw: list[msgspec.Raw], key: str, existing: set[str]) -> list[Item]:
        """Items joining a conversation: decoded (at most 20, each valid), references resolved, stored
        as conversation items, their ids new to it (``existing``: the ids it has)."""
        work = WorkCounters()
        items = conv.decode_items(raw)
        items = await resolve_references(self.pipeline.store, items, key, work, field="items")
        stored = [conv.stored_item(item) for item in items]
        conv.check_new_ids(existing, stored, "items")
        return stored


def _typed(handler: Handler) -> Handler:
    """The handler's refusals and the store's faults as the OpenAI error body."""

    async def typed(request: Request, key: str) -> Response:
        try:
            with typed_faults():
                try:
                    return await handler(request, key)
                except ConversationMissing as exc:
                    raise not_found(str(exc), "conversation_id") from None
                except ItemMissing as exc:
                    raise ClientError(
                        "item_not_found", f"item with id {str(exc)!r} not found", "item_id"
                    ) from None
        except ClientError as exc:
            return error_response(exc)

    return typed


def _conversation_id(request: Request) -> str:
    return str(request.path_params["conversation_id"])


def _include(request: Request) -> list[str]:
    """``include`` as the SDKs send it: repeated, with or without ``[]``."""
    query = request.query_params
    return [*query.getlist("include"), *query.getlist("include[]")]


def _conversation(stored: StoredConversation) -> conv.Conversation:
    return conv.Conversation(
        id=stored.conversation_id,
        created_at=stored.created_at,
        metadata=_metadata_decoder.decode(stored.metadata_json),
    )


def _json(value: Any) -> Response:
    return Response(_encoder.encode(value), media_type=JSON)
