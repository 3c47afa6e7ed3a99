"""``POST /v1/responses/compact``: a conversation's window, compacted (``proto/core/compaction.py`` says
what the compaction item carries).

The window is the request's items after its stored chain (``previous_response_id``). User messages are
kept as they were (with ids, ``completed``); everything else — the model's messages, tool calls and
outputs, reasoning, earlier compaction items — becomes one ``compaction`` item that stands for them: the
model's sampling segments they held, and a summary of ``summary_size`` tokens of what they rendered to.
Usage: the whole window's rendered tokens in (instructions included), the summary's out.
"""

from __future__ import annotations

import time

import msgspec

from proto.core.actions import new_response_id
from proto.core.builder import new_item_id
from proto.core.compaction import Compacted, compaction_content, summary_size
from proto.core.items import Compaction, InputText, Item, Message
from proto.core.response import CompactResource, Usage
from proto.core.work import WorkCounters
from sampler.position import count_segments
from sampler.tokens import Conversation, Tokenizer


def compact_window(
    tokenizer: Tokenizer, instructions: str | None, items: list[Item], work: WorkCounters
) -> CompactResource:
    whole = Conversation(tokenizer, work)
    if instructions:
        whole.add_instructions(instructions)
    whole.add_input(items)
    kept = [_kept(item) for item in items if isinstance(item, Message) and item.role == "user"]
    rest = [item for item in items if not (isinstance(item, Message) and item.role == "user")]
    replaced = Conversation(tokenizer, work)
    replaced.add_input(rest)
    summary = tokenizer.model_tokens("", summary_size(len(replaced.log)))
    content = compaction_content(Compacted(segments=count_segments(items), summary=summary))
    compaction = Compaction(id=new_item_id("cmp"), encrypted_content=content)
    usage = Usage(
        input_tokens=len(whole.log), output_tokens=len(summary), total_tokens=len(whole.log) + len(summary)
    )
    return CompactResource(
        id=new_response_id(), created_at=int(time.time()), output=[*kept, compaction], usage=usage
    )


def _kept(message: Message) -> Message:
    content = [InputText(text=message.content)] if isinstance(message.content, str) else list(message.content)
    return msgspec.structs.replace(
        message, id=message.id or new_item_id("msg"), status="completed", content=content
    )
