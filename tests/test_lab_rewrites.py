"""History rewrites replayed from a trace's own evidence (docs/lab.md, "History rewrites").

A round whose prompt is not the last context plus new items — reasoning dropped between user turns,
compaction, truncation, a rewritten system message — is planned from what the trace says: its total, its
kept prefix (``prefix_tokens``, a lower bound; a CSV's ``prefix_len``, a cut). Server-free, every plan is
checked through the server's own rendering (``render_context``) of the history the lab clients build
(``clients.rewrite`` + ``clients.new_items``): the prompt is the trace's to the token, the model's turns
stay counted (the directive script keeps its place), and at least the kept prefix is unchanged. One real
server replays such traces over every mode and bills, per round, exactly the trace's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import bench_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto.core.codec import decode_body, decode_items
from proto.core.response import MODES
from proto.core.work import WorkCounters
from proto.lab.run.clients import new_items, rewrite
from proto.lab.workload.plan import PlanError, RolloutPlan, build_plan, model_items, tokenizer
from proto.lab.workload.traces import TRACELAB, Round, Session, load_replay, read_jsonl
from proto.server.pipeline import render_context
from sampler.policy import PlannedCall
from sampler.position import count_segments

NONCE = "123456789012"
CALL = (PlannedCall("read_file", '{"path": "src/app.py"}'),)


def rnd(total: int, out: int, calls: int = 1, cached: int | None = None, keep: int | None = None) -> Round:
    return Round(
        out,
        CALL * calls,
        0.0,
        input_tokens=total,
        keep=keep,
        cached_tokens=cached,
        result_weights=(1.0,) * calls,
    )


def rendered(body: dict[str, Any], history: list[dict[str, Any]]) -> list[int]:
    """The context's token ids as the server renders a request of ``body``'s settings over ``history``."""
    items = decode_items([msgspec.Raw(json.dumps(i).encode()) for i in history])
    return list(render_context(tokenizer(), WorkCounters(), decode_body(json.dumps(body)), items).log.ids)


def replayed(session: Session, plan: RolloutPlan) -> list[tuple[int, int, int]]:
    """Per round, as the server sees what a lab client sends: (prompt tokens, model turns before it,
    tokens of the previous context left unchanged at the head of the prompt)."""
    body = plan.request()
    history: list[dict[str, Any]] = list(body["input"])
    calls: list[dict[str, Any]] = []
    context: list[int] = []  # the previous round's prompt and the model's output, rendered
    out = []
    for k, send in enumerate(plan.sends):
        if k:
            rewrite(history, send)
            history += new_items(calls, send)
        ids = rendered(body, history)
        same = next((n for n, (a, b) in enumerate(zip(context, ids, strict=False)) if a != b), len(context))
        turns = count_segments(decode_items([msgspec.Raw(json.dumps(i).encode()) for i in history]))
        out.append((len(ids) + len(tokenizer().header("assistant")), turns, same))
        calls = []
        for j, item in enumerate(model_items(session.rounds[k], k)):  # what the mock model says
            if item.kind == "call":
                call = {
                    "type": "function_call",
                    "call_id": f"c{k}_{j}",
                    "name": item.name,
                    "arguments": item.text,
                }
                calls.append(call)
                history.append(call)
            else:
                text = {"type": "output_text", "text": item.text, "annotations": []}
                history.append({"type": "message", "role": "assistant", "content": [text]})
        context = rendered(body, history)
    return out


def check(session: Session) -> RolloutPlan:
    """The plan meets the trace to the token, as the server renders the clients' history."""
    plan = build_plan(session, "mock-4000tps", NONCE)
    seen = replayed(session, plan)
    for k, (r, send, (prompt, turns, same)) in enumerate(zip(session.rounds, plan.sends, seen, strict=True)):
        assert send.prompt_tokens == prompt == r.input_tokens, k
        assert send.output_tokens == r.output_tokens, k
        assert turns == k, k  # no model turn lost: the script's line k answers round k
        if k and send.kind == "rewrite":
            # The trace's kept prefix stays (to the re-tokenized token at a cut), and the plan says so.
            evidence = r.keep if r.keep is not None else r.cached_tokens or 0
            assert same >= evidence - 1, (k, same, evidence)
            assert send.prompt_tokens - send.appended_tokens >= evidence - 1, k
    return plan


# Every kind of rewrite, in one session (the sizes are a coding agent's: a 6 k first prompt).
KINDS = (
    rnd(6000, 300),
    rnd(7000, 250),
    rnd(7850, 200, calls=0),  # a final answer; a user turn follows
    rnd(7900, 120, cached=5888),  # reasoning dropped: 150 below the last context, the first prompt cached
    rnd(8920, 150),
    rnd(3000, 100, cached=2048),  # compaction: the system prompt kept, the rest summarised
    rnd(3600, 80, calls=0),
    rnd(1500, 60, cached=256),  # a rewritten (shorter) system message: only 256 tokens cached
    rnd(1700, 40, keep=1024),  # truncation (a CSV's cut): the context ends at 1 024 tokens
    rnd(1800, 30, calls=0),
)


def test_every_kind_of_rewrite_replays_to_the_trace() -> None:
    plan = check(Session("kinds", 0.0, KINDS))
    kinds = [s.kind for s in plan.sends]
    assert kinds == [
        "first",
        *["outputs"] * 2,
        "rewrite",
        "outputs",
        "rewrite",
        "outputs",
        *["rewrite"] * 2,
        "outputs",
    ]
    reasoning, compaction, system, truncation = (plan.sends[k] for k in (3, 5, 7, 8))
    # Dropping the oldest preamble (the lab's reasoning) was enough; nothing else changed.
    assert reasoning.drop and not reasoning.rewrite
    # Compaction drops the preambles left, shortens every text to a token and cuts the first message (the
    # system prompt and task) to what the trace cached: the new item (the summary) takes the rest.
    assert compaction.drop and {i for i, _ in compaction.rewrite} >= {0, 2}
    assert compaction.appended_tokens > 900
    # A rewritten system message: only 256 tokens were cached, so the first message is what changes.
    assert [i for i, _ in system.rewrite][:1] == [0]
    # Where the evidence says the change starts, it starts (to the assistant header's few tokens): the
    # rewritten first message right after its 256 cached tokens, the CSV's cut at its 1 024.
    for send, evidence in ((system, 256), (truncation, 1024)):
        assert evidence <= send.prompt_tokens - send.appended_tokens <= evidence + 8


def test_the_codex_session_replays_with_its_two_rewrites() -> None:
    """TraceLab's Codex session: rounds 5 and 7 open a user turn with a prompt below the last context (the
    earlier turn's reasoning dropped); the last round's calls and the cached prefix stay."""
    (session,) = load_replay("tracelab-codex-session").sessions
    assert [r.input_tokens for r in session.rounds][4:6] == [10472, 10436]
    assert [r.cached_tokens for r in session.rounds][5] == 9216
    plan = check(session)
    assert [s.kind for s in plan.sends] == ["first"] + ["outputs"] * 4 + ["rewrite", "outputs"] * 2
    assert plan.sends[5].drop and not plan.sends[5].rewrite


def test_a_round_that_cannot_be_met_fails_naming_the_round(tmp_path: Path) -> None:
    rows = [
        {"session_id": "s", "round_index": 0, "input_tokens_total": 4000, "output_tokens": 200, "tools": []},
        # The trace says 3 900 tokens were cached, but the prompt is 3 000: no rewrite keeps them.
        {
            "session_id": "s",
            "round_index": 1,
            "input_tokens_total": 3000,
            "prefix_tokens": 3900,
            "output_tokens": 9,
        },
    ]
    path = tmp_path / "impossible.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (session,) = read_jsonl(path).sessions
    with pytest.raises(
        PlanError,
        match=r"impossible#s round 1: 3000 prompt tokens cannot hold the 3900 tokens the trace kept",
    ):
        build_plan(session, "m", NONCE)
    # Calls cannot shrink: a prompt smaller than the calls it must still answer (and the script, which
    # holds them) fails too.
    calls = (PlannedCall("read_file", json.dumps({"path": " x" * 300})),)
    tight = Session(
        "tight",
        0.0,
        (Round(300, calls, 0.0, input_tokens=2000, result_weights=(1.0,)), rnd(500, 9, calls=0, cached=0)),
    )
    with pytest.raises(
        PlanError, match=r"tight round 1: 500 prompt tokens cannot hold .* calls after them \(3\d\d tokens\)"
    ):
        build_plan(tight, "m", NONCE)


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    """A session of 2–9 rounds: extensions, and rewrites of every size — a few tokens below the last
    context (reasoning dropped) down to a fraction of it (compaction) — with a cached prefix anywhere in the
    first message or a CSV-style cut; every prompt is one a real agent could send."""
    first = draw(st.integers(1500, 9000))
    rounds = [rnd(first, draw(st.integers(20, 400)), calls=draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(1, 8))):
        last = rounds[-1]
        context = (last.input_tokens or 0) + last.output_tokens
        out, calls = draw(st.integers(20, 400)), draw(st.integers(0, 2))
        shape = draw(st.sampled_from(["extend", "reasoning", "compaction", "system", "truncation"]))
        floor = 40 * 4 * (len(rounds) + 1) + 600  # what every call, item frame and the script keep at least
        cached = draw(st.integers(0, 300 + floor // 2))
        if shape == "extend" or context < 2 * (floor + cached):
            rounds.append(rnd(context + draw(st.integers(40, 4000)), out, calls))
            continue
        total = {
            "reasoning": context - draw(st.integers(1, 60)),
            "compaction": draw(st.integers(floor + cached, context // 2)),
            "system": draw(st.integers(floor + cached, context - 1)),
            "truncation": draw(st.integers(floor + cached, context + 2000)),
        }[shape]
        keep = cached if shape == "truncation" else None
        rounds.append(rnd(total, out, calls, cached=None if keep is not None else cached, keep=keep))
    return Session("drawn", 0.0, (*rounds[:-1], rnd(rounds[-1].input_tokens or 0, 20, calls=0)))


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions())
def test_drawn_traces_replay_to_their_token_counts(session: Session) -> None:
    check(session)


# ---- one real server, every mode -----------------------------------------------------------------


def test_shipped_codex_rows_are_tracelabs_own() -> None:
    text = (TRACELAB / "tracelab-codex-session.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines()]
    assert {r["provider"] for r in rows} == {"codex"} and len(rows) == 9
    assert all(r["input_tokens_total"] == r["prefix_tokens"] + r["newly_append_tokens"] for r in rows)
    assert "tracelab-codex-session.jsonl" in (TRACELAB / "README.md").read_text(encoding="utf-8")


@pytest.mark.process
def test_rewrites_bill_the_trace_in_every_mode(tmp_path: Path) -> None:
    """``bench --quick`` over a JSONL holding TraceLab's Codex session and the every-kind session (as
    rows of the same format): every mode completes every round and the server counts, per round, the
    trace's prompt and output tokens, and serves at least the kept prefix from its KV cache."""
    path = tmp_path / "rewrites.jsonl"
    rows = (TRACELAB / "tracelab-codex-session.jsonl").read_text(encoding="utf-8").splitlines()
    for k, r in enumerate(KINDS[:-2]):  # the truncation is a CSV's (tests/test_lab_traces.py replays one)
        last = k == len(KINDS) - 3
        row = {
            "session_id": "kinds",
            "round_index": k,
            "input_tokens_total": r.input_tokens,
            "prefix_tokens": r.cached_tokens or 0,
            "output_tokens": 20 if last else r.output_tokens,
            "tools": [{"tool_name": "read_file", "tool_wall_latency_ms": 5}] * len(r.calls),
        }
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    replay = read_jsonl(path)
    want = {
        s.name.split("#", 1)[1]: [[r.input_tokens or 0, r.output_tokens] for r in s.rounds]
        for s in replay.sessions
    }
    cached_at_least = {
        s.name.split("#", 1)[1]: [r.cached_tokens or 0 for r in s.rounds] for s in replay.sessions
    }
    plans = {s.name.split("#", 1)[1]: build_plan(s, "mock-4000tps", NONCE) for s in replay.sessions}
    runs = {run["mode"]: run for run in bench_trace(path, tmp_path / "out")["runs"]}
    assert set(runs) == set(MODES)
    for mode, run in runs.items():
        assert run["statuses"] == ["completed"] and len(run["usage_by_round"]) == len(want), mode
        assert run["round_kinds"]["rewrite"] == 5, mode  # two in the Codex session, three in the other
        for session, rounds in run["usage_by_round"].items():
            sid = session.split("#", 1)[1]
            assert [[i, o] for i, _, o in rounds] == want[sid], (mode, sid)
            for k, (_, cached, _) in enumerate(rounds):
                if plans[sid].sends[k].kind == "rewrite":  # the kept prefix is served from the KV cache
                    assert cached >= cached_at_least[sid][k] - 64, (mode, sid, k, cached)


def test_a_trace_s_tool_names_are_made_valid_as_codex_makes_them(tmp_path: Path) -> None:
    """An MCP tool's ``server.tool`` or a 70-character name would be refused by the Responses API (and by
    this server, ``invalid_value``): the trace's calls and the plan's tools get Codex's renaming."""
    from proto.core.limits import check_tool_name

    path = tmp_path / "mcp.jsonl"
    names = ["github.search issues", "t" * 70]
    row = {"session_id": "s", "round_index": 0, "input_tokens_total": 500, "prefix_tokens": 0}
    rows = [
        {**row, "output_tokens": 30, "tools": [{"tool_name": n, "tool_wall_latency_ms": 5} for n in names]},
        {**row, "round_index": 1, "input_tokens_total": 600, "output_tokens": 20, "tools": []},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    [session] = read_jsonl(path).sessions
    assert [c.name for c in session.rounds[0].calls] == ["github_search_issues", "t" * 64]
    plan = build_plan(session, "mock-4000tps", NONCE)
    for index, tool in enumerate(plan.tools):
        check_tool_name(f"tools[{index}].name", tool["name"])
