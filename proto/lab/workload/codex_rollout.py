"""Codex CLI's own session files (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``) as lab rounds:
docs/lab.md, "Codex session files".

Codex writes one ``RolloutLine`` a line: ``{"timestamp": RFC 3339, "type": session_meta | response_item |
event_msg | turn_context | compacted | …, "payload": {…}}`` (codex-rs/protocol, ``RolloutLine`` and
``RolloutItem``). The rounds are derived as TraceLab derives its round traces from the same files
(uw-syfi/TraceLab, commit 0b8a262, ``scripts/extract_codex_rounds.py``, ``extract_codex_session``), into
the rows of TraceLab's round-trace JSONL, which ``workload/traces.py`` then reads as it reads any such file:

- **One round per model call**: each ``event_msg`` ``token_count`` whose ``info`` carries
  ``last_token_usage`` and ``total_token_usage`` (``EventMsg::TokenCount``, ``TokenUsageInfo``); one whose
  ``total_token_usage`` equals the previous one's is a repeat and is skipped, as is one without ``info``
  (a rate-limit update). ``input_tokens_total`` = ``last_token_usage.input_tokens`` (the prompt, cached part
  included), ``prefix_tokens`` = its ``cached_input_tokens``, ``newly_append_tokens`` = the difference (≥ 0),
  ``output_tokens`` and ``reasoning_output_tokens`` as they are.
- **A round's tools** are the calls recorded since the previous round: ``response_item`` ``function_call``
  and ``custom_tool_call`` (TraceLab's two) and ``local_shell_call`` (older Codex's shell; TraceLab's
  extractor leaves it out), by ``call_id``, emitted at their line's ``timestamp``.
- **A tool's wall time** = its first result's timestamp − its call's: ``function_call_output``,
  ``custom_tool_call_output``, ``exec_command_end`` or ``patch_apply_end``, whichever comes first; its
  ``result_chars`` the length of that result (how the next round's new tokens split between calls). A call
  without a result has no wall time.
- **Sessions**: the file's ``session_meta`` id (``codex:<id>``); a sub-agent's file, which replays its
  parent's history after its own ``session_meta``, gives the replayed rounds to the parent, as TraceLab does.
- **User turns**: a round whose ``turn_id`` (``turn_context``, ``task_started``) differs from the previous
  round's starts one (Codex 0.171 writes no ``user_message`` event for ``codex exec``; the turn id is in
  every version). ``turn_aborted`` closes a turn: calls recorded since the last round belong to a model
  call that reported no usage and are dropped (TraceLab's extractor would give them to the next round).

Only counts and timestamps are read, never the content; an unreadable line or a file without a single
``token_count`` is refused with a :class:`RolloutError` naming the file (and line) and why.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import Any


class RolloutError(ValueError):
    """A Codex session file that cannot be replayed (the message names the file, line and why)."""


SOURCE = (
    "Codex CLI session rollout, rounds derived as TraceLab's scripts/extract_codex_rounds.py does "
    "(UW SyFI Lab, github.com/uw-syfi/TraceLab, commit 0b8a262)"
)
# response_item payload types that are a client-side tool call, and the name when the item carries none
CALLS = {"function_call": "", "custom_tool_call": "", "local_shell_call": "local_shell"}
RESULTS = ("function_call_output", "custom_tool_call_output", "exec_command_end", "patch_apply_end")


def is_rollout(path: Path) -> bool:
    """Whether ``path`` is a Codex rollout file, by its content: its first line is a ``RolloutLine`` (a
    JSON object with a string ``timestamp`` and ``type`` and an object ``payload``)."""
    try:
        with path.open(encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        line = json.loads(first)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return (
        isinstance(line, dict)
        and isinstance(line.get("timestamp"), str)
        and isinstance(line.get("type"), str)
        and isinstance(line.get("payload"), dict)
    )


def describe(path: Path, rows: list[dict[str, Any]]) -> str:
    turns = len({(r["session_id"], r["turn_id"]) for r in rows})
    calls = f"{len(rows)} model call(s), {turns} user turn(s)"
    return f"Codex CLI{_version(path)} session rollout {path.name}: {calls}"


@dataclasses.dataclass
class _Call:
    name: str
    call_id: str
    emitted: str
    result_at: str | None = None
    result_chars: int | None = None

    def row(self, index: int) -> dict[str, Any]:
        return {
            "tool_index": index,
            "tool_name": self.name,
            "tool_call_id": self.call_id,
            "emitted_at": self.emitted,
            "result_at": self.result_at,
            "result_chars": self.result_chars,
            "tool_wall_latency_ms": _delta_ms(self.emitted, self.result_at),
        }


@dataclasses.dataclass
class _State:
    """What the reader carries between lines (TraceLab's ``extract_codex_session`` locals)."""

    file_id: str | None = None
    session_id: str | None = None
    parent_id: str | None = None
    subagent: bool = False
    turn_id: str | None = None
    last_total: str | None = None
    segment: list[_Call] = dataclasses.field(default_factory=list)
    calls: dict[str, _Call] = dataclasses.field(default_factory=dict)
    rounds: dict[str, int] = dataclasses.field(default_factory=dict)

    def meta(self, payload: dict[str, Any]) -> None:
        meta_id = payload.get("id")
        if not isinstance(meta_id, str) or not meta_id:
            return
        if self.file_id is None:
            self.file_id = self.session_id = meta_id
            parent = _get(payload, "source", "subagent", "thread_spawn", "parent_thread_id")
            if isinstance(parent, str) and parent:
                self.parent_id, self.subagent = parent, True
        elif self.subagent and meta_id != self.file_id:
            self.parent_id = meta_id  # the parent's history, replayed after the child's own meta line

    def owner(self, fallback: str) -> str:
        """The session a round belongs to: in a sub-agent's file, turns older than the child (UUIDv7 ids
        sort by time) are the parent's replayed history."""
        if self.subagent and self.file_id is not None:
            if self.turn_id is not None and self.turn_id >= self.file_id:
                return self.file_id
            if self.parent_id is not None:
                return self.parent_id
        return self.session_id or fallback


def derive_rounds(path: Path) -> list[dict[str, Any]]:
    """TraceLab's round-trace rows of one Codex rollout file (the fields the lab reads, counts and timings
    only): ``provider``, ``session_id``, ``round_index``, ``turn_id``, ``input_tokens_total``,
    ``prefix_tokens``, ``newly_append_tokens``, ``output_tokens``, ``reasoning_output_tokens``, ``tools[]``
    (``tool_index``, ``tool_name``, ``tool_call_id``, ``emitted_at``, ``result_at``, ``result_chars``,
    ``tool_wall_latency_ms``)."""
    state = _State()
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                line = json.loads(text)
            except json.JSONDecodeError as e:
                raise RolloutError(f"{where}: not JSON ({e.msg}): not a whole Codex rollout line") from None
            if not isinstance(line, dict) or not isinstance(line.get("payload"), dict):
                raise RolloutError(f"{where}: not a Codex rollout line (an object with a 'payload' object)")
            row = _line(state, line, line["payload"], where, path)
            if row is not None:
                rows.append(row)
    for row in rows:
        row["tools"] = [call.row(i) for i, call in enumerate(row["tools"])]
    if not rows:
        raise RolloutError(
            f"{path.name}: no token_count event with usage (info.last_token_usage): Codex writes one after "
            "each model call, so this session made none, or its Codex did not record them"
        )
    return rows


def _line(
    state: _State, line: dict[str, Any], payload: dict[str, Any], where: str, path: Path
) -> dict[str, Any] | None:
    kind, event, stamp = line.get("type"), payload.get("type"), line.get("timestamp")
    if kind == "session_meta":
        state.meta(payload)
    elif kind == "turn_context" or (kind == "event_msg" and event == "task_started"):
        state.turn_id = payload.get("turn_id") or state.turn_id
    elif kind == "event_msg" and event == "turn_aborted":
        state.segment = []  # their model call reported no usage: no round holds them
    elif kind == "response_item" and event in CALLS:
        call_id = payload.get("call_id") or payload.get("id")
        if isinstance(call_id, str) and call_id not in state.calls and isinstance(stamp, str):
            call = _Call(str(payload.get("name") or CALLS[str(event)]), call_id, stamp)
            state.calls[call_id] = call
            state.segment.append(call)
    elif event in RESULTS and kind in ("response_item", "event_msg"):
        answered = state.calls.get(str(payload.get("call_id")))
        if answered is not None and answered.result_at is None and isinstance(stamp, str):
            answered.result_at, answered.result_chars = stamp, _chars(_result(str(event), payload))
    elif kind == "event_msg" and event == "token_count":
        return _round(state, payload, where, path)
    return None


def _round(state: _State, payload: dict[str, Any], where: str, path: Path) -> dict[str, Any] | None:
    info = payload.get("info")
    if not isinstance(info, dict):
        return None  # a rate-limit update
    last, total = info.get("last_token_usage"), info.get("total_token_usage")
    if not isinstance(last, dict) or not isinstance(total, dict):
        return None
    signature = json.dumps(total, sort_keys=True)
    if signature == state.last_total:
        return None  # the same usage again: not a new model call
    state.last_total = signature
    counts = {}
    for key in ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens"):
        value = last.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise RolloutError(f"{where}: token_count's last_token_usage.{key} is not a count: {value!r}")
        counts[key] = value
    if counts["input_tokens"] == 0:
        raise RolloutError(f"{where}: token_count's last_token_usage.input_tokens is 0 (a call has a prompt)")
    session = f"codex:{state.owner(path.stem)}"
    index = state.rounds.get(session, 0)
    state.rounds[session] = index + 1
    tools, state.segment = state.segment, []
    return {
        "provider": "codex",
        "session_id": session,
        "round_index": index,
        "turn_id": state.turn_id,
        "input_tokens_total": counts["input_tokens"],
        "prefix_tokens": counts["cached_input_tokens"],
        "newly_append_tokens": max(0, counts["input_tokens"] - counts["cached_input_tokens"]),
        "output_tokens": counts["output_tokens"],
        "reasoning_output_tokens": counts["reasoning_output_tokens"],
        "tools": tools,  # the calls themselves until the file is read: a result may come after the round
    }


def _result(event: str, payload: dict[str, Any]) -> Any:
    if event == "exec_command_end":
        return payload.get("aggregated_output")
    if event == "patch_apply_end":
        return (payload.get("stdout") or "") + (payload.get("stderr") or "")
    return payload.get("output")


def _chars(value: Any) -> int:
    """TraceLab's ``content_chars``: a string's length, or the compact JSON's."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _delta_ms(start: str, end: str | None) -> int | None:
    if end is None:
        return None
    try:
        begun = datetime.fromisoformat(start.replace("Z", "+00:00"))
        ended = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    return round((ended - begun).total_seconds() * 1000)


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _version(path: Path) -> str:
    with path.open(encoding="utf-8") as f:
        first = json.loads(next(line for line in f if line.strip()))
    version = _get(first, "payload", "cli_version") if first.get("type") == "session_meta" else None
    return f" {version}" if isinstance(version, str) and version else ""
