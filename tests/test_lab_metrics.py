"""The lab's metric code on synthetic timelines: every figure computed by hand
(proto/lab/analysis/metrics.py)."""

from __future__ import annotations

import math

import pytest

from proto.client.frames import ws_frame_bytes
from proto.lab.analysis.metrics import (
    SEND,
    Mark,
    Trace,
    TraceError,
    e2e_s,
    percentile,
    rollout_metrics,
    split_turns,
    summarize,
)
from proto.lab.run.clients import answer
from proto.lab.workload.plan import Send

TEXT = "response.output_text.delta"
ARGS = "response.function_call_arguments.delta"


def report(turn: int, prefill_ms: float, queue_wait_ms: float, output_tokens: int) -> dict[str, float]:
    return {
        "turn": turn,
        "prefill_ms": prefill_ms,
        "queue_wait_ms": queue_wait_ms,
        "output_tokens": output_tokens,
        "decode_ms": 0.0,
        "prompt_tokens": 0,
        "cached_tokens": 0,
    }


def two_turn_trace() -> Trace:
    """Turn 0: sent at 0, tokens at 50/60/80 ms, 3 tokens; 10 ms of tool time; turn 1: sent at 100 ms,
    tokens at 145/150 ms, ends at 152 ms. Events that carry no token never count."""
    marks = [
        Mark(0.000, SEND),
        Mark(0.010, "response.created"),
        Mark(0.045, "response.output_item.added"),
        Mark(0.050, ARGS),
        Mark(0.060, ARGS),
        Mark(0.080, ARGS),
        Mark(0.081, "response.function_call_arguments.done"),
        Mark(0.090, "response.completed"),
        Mark(0.100, SEND),
        Mark(0.120, "response.in_progress"),
        Mark(0.145, TEXT),
        Mark(0.150, TEXT),
        Mark(0.152, "response.completed"),
    ]
    trace = Trace("http", marks)
    trace.reports = [report(0, 40.0, 2.0, 3), report(1, 30.0, 0.0, 2)]
    return trace


def test_split_turns_assigns_token_deltas_to_the_latest_send() -> None:
    turns = split_turns(two_turn_trace().marks)
    assert [t.sent for t in turns] == [0.0, 0.1]
    assert [t.tokens for t in turns] == [(0.05, 0.06, 0.08), (0.145, 0.15)]


def test_turn_figures_are_exact() -> None:
    m = rollout_metrics(two_turn_trace())
    first, second = m.turns
    assert first.ttft_ms == pytest.approx(50.0, abs=1e-9)
    assert first.tpot_ms == pytest.approx(15.0, abs=1e-9)  # (80 - 50) / (3 - 1)
    assert first.itl_ms == pytest.approx((10.0, 20.0), abs=1e-9)
    assert first.overhead_ms == pytest.approx(8.0, abs=1e-9)  # 50 - 40 prefill - 2 queue wait
    assert second.ttft_ms == pytest.approx(45.0, abs=1e-9)
    assert second.tpot_ms == pytest.approx(5.0, abs=1e-9)
    assert second.itl_ms == pytest.approx((5.0,), abs=1e-9)
    assert second.overhead_ms == pytest.approx(15.0, abs=1e-9)
    assert m.e2e_s == pytest.approx(0.152, abs=1e-12)  # first send → last terminal event


def test_a_one_token_turn_has_no_tpot_and_no_itl() -> None:
    trace = Trace(
        "ws", [Mark(1.0, SEND), Mark(1.02, TEXT), Mark(1.03, "response.completed")], [report(0, 5.0, 0.0, 1)]
    )
    (turn,) = rollout_metrics(trace).turns
    assert turn.tpot_ms is None and turn.itl_ms == ()
    assert turn.ttft_ms == pytest.approx(20.0, abs=1e-9)
    assert turn.overhead_ms == pytest.approx(15.0, abs=1e-9)


def test_longlived_e2e_spans_create_to_the_single_terminal_event() -> None:
    marks = [
        Mark(10.0, SEND),
        Mark(10.1, TEXT),
        Mark(10.2, "response.done"),
        Mark(10.5, SEND),
        Mark(10.6, TEXT),
        Mark(10.75, "response.completed"),
    ]
    assert e2e_s(marks) == pytest.approx(0.75, abs=1e-12)


def test_a_hosted_segment_without_a_send_is_refused() -> None:
    trace = Trace(
        "longlived",
        [Mark(0.0, SEND), Mark(0.1, TEXT), Mark(0.2, "response.completed")],
        [report(0, 1.0, 0.0, 1), report(1, 1.0, 0.0, 1)],
    )
    with pytest.raises(TraceError, match="hosted tools"):
        rollout_metrics(trace)


def test_tokens_before_any_send_are_an_error() -> None:
    with pytest.raises(TraceError):
        split_turns([Mark(0.0, TEXT)])


def test_percentile_interpolates_like_numpy() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_summary_over_rollouts() -> None:
    a = rollout_metrics(two_turn_trace())
    b_trace = two_turn_trace()
    b_trace.reports = [report(0, 44.0, 0.0, 3), report(1, 25.0, 0.0, 2)]  # overheads 6 and 20
    b = rollout_metrics(b_trace)
    s = summarize([a, b])
    assert s.turns == 4
    assert s.e2e_s_p50 == pytest.approx(0.152)
    assert s.ttft_ms_p50 == pytest.approx(47.5)  # TTFTs 50, 45, 50, 45
    assert s.tpot_ms_p50 == pytest.approx(10.0)  # 15, 5, 15, 5
    assert s.itl_ms_p99 == pytest.approx(percentile([10, 20, 5, 10, 20, 5], 99))
    assert s.turn_overhead_ms_p50 == pytest.approx(11.5)  # 8, 15, 6, 20
    assert s.turn_overhead_ms_by_turn == pytest.approx([7.0, 17.5])  # per turn index, median over rollouts


def test_trace_folds_responses() -> None:
    trace = Trace("http")
    for prefill in (10.0, 20.0):
        trace.add_response(
            {
                "status": "completed",
                "usage": {
                    "input_tokens": 100,
                    "input_tokens_details": {"cached_tokens": 60},
                    "output_tokens": 7,
                },
                "lab": {
                    "phases_ms": {"safety": 1.5, "render_tokenize": 2.0},
                    "turns": [report(0, prefill, 0.0, 7)],
                },
            }
        )
    assert trace.usage == {"input_tokens": 200, "cached_tokens": 120, "output_tokens": 14}
    assert trace.phases_ms == {"safety": 3.0, "render_tokenize": 4.0}
    assert [r["prefill_ms"] for r in trace.reports] == [10.0, 20.0]


def test_client_bytes_and_call_pairing() -> None:
    assert ws_frame_bytes(b"x" * 10) == 16  # 2 header + 4 mask
    assert ws_frame_bytes(b"x" * 200) == 208  # 16-bit length
    assert ws_frame_bytes(b"x" * 70_000) == 70_014  # 64-bit length
    calls = [{"type": "function_call", "call_id": "c1"}, {"type": "function_call", "call_id": "c2"}]
    out = answer(calls, Send("outputs", ("a", "b"), (), 0.0, 0, 0, 0))
    assert [(o["call_id"], o["output"]) for o in out] == [("c1", "a"), ("c2", "b")]
