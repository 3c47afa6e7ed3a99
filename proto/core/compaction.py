"""The mock's ``compaction`` items (``POST /v1/responses/compact``), sans-IO: what their
``encrypted_content`` carries and how a returned one is checked.

OpenAI's compaction guide: the compacted window keeps the user's messages as they were and replaces the
rest (the model's messages, tool calls and their outputs, reasoning) by one ``compaction`` item, opaque to
the client, which the client sends back as input as it came. Here that item carries the token ids of the
summary the mock model "wrote" (base64, as the mock's reasoning items do: not a secret), so the rendering
puts exactly that many tokens into the context. An item that claims to be the mock's (its prefix) but does
not decode is refused with ``invalid_encrypted_content``; any other (another server's, OpenAI's) is
accepted and rendered as its JSON, as every item type the lab does not model is.
"""

from __future__ import annotations

import array
import base64
import binascii

from proto.core.errors import ClientError
from proto.core.items import Compaction, Item

COMPACTION_PREFIX = "rlc1:"
SUMMARY_RATIO = 8  # the summary is one token for every 8 it replaces (at least one)


def summary_size(replaced_tokens: int) -> int:
    return max(1, replaced_tokens // SUMMARY_RATIO)


def compaction_content(ids: list[int]) -> str:
    return COMPACTION_PREFIX + base64.b64encode(array.array("I", ids).tobytes()).decode()


def compaction_ids(encrypted: str | None) -> list[int] | None:
    """The summary's token ids; None for content that is not the mock's."""
    if not encrypted or not encrypted.startswith(COMPACTION_PREFIX):
        return None
    try:
        raw = base64.b64decode(encrypted[len(COMPACTION_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw or len(raw) % 4:
        return None
    ids = array.array("I")
    ids.frombytes(raw)
    return ids.tolist()


def check_compactions(items: list[Item], path: str) -> None:
    """Every ``compaction`` item in an input that says it is the mock's decodes."""
    for index, item in enumerate(items):
        content = item.encrypted_content if isinstance(item, Compaction) else None
        if content is not None and content.startswith(COMPACTION_PREFIX) and compaction_ids(content) is None:
            raise ClientError(
                "invalid_encrypted_content",
                "the compaction item's encrypted_content is damaged "
                "(POST /v1/responses/compact makes it; send it back as it came)",
                f"{path}[{index}].encrypted_content",
            )
