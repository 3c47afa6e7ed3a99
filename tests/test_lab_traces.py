"""TraceLab traces replayed as they are: every shipped file's rounds become requests whose prompt and output
tokens are the file's own (the plan, server-free), and ``responses-lab bench --quick --workload FILE`` runs
every mode and reports, per round, exactly the file's token counts (a real server process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import bench_trace
from rich.console import Console

from proto.core.response import MODES
from proto.lab.report.tables import WIDTH, print_table
from proto.lab.workload.plan import build_plan
from proto.lab.workload.traces import TRACELAB, TraceError, load_replay, read_csv, replay_names

TRACES = (
    "tracelab-claude-session",
    "tracelab-codex-rollout",
    "tracelab-codex-session",
    "tracelab-multi_session_example",
    "tracelab-multi_session_large",
    "tracelab-session_workload_example",
)


def expected(name: str) -> dict[str, list[list[int]]]:
    """Per session, per round: [prompt tokens, output tokens] as the file says."""
    return {
        s.name: [[r.input_tokens or 0, r.output_tokens] for r in s.rounds] for s in load_replay(name).sessions
    }


@pytest.mark.parametrize("name", TRACES)
def test_every_shipped_trace_plans_to_its_own_token_counts(name: str) -> None:
    assert name in replay_names()
    replay = load_replay(name)
    assert replay.trace and "TraceLab" in replay.source
    for session in replay.sessions:
        plan = build_plan(session, "mock-4000tps", "123456789012")
        assert [[s.prompt_tokens, s.output_tokens] for s in plan.sends] == expected(name)[session.name]


def test_the_trace_shapes_are_read_as_tracelab_defines_them() -> None:
    large = load_replay("tracelab-multi_session_large")
    assert len(large.sessions) == 48 and large.rounds == 303
    arrivals = [s.arrival_s for s in large.sessions]
    assert arrivals == sorted(arrivals) and arrivals[0] == pytest.approx(0.117)
    kinds = {s.kind for session in large.sessions for s in build_plan(session, "m", "123456789012").sends}
    assert kinds == {"first", "outputs"}  # cumulative-consistent prefixes: no rewrite
    example = build_plan(load_replay("tracelab-session_workload_example").sessions[0], "m", "123456789012")
    # Each round keeps less than the last round's prompt plus its output: ten rewrites.
    assert [s.kind for s in example.sends] == ["first"] + ["rewrite"] * 10
    claude = load_replay("tracelab-claude-session").sessions[0]
    assert [len(r.calls) for r in claude.rounds] == [2, 1, 1, 1, 0, 1, 1, 1, 1, 0]
    assert claude.rounds[0].tool_wait_s == pytest.approx(19.291)  # the slower of its two parallel calls
    plan = build_plan(claude, "m", "123456789012", tool_time_scale=0.5)
    assert [s.kind for s in plan.sends][5] == "user"  # after round 4's message, a user message
    assert plan.sends[1].wait_s == pytest.approx(19.291 / 2)


def test_a_broken_trace_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n0,0,0,x,10,0\n",
        encoding="utf-8",
    )
    with pytest.raises(TraceError, match=r"bad.csv:2: 'input_len' is not a number"):
        read_csv(bad)
    with pytest.raises(KeyError, match="shipped"):
        load_replay("no-such-workload")
    assert (TRACELAB / "README.md").read_text(encoding="utf-8").count("CC BY 4.0") >= 1


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """``bench --quick`` on the JSONL (tool calls, a user turn) and on the CSV with rewrites, every mode."""
    out: dict[str, dict[str, Any]] = {}
    for name in ("tracelab-claude-session", "tracelab-session_workload_example"):
        path = TRACELAB / (name + (".jsonl" if "claude" in name else ".csv"))
        out[name] = bench_trace(path, tmp_path_factory.mktemp(name))
    return out


@pytest.mark.process
@pytest.mark.parametrize("name", ["tracelab-claude-session", "tracelab-session_workload_example"])
def test_bench_quick_replays_the_file_in_every_mode(quick_runs: dict[str, dict[str, Any]], name: str) -> None:
    runs = {run["mode"]: run for run in quick_runs[name]["runs"]}
    assert set(runs) == set(MODES)
    want = expected(name)
    for mode, run in runs.items():
        assert run["statuses"] == ["completed"], mode  # every rollout ends with the trace's last round
        got = {session: [[i, o] for i, _, o in rounds] for session, rounds in run["usage_by_round"].items()}
        stem = {session.split("#", 1)[1]: rounds for session, rounds in got.items()}
        assert stem == {session.split("#", 1)[1]: rounds for session, rounds in want.items()}, mode
        assert run["usage"]["input_tokens"] == sum(i for rounds in want.values() for i, _ in rounds)
        assert run["usage"]["output_tokens"] == sum(o for rounds in want.values() for _, o in rounds)


@pytest.mark.process
def test_rewrites_reach_every_transport_and_keep_the_prefix_cached(
    quick_runs: dict[str, dict[str, Any]],
) -> None:
    runs = quick_runs["tracelab-session_workload_example"]["runs"]
    rows = load_replay("tracelab-session_workload_example").sessions[0].rounds
    for run in runs:
        assert run["round_kinds"] == {"first": 1, "rewrite": 10}
        (rounds,) = run["usage_by_round"].values()
        for r, (_, cached, _) in zip(rows[1:], rounds[1:], strict=True):
            # The kept prefix is served from the KV cache (to a block and the cut item's framing), never more.
            assert (r.keep or 0) - 64 <= cached <= (r.input_tokens or 0)


@pytest.mark.process
def test_the_printed_tables_fit_80_columns(quick_runs: dict[str, dict[str, Any]]) -> None:
    console = Console(width=200, record=True)
    for results in quick_runs.values():
        print_table(results, console)
    lines = console.export_text().splitlines()
    assert lines and max(len(line.rstrip()) for line in lines) <= WIDTH
    assert not any("…" in line for line in lines)  # no header or figure cut short


def test_bench_refuses_a_broken_trace_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace the lab cannot read is the user's input: ``bench`` says which file, line and why, and exits
    2 — no traceback, no server started."""
    from proto.cli import main as cli_main

    broken = tmp_path / "session.jsonl"
    broken.write_text('{"session_id": "s", "round_index": 0}\n', encoding="utf-8")
    code = cli_main(["bench", "--workload", str(broken), "--no-predict", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("responses-lab bench: session.jsonl:1: missing") and "Traceback" not in err
