"""The mock's ``compaction`` items (``POST /v1/responses/compact``), sans-IO: what their
``encrypted_content`` carries and how a returned one is checked.

OpenAI's compaction guide: the compacted window keeps the user's messages as they were and replaces the
rest (the model's messages, tool calls and their outputs, reasoning) by one ``compaction`` item, opaque to
the client, which the client sends back as input as it came. Here that item stands for the history it
replaced (docs/protocol.md, "Compaction"): its ``encrypted_content`` is ``rlc2:`` + base64 of

    segments (u32 LE) · summary token ids (u32 LE each) · BLAKE2b-128 of the above, keyed

``segments`` is how many of the model's sampling segments it replaced (the directive script goes on from
there, as it would have on the whole history) and the ids are the summary the mock model "wrote" (what
the item renders to: exactly that many tokens, the same ids every time, so the prefix cache keeps them).
The digest makes it integrity-checked: an edit or a damaged copy does not verify and is refused with
OpenAI's ``invalid_encrypted_content``. The key is fixed, not a secret (the lab's reasoning items carry
their ids in the clear too): it detects damage and edits, it does not authenticate. Content without the
prefix (another server's, OpenAI's) is accepted and rendered as its JSON, as every item type the lab does
not model is.
"""

from __future__ import annotations

import array
import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

from proto.core.errors import ClientError
from proto.core.items import Compaction, Item

COMPACTION_PREFIX = "rlc2:"
SUMMARY_RATIO = 8  # the summary is one token for every 8 it replaces (at least one)
_KEY = b"responses-lab compaction v2"
_DIGEST = 16
_HEADER = struct.Struct("<I")


@dataclass(frozen=True)
class Compacted:
    """What a verified compaction item stands for."""

    segments: int  # the model's sampling segments it replaced
    summary: list[int]  # the token ids it renders to


def summary_size(replaced_tokens: int) -> int:
    return max(1, replaced_tokens // SUMMARY_RATIO)


def compaction_content(compacted: Compacted) -> str:
    body = _HEADER.pack(compacted.segments) + array.array("I", compacted.summary).tobytes()
    return COMPACTION_PREFIX + base64.b64encode(body + _digest(body)).decode()


def compacted(encrypted: str | None) -> Compacted | None:
    """What the item stands for; None for content that is not the mock's or does not verify."""
    if not encrypted or not encrypted.startswith(COMPACTION_PREFIX):
        return None
    try:
        raw = base64.b64decode(encrypted[len(COMPACTION_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None
    body, digest = raw[:-_DIGEST], raw[-_DIGEST:]
    if len(body) < _HEADER.size + 4 or (len(body) - _HEADER.size) % 4 or digest != _digest(body):
        return None
    ids = array.array("I")
    ids.frombytes(body[_HEADER.size :])
    return Compacted(segments=_HEADER.unpack_from(body)[0], summary=ids.tolist())


def check_compactions(items: list[Item], path: str) -> None:
    """Every ``compaction`` item in an input that says it is the mock's verifies; OpenAI's error
    otherwise (its message quotes the content's ends)."""
    for index, item in enumerate(items):
        content = item.encrypted_content if isinstance(item, Compaction) else None
        if content is not None and content.startswith(COMPACTION_PREFIX) and compacted(content) is None:
            raise ClientError(
                "invalid_encrypted_content",
                f"The encrypted content {content[:4]}...{content[-4:]} could not be verified.",
                f"{path}[{index}].encrypted_content",
            )


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, key=_KEY, digest_size=_DIGEST).digest()
