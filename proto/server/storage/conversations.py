"""Conversations in the response store's database, on the store's own threads (``ResponseStore.run``):
SQLite or PostgreSQL alike, never SQL on the event loop (docs/protocol.md, "Conversations").

Two tables of their own (component ``conversations`` in ``schema_version``): a conversation row (its key,
creation time, metadata, and the position its next item takes) and its items, in order by position.
Isolation is the store's: every call is keyed by ``(conversation_id, api_key_id)``, so another key's
conversation is simply not found (``ConversationMissing``), exactly like a missing one.

Every write is one transaction: a create writes the conversation and all its items or nothing; an append
takes the conversation's row first (``UPDATE … next_position``: PostgreSQL's row lock, SQLite's write lock),
so two appends to one conversation never interleave their items or reuse a position; a delete removes the
conversation and its items together. Reads that take two statements run in one read transaction (one
snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proto.server.storage.database import Connection, Migrations, transaction
from proto.server.storage.store import ResponseStore

MIGRATIONS: Migrations = (
    (
        """CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    api_key_id      TEXT NOT NULL,
    created_at      {int} NOT NULL,
    metadata_json   {blob} NOT NULL,
    next_position   {int} NOT NULL
)""",
        """CREATE TABLE IF NOT EXISTS conversation_items (
    conversation_id TEXT NOT NULL,
    position        {int} NOT NULL,
    item_id         TEXT NOT NULL,
    item_json       {blob} NOT NULL,
    PRIMARY KEY (conversation_id, position)
)""",
        "CREATE INDEX IF NOT EXISTS conversation_items_by_id"
        " ON conversation_items (conversation_id, item_id)",
    ),
)
_OWNED = "SELECT created_at, metadata_json FROM conversations WHERE conversation_id = ? AND api_key_id = ?"
_PUT_ITEM = (
    "INSERT INTO conversation_items (conversation_id, position, item_id, item_json) VALUES (?, ?, ?, ?)"
)


class ConversationMissing(Exception):
    """No such conversation for this key (missing, deleted, or another key's)."""


class ItemMissing(Exception):
    """The conversation has no item with this id."""


@dataclass(frozen=True)
class StoredConversation:
    conversation_id: str
    created_at: int
    metadata_json: bytes


class ConversationStore:
    """The Conversations API's storage; its calls raise ``ConversationMissing`` / ``ItemMissing`` for ids
    this key cannot see, and the store's ``StoreUnavailable`` on a database fault (nothing written)."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store
        store.migrate("conversations", MIGRATIONS)

    async def create(
        self,
        conversation_id: str,
        api_key_id: str,
        created_at: int,
        metadata_json: bytes,
        items: list[tuple[str, bytes]],
    ) -> None:
        """The conversation and its first items (id, JSON), in order, in one transaction."""

        def write(db: Connection) -> None:
            with transaction(db, write=True):
                db.execute(
                    "INSERT INTO conversations (conversation_id, api_key_id, created_at, metadata_json,"
                    " next_position) VALUES (?, ?, ?, ?, ?)",
                    (conversation_id, api_key_id, created_at, metadata_json, len(items)),
                )
                _put_items(db, conversation_id, 0, items)

        await self.store.run("conversation_create", write, write=True)

    async def get(self, conversation_id: str, api_key_id: str) -> StoredConversation:
        def read(db: Connection) -> StoredConversation:
            return _owned(db, conversation_id, api_key_id)

        return await self.store.run("conversation_get", read, write=False)

    async def update(self, conversation_id: str, api_key_id: str, metadata_json: bytes) -> StoredConversation:
        """Replace the metadata; the conversation as it is now."""

        def write(db: Connection) -> StoredConversation:
            with transaction(db, write=True):
                db.execute(
                    "UPDATE conversations SET metadata_json = ? WHERE conversation_id = ? AND api_key_id = ?",
                    (metadata_json, conversation_id, api_key_id),
                )
                return _owned(db, conversation_id, api_key_id)

        return await self.store.run("conversation_update", write, write=True)

    async def delete(self, conversation_id: str, api_key_id: str) -> None:
        """The conversation and every item of it."""

        def write(db: Connection) -> None:
            with transaction(db, write=True):
                gone = db.execute(
                    "DELETE FROM conversations WHERE conversation_id = ? AND api_key_id = ?",
                    (conversation_id, api_key_id),
                ).rowcount
                if gone == 0:
                    raise ConversationMissing(conversation_id)
                db.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (conversation_id,))

        await self.store.run("conversation_delete", write, write=True)

    async def append(self, conversation_id: str, api_key_id: str, items: list[tuple[str, bytes]]) -> None:
        """Items (id, JSON) after the conversation's last, in order, in one transaction."""

        def write(db: Connection) -> None:
            with transaction(db, write=True):
                taken = db.execute(  # the row lock first: appends to one conversation run one at a time
                    "UPDATE conversations SET next_position = next_position + ?"
                    " WHERE conversation_id = ? AND api_key_id = ?",
                    (len(items), conversation_id, api_key_id),
                ).rowcount
                if taken == 0:
                    raise ConversationMissing(conversation_id)
                row = db.execute(
                    "SELECT next_position FROM conversations WHERE conversation_id = ?", (conversation_id,)
                ).one()
                assert row is not None
                _put_items(db, conversation_id, int(row[0]) - len(items), items)

        await self.store.run("conversation_append", write, write=True)

    async def items(self, conversation_id: str, api_key_id: str) -> list[bytes]:
        """Every item, oldest first (a response's context)."""

        def read(db: Connection) -> list[bytes]:
            with transaction(db, write=False):
                _owned(db, conversation_id, api_key_id)
                rows = db.execute(
                    "SELECT item_json FROM conversation_items WHERE conversation_id = ? ORDER BY position",
                    (conversation_id,),
                ).rows
            return [bytes(row[0]) for row in rows]

        return await self.store.run("conversation_items", read, write=False)

    async def item_ids(self, conversation_id: str, api_key_id: str) -> set[str]:
        """The ids of its items (what a new item's id must not be), without reading the items."""

        def read(db: Connection) -> set[str]:
            with transaction(db, write=False):
                _owned(db, conversation_id, api_key_id)
                rows = db.execute(
                    "SELECT item_id FROM conversation_items WHERE conversation_id = ? AND item_id <> ''",
                    (conversation_id,),
                ).rows
            return {str(row[0]) for row in rows}

        return await self.store.run("conversation_item_ids", read, write=False)

    async def page(
        self, conversation_id: str, api_key_id: str, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[bytes], bool]:
        """Up to ``limit`` items after the item ``after`` in this order, and whether more follow. An
        ``after`` the conversation does not hold gives an empty page (as ``input_items`` does)."""

        def read(db: Connection) -> tuple[list[bytes], bool]:
            with transaction(db, write=False):
                _owned(db, conversation_id, api_key_id)
                start: Any = -1 if ascending else 2**62
                if after is not None:
                    found = db.execute(
                        "SELECT MIN(position) FROM conversation_items"
                        " WHERE conversation_id = ? AND item_id = ?",
                        (conversation_id, after),
                    ).one()
                    if found is None or found[0] is None:
                        return [], False
                    start = int(found[0])
                rows = db.execute(
                    "SELECT item_json FROM conversation_items WHERE conversation_id = ?"
                    + (
                        " AND position > ? ORDER BY position ASC"
                        if ascending
                        else " AND position < ? ORDER BY position DESC"
                    )
                    + " LIMIT ?",
                    (conversation_id, start, limit + 1),
                ).rows
            return [bytes(row[0]) for row in rows[:limit]], len(rows) > limit

        return await self.store.run("conversation_page", read, write=False)

    async def item(self, conversation_id: str, api_key_id: str, item_id: str) -> bytes:
        def read(db: Connection) -> bytes:
            with transaction(db, write=False):
                _owned(db, conversation_id, api_key_id)
                row = db.execute(
                    "SELECT item_json FROM conversation_items WHERE conversation_id = ? AND item_id = ?"
                    " ORDER BY position LIMIT 1",
                    (conversation_id, item_id),
                ).one()
            if row is None:
                raise ItemMissing(item_id)
            return bytes(row[0])

        return await self.store.run("conversation_item", read, write=False)

    async def delete_item(self, conversation_id: str, api_key_id: str, item_id: str) -> StoredConversation:
        """Remove the item; the conversation it was removed from."""

        def write(db: Connection) -> StoredConversation:
            with transaction(db, write=True):
                owner = _owned(db, conversation_id, api_key_id)
                gone = db.execute(
                    "DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                    (conversation_id, item_id),
                ).rowcount
                if gone == 0:
                    raise ItemMissing(item_id)
                return owner

        return await self.store.run("conversation_delete_item", write, write=True)


def _owned(db: Connection, conversation_id: str, api_key_id: str) -> StoredConversation:
    row = db.execute(_OWNED, (conversation_id, api_key_id)).one()
    if row is None:
        raise ConversationMissing(conversation_id)
    return StoredConversation(conversation_id, int(row[0]), bytes(row[1]))


def _put_items(db: Connection, conversation_id: str, first: int, items: list[tuple[str, bytes]]) -> None:
    db.executemany(
        _PUT_ITEM,
        [(conversation_id, first + index, item_id, body) for index, (item_id, body) in enumerate(items)],
    )
