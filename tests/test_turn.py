"""The turn encoder is the one producer of a turn's token events (``proto.core.turn``): fed the same turn in
any split into "k more tokens", it makes the same events, byte for byte, as fed in one go; ``inside`` says
exactly which calls make deltas alone."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto.core import codec
from proto.core.builder import ResponseBuilder
from proto.core.events import CreateBody
from proto.core.items import WebSearchCall
from proto.core.turn import PlannedItem, TurnEncoder
from sampler.tokens import TextStream, Tokenizer, reasoning_content

TOKENIZER = Tokenizer()
_ITEM_ID = re.compile(rb"\b(?:msg|rs|fc|ctc|ws)_[0-9a-f]{24}\b")
DELTAS = {
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
}

# Texts with characters split over tokens (multi-byte UTF-8), so that a split can fall inside one.
TEXTS = ["hello there, world", "naïve café — ünïcödé", "日本語のテキスト", "emoji 🎉🎉 party", ""]


@st.composite
def turns(draw: st.DrawFn) -> tuple[list[PlannedItem], int]:
    items: list[PlannedItem] = []
    if draw(st.booleans()):
        ids = TOKENIZER.model_tokens("", draw(st.integers(1, 12)))
        items.append(
            PlannedItem(
                "reasoning",
                ids,
                summary=draw(st.sampled_from([None, "Thought."])),
                encrypted=reasoning_content(ids),
            )
        )
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["call", "custom", "web_search"]))
        items.append(
            PlannedItem(
                kind,
                TOKENIZER.model_tokens(draw(st.sampled_from(TEXTS)) or "{}"),
                "tool",
                "call_1",
                query="q",
            )
        )
    items.insert(
        1 if items and items[0].kind == "reasoning" else 0,
        PlannedItem("message", TOKENIZER.model_tokens(draw(st.sampled_from(TEXTS)))),
    )
    total = sum(len(item.ids) for item in items)
    room = draw(st.integers(0, total + 2))  # sometimes cut short: the last item the room reaches ends there
    return items, room


def encode(
    items: list[PlannedItem], room: int, splits: list[int], coalesce: bool = False
) -> tuple[list[bytes], TurnEncoder]:
    builder = ResponseBuilder("resp_turn", CreateBody(model="m"), "longlived")
    turn = TurnEncoder(builder, items, room, TextStream(TOKENIZER), coalesce)
    frames: list[bytes] = []
    ids: dict[bytes, bytes] = {}
    splits = iter(splits)
    while turn.sent < len(turn.ids):
        k = max(1, next(splits, len(turn.ids)))
        frames.extend(
            _ITEM_ID.sub(lambda m: ids.setdefault(m.group(), b"id%d" % len(ids)), codec.encode(e))
            for e in turn.advance(k)
        )
    return frames, turn


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns(), st.lists(st.integers(1, 6), max_size=80))
def test_any_split_gives_the_events_of_one_split(
    turn: tuple[list[PlannedItem], int], splits: list[int]
) -> None:
    items, room = turn
    whole, one = encode(items, room, [])
    split, other = encode(items, room, splits)
    assert split == whole
    assert [(type(item), ids) for item, ids in one.outputs()] == [
        (type(item), ids) for item, ids in other.outputs()
    ]
    assert one.truncated == (sum(len(item.ids) for item in items) > room)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(turns(), st.lists(st.integers(1, 6), max_size=80))
def test_inside_is_exactly_what_makes_deltas_alone(
    turn: tuple[list[PlannedItem], int], splits: list[int]
) -> None:
    items, room = turn
    builder = ResponseBuilder("resp_turn", CreateBody(model="m"), "longlived")
    encoder = TurnEncoder(builder, items, room, TextStream(TOKENIZER))
    splits_left = iter(splits)
    while encoder.sent < len(encoder.ids):
        inside = encoder.inside()
        k = max(1, next(splits_left, 1))
        before = len(encoder.outputs())
        events = encoder.advance(k)
        tags = {str(type(e).__struct_config__.tag) for e in events}
        if k <= inside:
            assert tags <= DELTAS and len(encoder.outputs()) == before  # only deltas: what the timer may send
        else:  # an item opens or ends in this call (a web search says nothing at its end: its result follows)
            ended = encoder.outputs()[before:]
            assert tags - DELTAS or any(isinstance(item, WebSearchCall) for item, _ in ended)


def test_coalescing_makes_one_delta_per_item_and_call_with_the_same_text() -> None:
    items = [PlannedItem("message", TOKENIZER.model_tokens("naïve café — ünïcödé and more words"))]
    plain, _ = encode(items, 1000, [3] * 100)
    coalesced, _ = encode(items, 1000, [3] * 100, coalesce=True)

    def deltas(frames: list[bytes]) -> list[str]:
        return [
            event["delta"]
            for event in map(json.loads, frames)
            if event["type"] == "response.output_text.delta"
        ]

    assert len(deltas(coalesced)) <= len(items[0].ids) // 3 + 1 < len(deltas(plain))
    assert "".join(deltas(coalesced)) == "".join(deltas(plain)) == "naïve café — ünïcödé and more words"
