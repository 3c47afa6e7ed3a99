"""The script's position: which turn of the conversation a request samples next (docs/protocol.md, "The
directive script", its paragraph on the position).

A client re-sends the history it keeps, and not every client keeps all of it: one drops the hosted
``web_search_call`` items it cannot replay, another drops reasoning or every id. Counting the model's
turns in that history would fall short and replay a script line whose calls were already answered. So
the position is anchored on the script's own calls:

* the history's sampling **segments** are counted as the long-lived loop counts turns: a run of the
  model's own items (messages, calls, reasoning) is one, and a hosted call's inline result closes one;
* the history's calls (name and arguments; a ``web_search_call`` by its query) are matched in order
  against the script's calls, each script call used once, a segment's calls only against the line the
  position so far gives that segment or a later one (a call the script did not write — a generated
  one, the tool rule's — matches nothing and is passed over);
* the **anchor** is the last call matched: the position is the line after the anchor's, plus the
  segments the history holds after the anchor's segment (messages the model said since).

The position is never behind the segment count. A faithful history gives the count exactly (its k-th
segment played the script's k-th line); so does a history without any scripted call. The same items
give the same position in every transport, so a rollout still replays identically over HTTP, GA
WebSocket and the long-lived protocol.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass

from proto.core.compaction import compacted
from proto.core.items import (
    CALL_ITEMS,
    HOSTED_TOOL_NAMES,
    Compaction,
    CustomToolCall,
    Item,
    Message,
    Reasoning,
    WebSearchAction,
    WebSearchCall,
)
from sampler.policy import CACHED_SCRIPT_CHARS, script_plans
from sampler.tools import query_of

_HOSTED = "\x00hosted"  # the key name of a hosted search: matched by its query, whatever the tool's name


def _canonical(arguments: str) -> str:
    """Arguments compared as JSON values (a client may re-serialize them), else as written."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: the text itself
        return arguments


@dataclass(frozen=True)
class _ScriptCalls:
    lines: tuple[int, ...]  # the script call at each index: its line (turn) number
    raw: tuple[str, ...]  # its arguments as the script wrote them (a hosted search: its query)
    canonical: tuple[str, ...]  # the same, canonical JSON (custom input and query: as written)
    by_name: dict[str, tuple[int, ...]]  # name (hosted searches: _HOSTED) → its calls' indexes, rising


def _script_calls(script: str, parallel: bool) -> _ScriptCalls | None:
    if len(script) <= CACHED_SCRIPT_CHARS:
        return _cached_script_calls(script, parallel)
    return _parse_script_calls(script, parallel)


@functools.lru_cache(maxsize=64)
def _cached_script_calls(script: str, parallel: bool) -> _ScriptCalls | None:
    return _parse_script_calls(script, parallel)


def _parse_script_calls(script: str, parallel: bool) -> _ScriptCalls | None:
    """The script's calls in order, each with its line: the turns ``ScriptPolicy`` plays (a line of
    parallel calls is that many turns under ``parallel_tool_calls: false``)."""
    plans = script_plans(script, parallel)
    if plans is None:
        return None
    lines: list[int] = []
    raw: list[str] = []
    canonical: list[str] = []
    by_name: dict[str, list[int]] = {}

    def add(line: int, name: str, written: str, compared: str) -> None:
        by_name.setdefault(name, []).append(len(lines))
        lines.append(line)
        raw.append(written)
        canonical.append(compared)

    for line, plan in enumerate(plans):
        for call in plan.calls:
            add(
                line, call.name, call.arguments, call.arguments if call.custom else _canonical(call.arguments)
            )
            if call.name in HOSTED_TOOL_NAMES:  # hosted, unless a function tool of that name is offered
                query = query_of(call.arguments)
                add(line, _HOSTED, query, query)
    return _ScriptCalls(
        tuple(lines), tuple(raw), tuple(canonical), {name: tuple(ix) for name, ix in by_name.items()}
    )


def _call_key(item: Item) -> tuple[str, str, str | None] | None:
    """(name, arguments as sent, canonical arguments or None: parse when needed) of one of the model's
    calls in the history; a hosted search is (_HOSTED, its query)."""
    if isinstance(item, CustomToolCall):
        return item.name, item.input, item.input
    if isinstance(item, CALL_ITEMS):
        return item.name, item.arguments, None
    if isinstance(item, WebSearchCall) and isinstance(item.action, WebSearchAction):
        query = item.action.query or " ".join(item.action.queries or ())
        return _HOSTED, query, query
    return None


def _match(calls: _ScriptCalls, start: int, key: tuple[str, str, str | None]) -> int | None:
    """The first script call at or after ``start`` that ``key`` is (same name and arguments). The
    arguments are parsed only when their text differs from the script's (a client that re-serialized)."""
    name, sent, canonical = key
    indexes = calls.by_name.get(name, ())
    for ix in indexes[bisect.bisect_left(indexes, start) :]:
        if calls.raw[ix] == sent:
            return ix
        if canonical is None:
            canonical = _canonical(sent)
        if calls.canonical[ix] == canonical:
            return ix
    return None


_MODEL_ITEMS = (*CALL_ITEMS, WebSearchCall, Reasoning)  # besides the assistant's messages


def _own(item: Item) -> bool:
    return isinstance(item, _MODEL_ITEMS) or (isinstance(item, Message) and item.role == "assistant")


def count_segments(items: Sequence[Item]) -> int:
    """How many sampling segments a history holds, counted as the long-lived loop counts turns: a run
    of the model's own items is one segment, and a hosted call's inline result closes one; a compaction
    item stands for every segment before it."""
    return script_position(items, "")


def script_position(
    items: Sequence[Item], script: str, parallel: bool = True, async_names: frozenset[str] = frozenset()
) -> int:
    """The turn a request whose conversation is ``items`` samples next (the module's rule): the segment
    count, anchored on the last of the script's calls the history holds; never behind the count. A call of
    an ``async`` tool (``async_names``) closes its segment as a hosted call does: the model went on without
    its output, in a turn of its own."""
    calls = _script_calls(script, parallel) if script else None
    segments = 0
    inside = False
    anchor_line = -1  # the line of the last script call matched
    anchor_segments = 0  # the segments up to and including the anchor's
    earliest = 0  # the first script call this segment's calls may be: the segment's own line or later
    for item in items:
        if isinstance(item, Compaction) and (known := compacted(item.encrypted_content)) is not None:
            # It stands for every segment before it, its calls among them (docs/protocol.md, "Compaction").
            segments, inside, anchor_line, anchor_segments = known.segments, False, -1, 0
            earliest = bisect.bisect_left(calls.lines, segments) if calls is not None else 0
            continue
        if not _own(item):
            inside = False
            continue
        if not inside:
            # A new segment: it plays the line the position so far points at, or a later one.
            if calls is not None:
                line = segments if anchor_line < 0 else anchor_line + 1 + segments - anchor_segments
                earliest = max(earliest, bisect.bisect_left(calls.lines, line))
            segments += 1
        inside = not isinstance(item, WebSearchCall) and not (
            isinstance(item, CALL_ITEMS) and item.name in async_names
        )
        if calls is None:
            continue
        key = _call_key(item)
        if key is not None and (ix := _match(calls, earliest, key)) is not None:
            earliest = ix + 1
            anchor_line, anchor_segments = calls.lines[ix], segments
    if anchor_line < 0:
        return segments
    return anchor_line + 1 + segments - anchor_segments
