"""One turn's events, token by token: the turn encoder. Sans-IO.

The sampling loop plans a turn — its output items and their token ids, cut to the room the turn has — and
the engine says how many of those tokens are due at each wake-up. ``TurnEncoder.advance(k)`` makes the
events for "k more tokens": an item's opening events at its first token, one text delta per token that
completes characters (one per item and call, coalescing), its closing events at its last. It is the only
producer of a turn's token events. Two consumers call it: the sampling loop's task, for what the engine
yields (``sampler.loop``), and the response driver, from the engine's timer, for the tokens inside an item
already open (``proto.server.driver``; docs/architecture.md, "The fast path"). Whichever called, the events
for a turn are the same; with one delta per token (no coalescing) they do not depend on how the tokens were
split into calls either (``tests/test_turn.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from proto.core.builder import (
    CallStream,
    CompactionStream,
    CustomCallStream,
    MessageStream,
    ReasoningStream,
    ResponseBuilder,
)
from proto.core.events import ServerEvent
from proto.core.items import Item, WebSearchCall

ItemKind = Literal["reasoning", "message", "call", "custom", "web_search", "compaction"]


class Detokenizer(Protocol):
    """Token ids → text, incrementally (``sampler.tokens.TextStream``): a character split over two tokens
    is held back until it is whole."""

    def push(self, token: int) -> str: ...

    def flush(self) -> str: ...


@dataclass
class PlannedItem:
    """One output item of a turn, as the model will say it: its kind, its token ids, what it is called."""

    kind: ItemKind
    ids: list[int]
    name: str = ""
    call_id: str = ""
    query: str = ""  # web_search: what it searches for
    namespace: str | None = None
    summary: str | None = None  # reasoning: its summary text, when one is asked for
    encrypted: str | None = (
        None  # reasoning (when ``include`` asks for it), compaction: ``encrypted_content``
    )


_Stream = MessageStream | CallStream | CustomCallStream | ReasoningStream | CompactionStream | WebSearchCall
_TEXT_STREAMS = (MessageStream, CallStream, CustomCallStream)


class TurnEncoder:
    """The events of one turn's output, made as its tokens come due (see the module's docstring).

    ``ids`` is what the engine is asked to decode: every item's tokens, cut to ``room``; ``truncated`` says
    the cut took some. ``sent``: tokens handed over so far (what a turn cut short bills). After the last
    token, ``outputs()`` gives each item the turn produced with its tokens. Calls to ``advance`` must not
    interleave with another encoder's on the same builder (the builder numbers the events)."""

    __slots__ = (
        "_builder",
        "_coalesce",
        "_delta",
        "_end",
        "_first",
        "_held",
        "_key",
        "_last",
        "_n",
        "_produced",
        "_push",
        "_spans",
        "_stream",
        "_text",
        "ids",
        "sent",
        "truncated",
    )

    def __init__(
        self,
        builder: ResponseBuilder,
        items: Sequence[PlannedItem],
        room: int,
        text: Detokenizer,
        coalesce: bool = False,
    ) -> None:
        self._builder = builder
        self._text = text
        self._coalesce = coalesce
        ids = [token for item in items for token in item.ids]
        self.truncated = len(ids) > room  # max_output_tokens, the model's max output, or its context window
        self.ids = ids[:room] if self.truncated else ids
        self._n = len(self.ids)
        self._push = text.push
        self._spans: list[tuple[PlannedItem, int, int]] = []  # (item, its first token's index, its end)
        at = 0
        for item in items:
            self._spans.append((item, at, at + len(item.ids)))
            at += len(item.ids)
        self._produced: list[Item] = []
        self._held: list[str] = []  # coalescing: this call's text of the current item, not yet in a delta
        self.sent = 0
        # The current item: its span's index, first token, end, closing token's end (its end, or the end of
        # what the room leaves), its stream once open, and that stream's ``delta`` when it shows text.
        self._key = -1
        self._first = self._end = self._last = 0
        self._stream: _Stream | None = None
        self._delta: Callable[[str], ServerEvent] | None = None

    def inside(self) -> int:
        """How many of the next tokens fall inside an item already open, none of them its last (nor the
        turn's last): what ``advance`` turns into deltas alone (0: the next token opens or ends an item)."""
        due = self.sent
        left = self._last - 1 - due  # negative once the current item is done
        return left if left > 0 and due != self._first else 0

    def advance(self, k: int) -> tuple[ServerEvent, ...]:
        """The events for the next ``k`` tokens (at most what is left), item by item: an item's opening
        events at its first token, its text's deltas, its closing events at its last token (or the last one
        the room leaves). Coalescing, an item's text in this call becomes one delta."""
        ids, held, push = self.ids, self._held, self._push
        i = self.sent
        stop = i + k
        if stop > self._n:
            stop = self._n
        batch: list[ServerEvent] = []
        while i < stop:  # this call's tokens of one item, then its end if it ends here
            if i >= self._end:
                self._enter(i)
            if i == self._first:
                batch += self._open()
            last = self._last
            j = stop if stop < last else last
            delta = self._delta
            if delta is not None:
                if self._coalesce:
                    held += [piece for token in ids[i:j] if (piece := push(token))]
                else:
                    batch += [delta(piece) for token in ids[i:j] if (piece := push(token))]
            if j == last:  # the item's last token (or the last one the room leaves)
                self._close(batch)
            elif held:
                assert delta is not None
                batch.append(delta("".join(held)))
                held.clear()
            i = j
        self.sent = stop
        return tuple(batch)

    def _enter(self, i: int) -> None:
        """The item token ``i`` belongs to becomes the current one (empty items are skipped: never open)."""
        spans, key = self._spans, self._key + 1
        while spans[key][2] <= i:
            key += 1
        _item, self._first, self._end = spans[key]
        self._key, self._last = key, min(self._end, self._n)
        self._stream = self._delta = None

    def _open(self) -> list[ServerEvent]:
        builder, item = self._builder, self._spans[self._key][0]
        stream: _Stream
        if item.kind == "message":
            stream = builder.message()
        elif item.kind == "call":
            stream = builder.function_call(item.name, item.call_id, item.namespace)
        elif item.kind == "custom":
            stream = builder.custom_call(item.name, item.call_id, item.namespace)
        elif item.kind == "reasoning":
            stream = builder.reasoning(item.summary)
        elif item.kind == "compaction":
            stream = builder.compaction(item.encrypted or "")
        else:
            call, _index, events = builder.web_search(item.query)
            self._stream = call
            return events
        self._stream = stream
        if isinstance(stream, _TEXT_STREAMS):
            self._delta = stream.delta
        return stream.added()

    def _close(self, batch: list[ServerEvent]) -> None:
        stream, delta, held = self._stream, self._delta, self._held
        assert stream is not None
        if delta is not None:
            tail = self._text.flush()
            if tail:
                held.append(tail)
            if held:
                batch.append(delta("".join(held)))
                held.clear()
        if isinstance(stream, WebSearchCall):
            self._produced.append(stream)  # its result comes after the turn (the hosted call runs)
            return
        if isinstance(stream, ReasoningStream):
            self._builder.usage.output_tokens_details.reasoning_tokens += self._last - self._first
            encrypted = self._spans[self._key][0].encrypted
            if encrypted is not None:
                stream.set_encrypted(encrypted)
        batch.extend(stream.done())
        self._produced.append(stream.item)

    def outputs(self) -> list[tuple[Item, list[int]]]:
        """Each item the turn produced (in order, so far), with the token ids it said."""
        ids = self.ids
        return [
            (item, ids[first:end])
            for item, (_planned, first, end) in zip(self._produced, self._spans, strict=False)
        ]
