"""Codex CLI's own session files replayed in the lab, as they are (docs/lab.md, "Codex session files").

The reader, server-free, on small rollout files written here (every line kind it reads, an aborted turn,
files it must refuse) and on TraceLab's own Codex example against TraceLab's own derivation of it; then the
closed loop: the real Codex CLI runs two user turns against a real server, and ``responses-lab bench
--workload <its rollout file>`` replays that file in every mode, the server counting per round exactly the
tokens the file's ``token_count`` events say (which are what the server counted for Codex)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from codex import (
    PATCH,
    VIEW_IMAGE,
    apply_patch,
    codex_bin,
    codex_exec,
    environ_has_node,
    lab_server,
    png,
    provider_config,
    rollout_prompt,
    session_file,
    shell,
)

from proto.core.response import MODES
from proto.lab.bench import main as bench_main
from proto.lab.config import BenchConfig
from proto.lab.workload.codex_rollout import RolloutError, derive_rounds, is_rollout
from proto.lab.workload.plan import build_plan
from proto.lab.workload.traces import TRACELAB, load_replay, replay_names

SESSION = "019a0000-0000-7000-8000-000000000001"


class Rollout:
    """A Codex rollout file, line by line as Codex writes it (codex-rs/protocol ``RolloutLine``)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.total = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0}

    def add(self, t: float, kind: str, payload: dict[str, Any]) -> Rollout:
        stamp = datetime.fromtimestamp(1_780_000_000 + t, UTC).isoformat(timespec="milliseconds")
        self.lines.append({"timestamp": stamp.replace("+00:00", "Z"), "type": kind, "payload": payload})
        return self

    def meta(self) -> Rollout:
        return self.add(0, "session_meta", {"id": SESSION, "cli_version": "0.171.0", "cwd": "/w"})

    def turn(self, t: float, turn_id: str) -> Rollout:
        self.add(t, "event_msg", {"type": "task_started", "turn_id": turn_id})
        return self.add(t, "turn_context", {"turn_id": turn_id, "model": "m"})

    def item(self, t: float, **payload: Any) -> Rollout:
        return self.add(t, "response_item", payload)

    def event(self, t: float, **payload: Any) -> Rollout:
        return self.add(t, "event_msg", payload)

    def count(self, t: float, prompt: int, cached: int, output: int, reasoning: int = 0) -> Rollout:
        last = {
            "input_tokens": prompt,
            "cached_input_tokens": cached,
            "output_tokens": output,
            "reasoning_output_tokens": reasoning,
            "total_tokens": prompt + output,
        }
        for key in self.total:
            self.total[key] += last[key]
        info = {"total_token_usage": dict(self.total), "last_token_usage": last, "model_context_window": 1000}
        return self.event(t, type="token_count", info=info, rate_limits=None)

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(line) + "\n" for line in self.lines), encoding="utf-8")
        return path


def every_kind() -> Rollout:
    """Two user turns; parallel function + custom calls, a local shell call, results of every kind."""
    r = Rollout().meta().turn(0.5, "t1")
    r.item(0.6, type="message", role="user", content=[{"type": "input_text", "text": "do it"}])
    r.item(0.9, type="reasoning", summary=[], encrypted_content="x")
    r.item(1.0, type="function_call", name="exec_command", arguments="{}", call_id="c1")
    r.item(1.0, type="custom_tool_call", name="apply_patch", input="*** Begin Patch", call_id="c2")
    r.item(1.25, type="function_call_output", call_id="c1", output="o" * 40)
    r.event(1.4, type="patch_apply_end", call_id="c2", stdout="M a.py\n", stderr="", success=True)
    r.item(1.5, type="custom_tool_call_output", call_id="c2", output="later, not the first result")
    r.count(1.6, 1000, 0, 50, reasoning=20)
    r.event(1.61, type="token_count", info=None, rate_limits={"primary": None})  # a rate-limit update
    r.lines.append({**r.lines[-2], "timestamp": "2026-05-28T20:26:41.620Z"})  # the same usage again
    r.item(2.0, type="local_shell_call", call_id="c3", status="completed", action={"type": "exec"})
    r.event(2.3, type="exec_command_end", call_id="c3", aggregated_output="y" * 10, exit_code=0)
    r.item(2.4, type="function_call_output", call_id="c3", output="y" * 10)
    r.count(2.5, 1200, 1000, 30)
    r.item(2.9, type="message", role="assistant", content=[{"type": "output_text", "text": "done"}])
    r.count(3.0, 1300, 1200, 40)
    r.turn(10.0, "t2")
    r.item(10.5, type="function_call", name="read", arguments="{}", call_id="c4")
    r.item(11.5, type="function_call_output", call_id="c4", output="z" * 7)
    r.count(11.6, 1500, 1300, 20)
    return r.count(12.0, 1600, 1500, 10)


def test_the_reader_reads_every_line_kind_it_uses(tmp_path: Path) -> None:
    path = every_kind().write(tmp_path / "session.log")  # found by its content, not its name
    assert is_rollout(path)
    rows = derive_rounds(path)
    assert [
        (r["input_tokens_total"], r["prefix_tokens"], r["newly_append_tokens"], r["output_tokens"])
        for r in rows
    ] == [
        (1000, 0, 1000, 50),
        (1200, 1000, 200, 30),
        (1300, 1200, 100, 40),
        (1500, 1300, 200, 20),
        (1600, 1500, 100, 10),
    ]
    assert rows[0]["reasoning_output_tokens"] == 20
    assert [r["turn_id"] for r in rows] == ["t1", "t1", "t1", "t2", "t2"]
    assert {r["session_id"] for r in rows} == {f"codex:{SESSION}"}
    tools = [
        [(t["tool_name"], t["tool_wall_latency_ms"], t["result_chars"]) for t in r["tools"]] for r in rows
    ]
    # the first result of each call counts: c2's patch_apply_end (7 characters), before its output item
    assert tools == [
        [("exec_command", 250, 40), ("apply_patch", 400, 7)],
        [("local_shell", 300, 10)],  # exec_command_end came before the output item
        [],
        [("read", 1000, 7)],
        [],
    ]
    replay = load_replay(str(path))
    assert replay.trace and "TraceLab" in replay.source
    assert replay.description.endswith("session.log: 5 model call(s), 2 user turn(s)")
    (session,) = replay.sessions
    assert session.name == f"session#codex:{SESSION}"
    assert [(r.input_tokens, r.output_tokens) for r in session.rounds] == [
        (r["input_tokens_total"], r["output_tokens"]) for r in rows
    ]
    assert [[c.name for c in r.calls] for r in session.rounds] == [
        ["exec_command", "apply_patch"],
        ["local_shell"],
        [],
        ["read"],
        [],
    ]
    # parallel calls: the slower one's wall time; the next round's new tokens split by result size
    assert [r.tool_wait_s for r in session.rounds] == [0.4, 0.3, 0.0, 1.0, 0.0]
    assert session.rounds[0].result_weights == (40.0, 7.0)
    # the plan meets the file's counts; the second user turn starts with a user message
    plan = build_plan(session, "mock-4000tps", "123456789012")
    assert [(s.prompt_tokens, s.output_tokens) for s in plan.sends] == [
        (r.input_tokens, r.output_tokens) for r in session.rounds
    ]
    assert [s.kind for s in plan.sends] == ["first", "outputs", "outputs", "user", "outputs"]


def test_an_aborted_turn_drops_the_calls_of_the_call_that_never_reported(tmp_path: Path) -> None:
    r = Rollout().meta().turn(0.5, "t1")
    r.item(1.0, type="function_call", name="exec_command", arguments="{}", call_id="c1")
    r.item(1.2, type="function_call_output", call_id="c1", output="ok")
    r.count(1.3, 1000, 0, 30)
    # the next model call streams a call, then the user interrupts: no token_count for it, no result
    r.item(2.0, type="function_call", name="exec_command", arguments="{}", call_id="c2")
    r.event(2.5, type="turn_aborted", reason="interrupted")
    r.turn(5.0, "t2").event(5.0, type="user_message", message="stop; do this instead")
    r.count(6.0, 1400, 1000, 20)
    rows = derive_rounds(r.write(tmp_path / "rollout-aborted.jsonl"))
    assert [len(row["tools"]) for row in rows] == [1, 0]
    assert [row["turn_id"] for row in rows] == ["t1", "t2"]
    (session,) = load_replay(str(tmp_path / "rollout-aborted.jsonl")).sessions
    assert [(x.input_tokens, x.output_tokens, len(x.calls)) for x in session.rounds] == [
        (1000, 30, 1),
        (1400, 20, 0),
    ]
    plan = build_plan(session, "mock-4000tps", "123456789012")
    assert [s.prompt_tokens for s in plan.sends] == [1000, 1400]


def test_a_sub_agent_s_file_gives_the_parent_history_it_replays_to_the_parent(tmp_path: Path) -> None:
    """Codex writes a spawned agent's file with its own session_meta, then its parent's, then the parent's
    turns (older UUIDv7 turn ids) before its own: TraceLab gives those rounds to the parent's session."""
    child, parent = "019a0000-0000-7000-8000-0000000000c1", "0199ffff-0000-7000-8000-0000000000a1"
    spawn = {"subagent": {"thread_spawn": {"parent_thread_id": parent, "depth": 1}}}
    r = Rollout().add(0, "session_meta", {"id": child, "source": spawn, "cli_version": "0.171.0"})
    r.add(0, "session_meta", {"id": parent, "source": "cli"})
    r.turn(0.1, "0199ffff-0001-7000-8000-000000000001").count(0.2, 800, 0, 10)
    r.turn(1.0, "019a0000-0001-7000-8000-000000000001").count(1.5, 900, 0, 20)
    r.count(2.0, 1000, 900, 30)
    rows = derive_rounds(r.write(tmp_path / "rollout-child.jsonl"))
    assert [(row["session_id"], row["round_index"]) for row in rows] == [
        (f"codex:{parent}", 0),
        (f"codex:{child}", 0),
        (f"codex:{child}", 1),
    ]
    replay = load_replay(str(tmp_path / "rollout-child.jsonl"))
    assert sorted(len(s.rounds) for s in replay.sessions) == [1, 2]


def test_a_file_without_token_counts_is_refused_with_its_name_and_why(tmp_path: Path) -> None:
    r = Rollout().meta().turn(0.5, "t1")
    r.item(1.0, type="message", role="assistant", content=[])
    r.event(1.1, type="token_count", info=None, rate_limits=None)  # rate limits only: no model call's usage
    path = r.write(tmp_path / "rollout-empty.jsonl")
    with pytest.raises(RolloutError, match=r"rollout-empty.jsonl: no token_count event with usage"):
        load_replay(str(path))
    broken = tmp_path / "rollout-broken.jsonl"
    broken.write_text(path.read_text(encoding="utf-8") + '{"timestamp": "2026-', encoding="utf-8")
    with pytest.raises(RolloutError, match=r"rollout-broken.jsonl:6: not JSON"):
        derive_rounds(broken)
    bad = Rollout().meta().count(1.0, 10, 0, 1)
    bad.lines[-1]["payload"]["info"]["last_token_usage"]["output_tokens"] = "many"
    with pytest.raises(RolloutError, match=r"rollout-bad.jsonl:2: .*output_tokens is not a count: 'many'"):
        derive_rounds(bad.write(tmp_path / "rollout-bad.jsonl"))


def test_only_codex_files_are_taken_for_codex_files() -> None:
    assert not is_rollout(TRACELAB / "tracelab-claude-session.jsonl")  # TraceLab's JSONL rows
    assert not is_rollout(TRACELAB / "tracelab-multi_session_example.csv")
    assert not is_rollout(TRACELAB.parent / "coding-agent.json")  # a format-1 workload
    assert is_rollout(TRACELAB / "tracelab-codex-rollout.jsonl")


def test_tracelab_s_codex_example_reads_as_tracelab_derived_it() -> None:
    """TraceLab's public Codex session (0.114, three user turns) against TraceLab's own rows for it
    (``example_sessions/derived/round_trace.jsonl``, ``provider: codex``): every field the reader writes."""
    assert {"tracelab-codex-rollout", "tracelab-codex-session"} <= set(replay_names())
    mine = derive_rounds(TRACELAB / "tracelab-codex-rollout.jsonl")
    theirs = [
        json.loads(line) for line in (TRACELAB / "tracelab-codex-session.jsonl").read_text().splitlines()
    ]
    assert len(mine) == len(theirs) == 9
    for row, want in zip(mine, theirs, strict=True):
        assert row == {key: want[key] for key in row if key != "tools"} | {"tools": row["tools"]}
        assert row["tools"] == [
            {key: t[key] for key in row_tool} for t, row_tool in zip(want["tools"], row["tools"], strict=True)
        ]
    raw, derived = load_replay("tracelab-codex-rollout"), load_replay("tracelab-codex-session")
    assert [s.rounds for s in raw.sessions] == [s.rounds for s in derived.sessions]
    assert raw.description.startswith("Codex CLI 0.114.0 session rollout") and raw.description.endswith(
        "9 model call(s), 3 user turn(s)"
    )


# ---- the closed loop: the real Codex CLI, then the lab ----------------------------------------------------

FIRST, SECOND = "First turn done.", "Second turn done."


@dataclass
class Recorded:
    rollout: Path
    served: list[tuple[int, int]]  # (input, output) tokens of every response the server ended for Codex


async def _record(root: Path) -> Recorded:
    environ_has_node()
    binary = codex_bin("codex")
    async with lab_server(root) as server:
        work = root / "work"
        work.mkdir()
        (work / "pixel.png").write_bytes(png(4, 4))
        home, config = root / "home", provider_config(server)
        # Turn 1: shell, apply_patch, view_image, an answer; turn 2 (`exec resume`): a shell call, an answer.
        prompt = rollout_prompt(
            "!reason 30 " + shell("printf 'one\\n' > notes.txt"),
            apply_patch(PATCH),
            VIEW_IMAGE,
            f"!say {FIRST}",
            shell("cat notes.txt"),
            f"!say {SECOND}",
        )
        first = await codex_exec(binary, home, work, config, prompt)
        assert (first.returncode, first.last_message) == (0, FIRST), first.output
        second = await codex_exec(binary, home, work, config, "Go on.", "resume", "--last")
        assert (second.returncode, second.last_message) == (0, SECOND), second.output
        served = [
            (line["input_tokens"], line["output_tokens"]) for line in server.ended() if line["turns"] > 0
        ]
        return Recorded(session_file(home), served)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return asyncio.run(_record(tmp_path_factory.mktemp("codex")))


def token_counts(path: Path) -> list[tuple[int, int]]:
    """The file's own per-call (input, output) tokens: its token_count events, each model call once."""
    counts, totals = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        payload = json.loads(line)["payload"]
        info = payload.get("info") if payload.get("type") == "token_count" else None
        if info and info["total_token_usage"] not in totals[-1:]:
            totals.append(info["total_token_usage"])
            counts.append(
                (info["last_token_usage"]["input_tokens"], info["last_token_usage"]["output_tokens"])
            )
    return counts


@pytest.mark.process
def test_codex_s_own_file_holds_every_call_the_server_served(recorded: Recorded) -> None:
    counts = token_counts(recorded.rollout)
    assert len(counts) == 6  # four calls in turn 1, two in turn 2
    assert counts == recorded.served  # what Codex recorded is what the server counted
    # Codex 0.171 also records each response's usage by its id: one token_count per response, no more
    lines = [json.loads(line) for line in recorded.rollout.read_text(encoding="utf-8").splitlines()]
    usage = [x["payload"]["usage"] for x in lines if x["type"] == "token_usage_record"]
    assert [(u["input_tokens"], u["output_tokens"]) for u in usage] == counts
    rows = derive_rounds(recorded.rollout)
    assert [(r["input_tokens_total"], r["output_tokens"]) for r in rows] == counts
    assert [[t["tool_name"] for t in r["tools"]] for r in rows] == [
        ["exec_command"],
        ["apply_patch"],
        ["view_image"],
        [],
        ["exec_command"],
        [],
    ]
    assert all(
        t["tool_wall_latency_ms"] is not None and t["tool_wall_latency_ms"] >= 0
        for r in rows
        for t in r["tools"]
    )
    assert len({r["turn_id"] for r in rows}) == 2


@pytest.fixture(scope="module")
def replayed(recorded: Recorded, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    code = bench_main(
        [
            "--quick",
            "--workload",
            str(recorded.rollout),
            "--modes",
            ",".join(MODES),
            "--profile",
            "local",
            "--no-predict",
            "--no-plots",
            "--pings",
            "10",
            "--warmup",
            "0",
            "--rollouts",
            "1",  # one replay of the file: its counts are summed below
            "--out",
            str(out),
            # Ten times the GPU's speed: the same tokens, a tenth of the modelled time.
            "--model-override",
            "mock-4000tps:tokens-per-second=40000,prefill-time-per-token=0.0039",
        ]
    )
    assert code == 0
    results: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return results


@pytest.mark.process
def test_bench_replays_codex_s_own_file_in_every_mode(recorded: Recorded, replayed: dict[str, Any]) -> None:
    counts = [list(c) for c in token_counts(recorded.rollout)]
    rows = derive_rounds(recorded.rollout)
    waits = sum(max(t["tool_wall_latency_ms"] for t in r["tools"]) / 1e3 for r in rows if r["tools"])
    scale = replayed["config"]["tool_time_scale"]
    assert scale == BenchConfig.quick_preset().tool_time_scale and waits > 0
    runs = {run["mode"]: run for run in replayed["runs"]}
    assert set(runs) == set(MODES)
    for mode, run in runs.items():
        assert run["statuses"] == ["completed"], mode
        (rounds,) = run["usage_by_round"].values()
        assert [[i, o] for i, _, o in rounds] == counts, mode
        assert run["usage"]["input_tokens"] == sum(i for i, _ in counts), mode
        assert run["usage"]["output_tokens"] == sum(o for _, o in counts), mode
        # the second turn opens with a user message (Codex kept the whole history: no rewrite)
        assert run["round_kinds"] == {"first": 1, "outputs": 4, "user": 1}, mode
        # the tools' wall times from the file's timestamps, each round's slowest call, at --quick's scale
        assert run["tool_wait_s_per_rollout"] == pytest.approx(scale * waits), mode
