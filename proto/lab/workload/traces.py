"""What the lab replays, as rounds: a synthetic workload (``sampler/workloads/*.json``) or a TraceLab trace
(round-trace CSV or JSONL: docs/lab.md, "Trace replay"), read as they are.

A :class:`Replay` is a set of :class:`Session` s, each an ordered list of :class:`Round` s (one LLM call
each). A round fixes what the server must see and say: its prompt tokens (``input_tokens``), how much of
the previous context it keeps (``keep``), its output tokens, the tools it calls, and the client's wait after
it. ``proto/lab/workload/plan.py`` turns a session into the exact requests of every transport.

TraceLab's semantics (its replayer, ``replay/README.md`` and ``src/session.rs`` at uw-syfi/TraceLab):
``prefix_len`` is the number of prior context tokens kept for the round, ``input_len`` the new tokens
appended, ``output_len`` the decode length, ``tool_wait_after_ms`` the sleep before the next round of the
same session, ``arrival_time`` (ms) the session's start. So a CSV round's prompt is ``prefix_len +
input_len``, and a round keeping less than the previous round's prompt plus its output is a **history
rewrite** (compaction, truncation): ``keep`` < previous prompt + previous output.

A JSONL round gives ``input_tokens_total`` (its prompt), ``output_tokens``, and ``tools[]``; its
``prefix_tokens`` is the provider's cache read (Claude's ``cache_read_input_tokens``), not the history the
client kept, so a JSONL round is a rewrite only when its total is below the previous total plus output.
Its tool time is the slowest of its calls' ``tool_wall_latency_ms`` (the lab runs a round's calls in
parallel after the round, as agents run independent tools); a round without tools ends with the model's
message and the next round starts with a user message, after no wait (the user's own think time is not a
tool's and is left out). The next round's appended tokens are split between a round's calls in proportion
to their ``result_chars``.

CSV rounds name no tools: every round but a session's last calls one tool, ``tool``. A session's last
round is always a final message (the trace ends there).
"""

from __future__ import annotations

import csv
import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

from proto.core.limits import tool_name
from proto.lab.workload import codex_rollout
from sampler.policy import WORKLOADS, PlannedCall, Workload, load_workload, workload_names

TRACELAB = WORKLOADS / "tracelab"
TRACELAB_SOURCE = (
    "TraceLab (UW SyFI Lab, github.com/uw-syfi/TraceLab, commit 0b8a262): examples Apache-2.0, "
    "dataset CC BY 4.0"
)


class TraceError(ValueError):
    """A workload file that cannot be replayed as it is (the message names the file, line and field)."""


@dataclass(frozen=True)
class Round:
    output_tokens: int
    calls: tuple[PlannedCall, ...]  # () -> the model answers with a message
    tool_wait_s: float  # after this round's response, before the next round's request
    input_tokens: int | None = None  # the prompt the server must count (traces); None: from the sizes below
    keep: int | None = None  # CSV: the context is cut after this many tokens (``prefix_len``); None: no cut
    # The provider's cached prefix (JSONL ``prefix_tokens``): a lower bound on the prompt's tokens kept
    # unchanged from the previous context, which a history rewrite must respect; None: no evidence.
    cached_tokens: int | None = None
    result_weights: tuple[float, ...] = ()  # how the next round's new tokens split between this round's calls
    result_tokens: tuple[int, ...] = ()  # synthetic: each call's output body, in tokens (exact)
    text: str = ""  # a message round's text (padded to output_tokens)


@dataclass(frozen=True)
class Session:
    name: str
    arrival_s: float
    rounds: tuple[Round, ...]
    first_tokens: int | None = (
        None  # synthetic: the first message's body tokens (traces: rounds[0].input_tokens)
    )
    drawn: bool = False  # its tool times are one draw of a distribution, drawn again per rollout seed


@dataclass(frozen=True)
class Replay:
    name: str
    description: str
    sessions: tuple[Session, ...]
    trace: bool  # True: the sessions are the trace's own, at their arrival times; False: --sessions copies
    source: str = ""

    @property
    def rounds(self) -> int:
        return sum(len(s.rounds) for s in self.sessions)

    def shortened(self, turns: int | None) -> Replay:
        """Synthetic workloads only: the first ``turns - 1`` tool rounds, then a final message (a quicker
        rollout over the same sizes). A trace is replayed as it is."""
        if turns is None or self.trace:
            return self
        sessions = tuple(_shorten(s, turns) for s in self.sessions)
        if all(len(a.rounds) == len(b.rounds) for a, b in zip(sessions, self.sessions, strict=True)):
            return self
        return Replay(f"{self.name}[:{turns}]", self.description, sessions, self.trace, self.source)


def _shorten(s: Session, turns: int) -> Session:
    if turns >= len(s.rounds):
        return s
    kept = (*s.rounds[: max(turns - 1, 0)], Round(20, (), 0.0, text="Stopping here (shortened run)."))
    return Session(s.name, s.arrival_s, kept, s.first_tokens, s.drawn)


# ---- synthetic workloads --------------------------------------------------------------------------


def from_workload(w: Workload) -> Replay:
    rounds = []
    for t in w.turns:
        if t.calls:
            tokens = t.tool_output_tokens or 0
            rounds.append(
                Round(
                    t.output_tokens or 0,
                    t.calls,
                    t.client_tool_time_s or 0.0,
                    result_tokens=tuple(tokens for _ in t.calls),
                )
            )
        else:
            rounds.append(Round(t.output_tokens or 0, (), 0.0, text=t.text))
    drawn = w.tool_times == "tracelab"
    session = Session(w.name, 0.0, tuple(rounds), first_tokens=w.first_user_tokens, drawn=drawn)
    return Replay(w.name, w.description, (session,), trace=False)


# ---- TraceLab -------------------------------------------------------------------------------------


TOOL = PlannedCall("tool", "{}")  # a CSV round's one call: the trace names no tools


def _number(row: dict[str, str], key: str, where: str, default: float | None = None) -> float:
    raw = (row.get(key) or "").strip()
    if not raw:
        if default is not None:
            return default
        raise TraceError(f"{where}: missing {key!r}")
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{where}: {key!r} is not a number: {raw!r}") from None
    if value < 0:
        raise TraceError(f"{where}: {key!r} is negative: {raw!r}")
    return value


def read_csv(path: Path) -> Replay:
    """A TraceLab round-trace CSV (both of its header forms: ``session_id`` or the simulator's ``id``)."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by_session: dict[str, list[tuple[int, float, dict[str, str], str]]] = {}
    for line, row in enumerate(rows, 2):
        where = f"{path.name}:{line}"
        sid = (row.get("session_id") or row.get("id") or "").strip()
        if not sid:
            raise TraceError(f"{where}: no session_id")
        by_session.setdefault(sid, []).append(
            (int(_number(row, "round_idx", where)), _number(row, "arrival_time", where, 0.0), row, where)
        )
    sessions = []
    for sid, entries in by_session.items():
        entries.sort(key=lambda e: e[0])
        rounds = []
        for i, (_, _, row, where) in enumerate(entries):
            prefix, added = int(_number(row, "prefix_len", where)), int(_number(row, "input_len", where))
            last = i == len(entries) - 1
            rounds.append(
                Round(
                    output_tokens=int(_number(row, "output_len", where)),
                    calls=() if last else (TOOL,),
                    tool_wait_s=0.0 if last else _number(row, "tool_wait_after_ms", where, 0.0) / 1e3,
                    input_tokens=prefix + added,
                    keep=prefix,
                    result_weights=() if last else (1.0,),
                )
            )
        sessions.append(Session(f"{path.stem}#{sid}", min(e[1] for e in entries) / 1e3, tuple(rounds)))
    if not sessions:
        raise TraceError(f"{path.name}: no rounds")
    sessions.sort(key=lambda s: s.arrival_s)
    return Replay(
        path.stem,
        f"TraceLab round trace {path.name}: {len(sessions)} sessions, {len(rows)} rounds",
        tuple(sessions),
        trace=True,
        source=TRACELAB_SOURCE,
    )


def read_jsonl(path: Path) -> Replay:
    """A TraceLab round-trace JSONL: one LLM call a line."""
    rows: list[tuple[object, str]] = []
    for line, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        where = f"{path.name}:{line}"
        try:
            rows.append((json.loads(text), where))
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not JSON: {e.msg}") from None
    return _rounds(path, rows)


def _rounds(path: Path, rows: list[tuple[object, str]]) -> Replay:
    """The replay of round-trace rows (each with where it comes from, for its errors)."""
    by_session: dict[str, list[tuple[int, dict[str, object], str]]] = {}
    for row, where in rows:
        if not isinstance(row, dict):
            raise TraceError(f"{where}: a line must be a JSON object")
        for key in ("session_id", "round_index", "input_tokens_total", "output_tokens"):
            if key not in row:
                raise TraceError(f"{where}: missing {key!r}")
        by_session.setdefault(str(row["session_id"]), []).append((int(row["round_index"]), row, where))
    sessions = []
    for sid, entries in by_session.items():
        entries.sort(key=lambda e: e[0])
        rounds = []
        for i, (_, row, where) in enumerate(entries):
            tools = row.get("tools") or []
            if not isinstance(tools, list):
                raise TraceError(f"{where}: 'tools' must be a list")
            last = i == len(entries) - 1
            calls = () if last else tuple(PlannedCall(_tool_name(t, where), "{}") for t in tools)
            waits = [float(t.get("tool_wall_latency_ms") or 0.0) for t in tools if isinstance(t, dict)]
            weights = tuple(
                max(float(t.get("result_chars") or 0.0), 1.0) for t in tools if isinstance(t, dict)
            )
            rounds.append(
                Round(
                    output_tokens=int(row["output_tokens"]),  # type: ignore[call-overload]
                    calls=calls,
                    tool_wait_s=(max(waits) / 1e3 if waits and calls else 0.0),
                    input_tokens=int(row["input_tokens_total"]),  # type: ignore[call-overload]
                    cached_tokens=_count(row, "prefix_tokens", where),
                    result_weights=weights if calls else (),
                )
            )
        sessions.append(Session(f"{path.stem}#{sid}", 0.0, tuple(rounds)))
    if not sessions:
        raise TraceError(f"{path.name}: no rounds")
    return Replay(
        path.stem,
        f"TraceLab round trace {path.name}: {len(sessions)} session(s), "
        f"{sum(len(s.rounds) for s in sessions)} rounds",
        tuple(sessions),
        trace=True,
        source=TRACELAB_SOURCE,
    )


def _count(row: dict[str, object], key: str, where: str) -> int | None:
    """An optional whole, non-negative token count (absent or null: None)."""
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TraceError(f"{where}: {key!r} must be a whole number of tokens, not {value!r}")
    return value


def _tool_name(tool: object, where: str) -> str:
    if not isinstance(tool, dict) or not isinstance(tool.get("tool_name"), str) or not tool["tool_name"]:
        raise TraceError(f"{where}: every tool needs a 'tool_name'")
    name = str(tool["tool_name"])
    if name == "web_search":  # the hosted tool's name: the trace's tool ran on the client
        name = "web_search_local"
    # A name the Responses API would refuse (an MCP tool's ``server.tool``) renamed as Codex renames it.
    return tool_name(name)


def read_codex(path: Path) -> Replay:
    """A Codex CLI session file: its rounds as TraceLab derives them (``workload/codex_rollout.py``), read
    as that round-trace JSONL."""
    rows = codex_rollout.derive_rounds(path)
    replay = _rounds(path, [(row, f"{path.name}:{i}") for i, row in enumerate(rows, 1)])
    return replace(replay, description=codex_rollout.describe(path, rows), source=codex_rollout.SOURCE)


# ---- by name --------------------------------------------------------------------------------------


def replay_names() -> list[str]:
    return [*workload_names(), *sorted(p.stem for p in TRACELAB.glob("*") if p.suffix in (".csv", ".jsonl"))]


_REGISTERED: dict[str, Replay] = {}  # built in code by a scenario (``proto/lab/workload/scenarios.py``)


def register(replay: Replay) -> None:
    _REGISTERED[replay.name] = replay


def load_replay(name_or_path: str) -> Replay:
    registered = _REGISTERED.get(name_or_path)
    return registered if registered is not None else _load(name_or_path)


@functools.cache
def _load(name_or_path: str) -> Replay:
    """A shipped workload or trace by name (``coding-agent``, ``tracelab-claude-session``) or a file by path:
    ``.json`` (workload format 1), ``.csv`` or ``.jsonl`` (TraceLab), or a Codex session file (by content)."""
    path = Path(name_or_path)
    if "/" not in name_or_path:
        for suffix in (".csv", ".jsonl"):
            shipped = TRACELAB / f"{name_or_path}{suffix}"
            if shipped.is_file():
                path = shipped
    if path.is_file() and codex_rollout.is_rollout(path):
        return read_codex(path)
    if path.suffix == ".csv" and path.is_file():
        return read_csv(path)
    if path.suffix == ".jsonl" and path.is_file():
        return read_jsonl(path)
    try:
        return from_workload(load_workload(name_or_path))
    except KeyError:
        raise KeyError(f"unknown workload {name_or_path!r}; shipped: {', '.join(replay_names())}") from None
