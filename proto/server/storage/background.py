"""The background responses' tables, in the response store's database (docs/protocol.md, "Background
mode"): who runs each background response and whether a cancel was asked for (``background_responses``),
and the events of those created with ``stream: true`` (``background_events``), which
``GET /v1/responses/{id}?stream=true&starting_after=N`` replays and follows.

Their schema is a component of its own (``background``, in ``schema_version``), applied on the store's
database (``ResponseStore.database``) at start-up, so it versions apart from the store's tables. The
functions here run on a store connection, on the store's threads (``ResponseStore.call``), never on the
event loop.

The Response object itself stays in ``responses``: a background response's row is written when it is
queued, again when it starts, and once more when it ends, so ``GET /v1/responses/{id}`` polls it unchanged.

Who is alive: ``owner`` is the ledger owner id of the process running the response (its ledger holds it
alive: on PostgreSQL an advisory lock, on SQLite a ``flock`` on a file named after it), so ``reconcile``
ends the responses of a dead process exactly where the ledger bills them (docs/operations.md, "Billing
guarantees").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from proto.core.events import ResponseIncomplete
from proto.core.response import IncompleteDetails, Response
from proto.server.storage.database import Connection, Migrations, transaction

COMPONENT: Final = "background"
MIGRATIONS: Migrations = (
    (
        """CREATE TABLE IF NOT EXISTS background_responses (
    response_id      TEXT PRIMARY KEY,
    api_key_id       TEXT NOT NULL,
    owner            TEXT NOT NULL,
    stream           {int} NOT NULL,
    cancel_requested {int} NOT NULL DEFAULT 0,
    ended            {int} NOT NULL DEFAULT 0
)""",
        """CREATE TABLE IF NOT EXISTS background_events (
    response_id     TEXT NOT NULL,
    sequence_number {int} NOT NULL,
    type            TEXT NOT NULL,
    event_json      {blob} NOT NULL,
    PRIMARY KEY (response_id, sequence_number)
)""",
        "CREATE INDEX IF NOT EXISTS background_running ON background_responses (owner, ended)",
    ),
)
CRASHED: Final = "server_crashed"  # the reason a dead process's background response ends with (the ledger's)
PAGE: Final = 256  # events one read returns: a follower reads on until it has them all

_response = msgspec.json.Decoder(Response)
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class Control:
    """One background response's row."""

    owner: str
    stream: bool
    cancel_requested: bool
    ended: bool


def insert(response_id: str, api_key_id: str, owner: str, stream: bool) -> Callable[[Connection], None]:
    """The row of a background response being queued (run in the transaction that stores its Response)."""

    def write(db: Connection) -> None:
        db.execute(
            "INSERT INTO background_responses (response_id, api_key_id, owner, stream) VALUES (?, ?, ?, ?)",
            (response_id, api_key_id, owner, int(stream)),
        )

    return write


def control(response_id: str, api_key_id: str) -> Callable[[Connection], Control | None]:
    def read(db: Connection) -> Control | None:
        row = db.execute(
            "SELECT owner, stream, cancel_requested, ended FROM background_responses"
            " WHERE response_id = ? AND api_key_id = ?",
            (response_id, api_key_id),
        ).one()
        return None if row is None else Control(row[0], bool(row[1]), bool(row[2]), bool(row[3]))

    return read


def request_cancel(response_id: str, api_key_id: str) -> Callable[[Connection], bool]:
    """Ask the owner to cancel it; False when it has ended already (nothing to ask)."""

    def write(db: Connection) -> bool:
        return (
            db.execute(
                "UPDATE background_responses SET cancel_requested = 1"
                " WHERE response_id = ? AND api_key_id = ? AND ended = 0",
                (response_id, api_key_id),
            ).rowcount
            > 0
        )

    return write


def cancels_for(owner: str) -> Callable[[Connection], list[str]]:
    """The ids of ``owner``'s running responses someone asked to cancel (the owner's poll)."""

    def read(db: Connection) -> list[str]:
        rows = db.execute(
            "SELECT response_id FROM background_responses"
            " WHERE owner = ? AND ended = 0 AND cancel_requested = 1",
            (owner,),
        ).rows
        return [row[0] for row in rows]

    return read


def append(
    response_id: str, events: list[tuple[int, str, bytes]], ended: bool
) -> Callable[[Connection], None]:
    """Log ``(sequence_number, type, event JSON)`` rows; ``ended``: the last is the terminal event, and the
    row says so in the same transaction (a follower that sees ``ended`` then sees every event)."""

    def write(db: Connection) -> None:
        with transaction(db, write=True):
            if events:
                db.executemany(
                    "INSERT INTO background_events (response_id, sequence_number, type, event_json)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (response_id, sequence_number) DO NOTHING",
                    [(response_id, number, kind, data) for number, kind, data in events],
                )
            if ended:
                db.execute("UPDATE background_responses SET ended = 1 WHERE response_id = ?", (response_id,))

    return write


def delete(response_id: str, api_key_id: str) -> Callable[[Connection], None]:
    """Its row and its log (the Response itself is the store's to delete)."""

    def write(db: Connection) -> None:
        with transaction(db, write=True):
            found = db.execute(
                "DELETE FROM background_responses WHERE response_id = ? AND api_key_id = ?",
                (response_id, api_key_id),
            ).rowcount
            if found:
                db.execute("DELETE FROM background_events WHERE response_id = ?", (response_id,))

    return write


def events_after(
    response_id: str, api_key_id: str, after: int
) -> Callable[[Connection], tuple[bool, list[tuple[int, str, bytes]]] | None]:
    """``(ended, the next events after sequence number `after`)``; ``None``: no such background response
    for this key. ``ended`` is read first: when it is true, the terminal event is among the events read."""

    def read(db: Connection) -> tuple[bool, list[tuple[int, str, bytes]]] | None:
        row = db.execute(
            "SELECT ended FROM background_responses WHERE response_id = ? AND api_key_id = ?",
            (response_id, api_key_id),
        ).one()
        if row is None:
            return None
        rows = db.execute(
            "SELECT sequence_number, type, event_json FROM background_events"
            f" WHERE response_id = ? AND sequence_number > ? ORDER BY sequence_number LIMIT {PAGE}",
            (response_id, after),
        ).rows
        return bool(row[0]), [(int(number), kind, bytes(data)) for number, kind, data in rows]

    return read


def reconcile(
    me: str, dead_owners: Callable[[Connection, Sequence[str], str], list[str]]
) -> Callable[[Connection], list[str]]:
    """End every background response a dead process left running: its stored Response becomes
    ``incomplete`` with reason ``server_crashed`` (what the ledger bills it), a streamed one logs that as
    its terminal event, and its row is ``ended``. ``dead_owners``: the database's. Returns the ids."""

    def write(db: Connection) -> list[str]:
        with transaction(db, write=True, exclusive=True):
            owners = [
                row[0]
                for row in db.execute("SELECT DISTINCT owner FROM background_responses WHERE ended = 0").rows
            ]
            dead = dead_owners(db, owners, me)
            if not dead:
                return []
            marks = ", ".join("?" * len(dead))
            found = db.execute(
                "SELECT b.response_id, b.stream, r.response_json FROM background_responses b"
                " JOIN responses r ON r.response_id = b.response_id"
                f" WHERE b.ended = 0 AND b.owner IN ({marks})",
                dead,
            ).rows
            for response_id, stream, raw in found:
                response = _response.decode(bytes(raw))
                response.status = "incomplete"
                response.incomplete_details = IncompleteDetails(reason=CRASHED)
                data = _encoder.encode(response)
                db.execute(
                    "UPDATE responses SET response_json = ? WHERE response_id = ?", (data, response_id)
                )
                if stream:
                    last = db.execute(
                        "SELECT MAX(sequence_number) FROM background_events WHERE response_id = ?",
                        (response_id,),
                    ).one()
                    number = 0 if last is None or last[0] is None else int(last[0]) + 1
                    event = ResponseIncomplete(response=response, sequence_number=number)
                    db.execute(
                        "INSERT INTO background_events (response_id, sequence_number, type, event_json)"
                        " VALUES (?, ?, ?, ?)",
                        (response_id, number, "response.incomplete", _encoder.encode(event)),
                    )
            db.execute(
                f"UPDATE background_responses SET ended = 1 WHERE ended = 0 AND owner IN ({marks})", dead
            )
        return [row[0] for row in found]

    return write
