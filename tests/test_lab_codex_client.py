"""``responses-lab bench --client codex``: the real Codex CLI (0.171 over HTTP and GA WebSocket, 0.107 over
the long-lived protocol) runs the short repository task against a real server, and the lab's own client
replays the same plan. Counts and provenance only, never speed: every tool ran once in every rollout (the
server's log, Codex's rollout file and the workspace agree), the timings are the rollout file's own
timestamps, and both clients' paired gains are in results.json. A missing Codex fails with the reason."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from codex import environ_has_node

from proto.lab.bench import main as bench_main
from proto.lab.run.codex_client import MODES, TASKS, CodexUnavailable, codex_binaries

ROLLOUTS = 2
TASK = "fix-mean-short"
MODEL = "mock-4000tps"


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _from_file(path: Path) -> tuple[float, list[str], list[float]]:
    """E2E, the call ids and each call's time, read here from the kept rollout file on its own."""
    lines = [json.loads(t) for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
    events = {ln["payload"].get("type"): _stamp(ln["timestamp"]) for ln in lines if ln["type"] == "event_msg"}
    kinds = ("function_call", "custom_tool_call")
    calls = [
        (ln["payload"]["call_id"], _stamp(ln["timestamp"]))
        for ln in lines
        if ln["type"] == "response_item" and ln["payload"].get("type") in kinds
    ]
    outputs: dict[str, float] = {}
    for ln in lines:
        if ln["payload"].get("type") in ("function_call_output", "custom_tool_call_output"):
            outputs.setdefault(ln["payload"]["call_id"], _stamp(ln["timestamp"]))
    e2e = events["task_complete"] - events["task_started"]
    return e2e, [c for c, _ in calls], [(outputs[c] - t) * 1e3 for c, t in calls]


@pytest.mark.process
def test_codex_runs_the_task_in_three_modes_beside_the_lab_client(tmp_path: Path) -> None:
    environ_has_node()
    out = tmp_path / "out"
    argv = ["--client", "codex", "--quick", "--model", MODEL, "--rollouts", str(ROLLOUTS), "--out", str(out)]
    assert bench_main(argv) == 0
    results: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["quick"] and results["task"]["name"] == TASK
    assert "fewer than a default run's 10 (--quick)" in (out / "report.md").read_text(encoding="utf-8")
    cell = results["models"][MODEL]
    assert cell["lab_cpu"]["run_ms"] > 0 and cell["lab_cpu"]["wait_ms"] >= 0  # Codex's tree, sampled
    steps = TASKS[TASK]
    rollouts = cell["rollouts"]
    assert sorted((r["mode"], r["index"]) for r in rollouts) == sorted(
        (m.name, i) for m in MODES for i in range(ROLLOUTS)
    )
    for r in rollouts:
        # Every tool once: the server's log, Codex's file and the workspace agree.
        assert len(r["call_ids"]) == len(steps) == len(set(r["call_ids"]))
        assert r["server_call_ids"] == r["call_ids"]
        assert r["markers"] == {"apply_patch": 1, "grep": 1, "passed": 1, "test-after": 1}
        assert r["turns"] == len(steps) + 1
        # The timings are the rollout file's own timestamps.
        e2e, ids, tool_ms = _from_file(out / r["rollout_file"])
        assert ids == r["call_ids"]
        assert math.isclose(r["e2e_s"], e2e, abs_tol=1e-6)
        assert r["tool_ms"] == pytest.approx(tool_ms, abs=1e-3)
        assert math.isclose(r["non_tool_s"], e2e - sum(tool_ms) / 1e3, abs_tol=1e-6)
        # The server's report of the same rollout: every turn, in the mode the config selects.
        assert r["server_turns"] == len(steps) + 1
        assert r["prefill_ms"] > 0 and r["decode_ms"] > 0
    by_mode = {m.name: [r for r in rollouts if r["mode"] == m.name] for m in MODES}
    assert {r["responses"] for r in by_mode["codex-longlived"]} == {1}  # one response per rollout
    assert {r["responses"] - r["prewarm"] for r in by_mode["codex-http"]} == {len(steps) + 1}
    assert {r["responses"] - r["prewarm"] for r in by_mode["codex-ws"]} == {len(steps) + 1}
    # Both clients, the same designs, paired gains with their pair counts.
    codex, synthetic = cell["codex"], cell["synthetic"]
    assert set(codex) == {m.name for m in MODES} and set(synthetic) == {"http", "ws", "longlived"}
    for name, side, base in (("codex-ws", codex, "codex-http"), ("ws", synthetic, "http")):
        assert side[name]["gains"]["e2e"]["baseline"] == base
        assert side[name]["gains"]["e2e"]["pairs"] == ROLLOUTS
    assert [(row["codex_mode"], row["synthetic_mode"]) for row in cell["comparison"]] == [
        ("codex-ws", "ws"),
        ("codex-longlived", "longlived"),
    ]
    # The synthetic plan is Codex's: its rounds' prompts are the first codex-http rollout's, and it ran
    # the same number of rollouts per mode.
    kept = json.loads((out / cell["synthetic_out"] / "results.json").read_text(encoding="utf-8"))
    assert {run["mode"]: len(run["rollout_records"]) for run in kept["runs"]} == {
        "http": ROLLOUTS,
        "ws": ROLLOUTS,
        "longlived": ROLLOUTS,
    }
    first = next(r for r in rollouts if r["mode"] == "codex-http" and r["index"] == 0)
    http_run = next(run for run in kept["runs"] if run["mode"] == "http")
    assert http_run["usage"]["input_tokens"] == ROLLOUTS * first["input_tokens"]


def test_a_missing_codex_fails_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RESPONSES_LAB_CLIENTS_DIR", str(tmp_path / "nothing-here"))
    with pytest.raises(CodexUnavailable, match="make clients"):
        codex_binaries()
    out = tmp_path / "out"
    assert bench_main(["--client", "codex", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Codex CLI 0.171.0 (codex-http) is not installed" in err and "make clients" in err
    assert not out.exists()  # refused before anything started
