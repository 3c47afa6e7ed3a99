"""Figures from timelines, by vLLM ``bench serve``'s definitions. Pure: no clock, no I/O.

A client records a :class:`Trace` per rollout: ``client.send`` marks (a request or append handed to the
socket) and the server events it received, each with its arrival time. From it:

* **TTFT** — a turn's send → its first token-bearing delta (text, function-call arguments, reasoning).
* **TPOT** — (last token-bearing delta − first) ÷ (output tokens − 1), per turn; turns of one token have none.
  vLLM computes it per request with the request's end instead of the last delta: for a streamed response
  the two coincide up to the final event's framing.
* **ITL** — the gaps between successive token-bearing deltas of a turn (a delta may carry several tokens,
  as vLLM's chunks do).
* **E2E** — the rollout's first send → its last terminal event; tool waits included, as a user sees it.
* **Turn overhead** — TTFT − (modelled prefill + batch-queue wait) the server reports for that turn. Queue
  wait is subtracted too: it is the GPU's contention, not the API's work; with one session it is ~0 and the
  choice changes nothing, under load it keeps the overhead an API figure.

Turn k of the client (its k-th send) is turn k of the server's report: true for workloads whose tools are
all local. A hosted tool adds a sampling segment without a send; :func:`split_turns` refuses those traces.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proto.core.events import TERMINAL_TYPES

SEND = "client.send"
RECONNECT = "client.reconnect"  # the client opened a new connection (to another server) before its next send
TOKEN_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
    }
)


@dataclass(frozen=True)
class Mark:
    t: float  # seconds, one monotonic clock per trace
    kind: str  # SEND or a server event type


@dataclass
class Trace:
    """One rollout as a client saw it, plus what the server reported about it."""

    mode: str
    marks: list[Mark] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)  # response.lab.turns, in turn order
    usage: dict[str, int] = field(
        default_factory=lambda: {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0}
    )
    phases_ms: dict[str, float] = field(default_factory=dict)  # response.lab.phases_ms, summed
    bytes_sent: int = 0  # request line + headers + body (HTTP) or frame header + payload (WebSocket)
    status: str = ""  # the last terminal status
    tool_wait_s: float = (
        0.0  # the client's tool waits, as planned (slept between a turn's end and its answer)
    )
    session: str = ""  # the plan's session (a trace's own, or the workload's)
    kinds: list[str] = field(default_factory=list)  # each send's round kind (plan.Send.kind), in order
    # the client's tool waits, on the marks' clock
    tool_spans: list[tuple[float, float]] = field(default_factory=list)
    arrival_s: float = 0.0  # a trace session's arrival, after the cell's measured start
    # per response: (turns, safety hops, model resolutions)
    hops: list[tuple[int, int, int]] = field(default_factory=list)
    # where the rollout sits in the run's design (proto/lab/run/design.py): its rollout index, its session's
    # index, its tool times' seed (None: a trace's recorded times), its mode's position in that index's order
    index: int = -1
    session_index: int = 0
    seed: int | None = None
    position: int = 0

    def add_response(self, response: dict[str, Any]) -> None:
        """Fold one terminal response's usage, phases and turn reports into the trace. Its whole usage:
        ``lab.usage_total`` (a long-lived terminal event's ``usage`` is its last segment's)."""
        usage = (response.get("lab") or {}).get("usage_total") or response.get("usage") or {}
        self.usage["input_tokens"] += int(usage.get("input_tokens", 0))
        self.usage["cached_tokens"] += int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0))
        self.usage["output_tokens"] += int(usage.get("output_tokens", 0))
        lab = response.get("lab") or {}
        for name, ms in (lab.get("phases_ms") or {}).items():
            self.phases_ms[name] = self.phases_ms.get(name, 0.0) + float(ms)
        turns = lab.get("turns") or []
        self.reports.extend(turns if "lab" in response else [client_report(response)])
        work = lab.get("work") or {}
        # The remote calls this response made (paid before its first turn): the fast model prices hops by
        # them.
        self.hops.append((len(turns), int(work.get("safety_hops", 0)), int(work.get("model_resolutions", 0))))
        self.status = str(response.get("status", ""))


def client_report(response: dict[str, Any]) -> dict[str, Any]:
    """A turn's report from what any Responses server sends (a server without ``response.lab``: ``--url``'s,
    a peer's before its upstream's report is attached): the usage it returned, and NaN for the modelled
    figures the client cannot know, so the overhead and GPU figures read as unknown (``null``), never 0."""
    usage = response.get("usage") or {}
    return {
        "prompt_tokens": int(usage.get("input_tokens", 0)),
        "cached_tokens": int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0)),
        "output_tokens": int(usage.get("output_tokens", 0)),
        "prefill_ms": math.nan,
        "queue_wait_ms": math.nan,
        "decode_ms": math.nan,
    }


@dataclass(frozen=True)
class TurnTimes:
    sent: float
    tokens: tuple[float, ...]  # arrival of each token-bearing delta


@dataclass(frozen=True)
class TurnMetrics:
    turn: int
    ttft_ms: float
    tpot_ms: float | None
    itl_ms: tuple[float, ...]
    overhead_ms: float


@dataclass(frozen=True)
class RolloutMetrics:
    e2e_s: float
    turns: tuple[TurnMetrics, ...]


class TraceError(ValueError):
    pass


def split_turns(marks: Sequence[Mark]) -> list[TurnTimes]:
    """Each send opens a turn; token-bearing deltas belong to the latest send."""
    turns: list[tuple[float, list[float]]] = []
    for mark in marks:
        if mark.kind == SEND:
            turns.append((mark.t, []))
        elif mark.kind in TOKEN_EVENTS:
            if not turns:
                raise TraceError(f"a token delta at t={mark.t} before any send")
            turns[-1][1].append(mark.t)
    return [TurnTimes(sent, tuple(tokens)) for sent, tokens in turns]


BOUNDARY = TERMINAL_TYPES | {"response.done"}  # where a round ends for the client


@dataclass(frozen=True)
class RoundTimes:
    sent: float
    first: float  # first token-bearing delta
    last: float  # last one
    end: float  # the round's end event (its response's terminal event, or a long-lived response.done)


def round_times(marks: Sequence[Mark]) -> list[RoundTimes]:
    """Per send: its first and last token and the first end event after its last token (a cancel's
    terminal event, which follows a response.done, is nobody's end)."""
    out: list[RoundTimes] = []
    sent = first = last = None
    for mark in marks:
        if mark.kind == SEND:
            sent, first, last = mark.t, None, None
        elif mark.kind in TOKEN_EVENTS and sent is not None:
            first = mark.t if first is None else first
            last = mark.t
        elif mark.kind in BOUNDARY and sent is not None and first is not None and last is not None:
            out.append(RoundTimes(sent, first, last, mark.t))
            sent = None
    return out


def e2e_s(marks: Sequence[Mark]) -> float:
    sends = [m.t for m in marks if m.kind == SEND]
    ends = [m.t for m in marks if m.kind in TERMINAL_TYPES]
    if not sends or not ends:
        raise TraceError("a rollout needs a send and a terminal event")
    return max(ends) - min(sends)


def turn_metrics(index: int, times: TurnTimes, report: dict[str, Any]) -> TurnMetrics:
    if not times.tokens:
        raise TraceError(f"turn {index} has no token-bearing delta")
    ttft_ms = (times.tokens[0] - times.sent) * 1e3
    out = int(report["output_tokens"])
    tpot = (times.tokens[-1] - times.tokens[0]) * 1e3 / (out - 1) if out > 1 else None
    itl = tuple((b - a) * 1e3 for a, b in zip(times.tokens, times.tokens[1:], strict=False))
    overhead = ttft_ms - float(report["prefill_ms"]) - float(report["queue_wait_ms"])
    return TurnMetrics(index, ttft_ms, tpot, itl, overhead)


def rollout_metrics(trace: Trace) -> RolloutMetrics:
    turns = split_turns(trace.marks)
    if len(turns) != len(trace.reports):
        raise TraceError(
            f"{trace.mode}: {len(turns)} client turns but the server reported {len(trace.reports)} "
            "(hosted tools add sampling segments without a send; the lab replays local tools only)"
        )
    return RolloutMetrics(
        e2e_s(trace.marks),
        tuple(turn_metrics(i, t, r) for i, (t, r) in enumerate(zip(turns, trace.reports, strict=True))),
    )


def percentile(values: Iterable[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class ModeSummary:
    """The latency figures of one mode over its rollouts (docs/lab.md, "Metrics")."""

    e2e_s_p50: float
    ttft_ms_p50: float
    tpot_ms_p50: float
    itl_ms_p99: float
    turn_overhead_ms_p50: float
    turn_overhead_ms_by_turn: list[float]  # median over rollouts, per turn index
    ttft_ms: list[float]  # every turn's, for the CDF
    turns: int


def summarize(rollouts: Sequence[RolloutMetrics]) -> ModeSummary:
    turns = [t for r in rollouts for t in r.turns]
    depth = max((len(r.turns) for r in rollouts), default=0)
    by_turn = [
        percentile((r.turns[k].overhead_ms for r in rollouts if k < len(r.turns)), 50) for k in range(depth)
    ]
    return ModeSummary(
        e2e_s_p50=percentile((r.e2e_s for r in rollouts), 50),
        ttft_ms_p50=percentile((t.ttft_ms for t in turns), 50),
        tpot_ms_p50=percentile((t.tpot_ms for t in turns if t.tpot_ms is not None), 50),
        itl_ms_p99=percentile((gap for t in turns for gap in t.itl_ms), 99),
        turn_overhead_ms_p50=percentile((t.overhead_ms for t in turns), 50),
        turn_overhead_ms_by_turn=by_turn,
        ttft_ms=[t.ttft_ms for t in turns],
        turns=len(turns),
    )


def store_vs_cached(traces: Sequence[Trace]) -> dict[str, dict[str, float]]:
    """The GA WebSocket ``reconnect`` knob's figure: turns sent right after a reconnect (a fresh connection,
    so the chain comes from the store) against the other continuation turns (the connection's cache).
    Each side: ``turns``, ``ttft_ms_p50`` and ``turn_overhead_ms_p50`` (definitions above). Empty when no
    trace reconnected. A rollout's first turn is neither (it continues nothing)."""
    sides: dict[str, list[TurnMetrics]] = {"store": [], "cached": []}
    for trace in traces:
        reconnected: list[bool] = []
        pending = False
        for mark in trace.marks:
            if mark.kind == RECONNECT:
                pending = True
            elif mark.kind == SEND:
                reconnected.append(pending)
                pending = False
        if not any(reconnected):
            continue
        for k, turn in enumerate(rollout_metrics(trace).turns[1:], start=1):
            sides["store" if reconnected[k] else "cached"].append(turn)
    if not sides["store"]:
        return {}
    return {
        side: {
            "turns": float(len(turns)),
            "ttft_ms_p50": percentile((t.ttft_ms for t in turns), 50),
            "turn_overhead_ms_p50": percentile((t.overhead_ms for t in turns), 50),
        }
        for side, turns in sides.items()
    }
