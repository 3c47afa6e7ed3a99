"""The real agent's and vLLM's gateway's findings (proto/lab/report/agent_findings.py; docs/lab.md, "The real
agent" and "Peers") over small real runs kept as fixtures (tests/fixtures/agent-runs: ``bench --client codex
--quick`` at two speeds, its lab-client runs trimmed to their rollout records, and a ``bench --peer
agentic-api`` run of four turns). Every figure checked here is recomputed by hand from the rollout records.
Reads files only: no server, no run."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from proto.lab.report import agent_findings
from proto.lab.report.writeup import kept, lab, notes_block

RUNS = Path(__file__).resolve().parent / "fixtures" / "agent-runs"
KEPT = Path(__file__).resolve().parent.parent / "docs" / "results"


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def _paired(mine: dict[Any, float], base: dict[Any, float]) -> float:
    """The lab's gain by hand: the mean over rollout pairs of mode ÷ baseline − 1."""
    ratios = [mine[k] / base[k] - 1 for k in mine if k in base]
    assert len(ratios) == len(mine) >= 3
    return sum(ratios) / len(ratios)


def _row(text: str, *starts: str) -> list[str]:
    """The cells of the first table row that starts with ``starts``."""
    line = next(x for x in text.splitlines() if x.startswith("| " + " | ".join(starts) + " |"))
    return line.strip("| ").split(" | ")


def _codex_by_index(rollouts: list[dict[str, Any]], mode: str, key: str) -> dict[int, float]:
    def value(r: dict[str, Any]) -> float:
        if key == "client_and_wire":
            server = r["prefill_ms"] + r["decode_ms"] + r["phases_ms"]
            return float((1e3 * r["non_tool_s"] - server) / r["turns"])
        return float(r[key])

    return {r["index"]: value(r) for r in rollouts if r["mode"] == mode}


def _lab_client(runs: dict[str, dict[int, Any]], mode: str, key: str) -> dict[int, float]:
    """The lab client's E2E per rollout index, less the tool waits it slept for ``non_tool``."""
    return {i: r["e2e_s"] - (r["tool_wait_s"] if key == "non_tool" else 0.0) for i, r in runs[mode].items()}


def test_the_codex_section_holds_the_files_figures() -> None:
    """Per speed and design: both clients' gains (Codex's from its rollout records, the lab client's from its
    own run's records: E2E − the tool waits it slept), the per-turn split, and the tool-once counts."""
    results = _json(RUNS / "codex" / "results.json")
    text = "\n".join(agent_findings.sections(RUNS, kept(RUNS)))
    assert "## The real agent: does the lab client's result hold for Codex?" in text
    assert "(`--quick`: fewer than a default run's)" in text
    calls = results["task"]["prompt"].count("\n!call ")
    for model, cell in results["models"].items():
        label = model.removeprefix("mock-")
        rollouts = cell["rollouts"]
        lab_runs = {
            run["mode"]: {r["index"]: r for r in run["rollout_records"]}
            for run in _json(RUNS / "codex" / cell["synthetic_out"] / "results.json")["runs"]
        }
        for codex_mode, design in (("codex-ws", "ws"), ("codex-longlived", "longlived")):
            row = _row(text, label, f"`{design}`")
            for key in ("e2e_s", "non_tool_s"):
                by_hand = _paired(
                    _codex_by_index(rollouts, codex_mode, key), _codex_by_index(rollouts, "codex-http", key)
                )
                assert _pct(by_hand) in " ".join(row)
            for column, key in ((3, "e2e"), (6, "non_tool")):
                gain = _paired(_lab_client(lab_runs, design, key), _lab_client(lab_runs, "http", key))
                assert row[column].startswith(_pct(gain))
                # Whether the intervals overlap: the file's own intervals, read here.
                pair = next(c for c in cell["comparison"] if c["codex_mode"] == codex_mode)[key]
                a, b = pair["codex"], pair["synthetic"]
                overlaps = a["low"] <= b["high"] and b["low"] <= a["high"]
                assert row[column + 1] == ("overlap" if overlaps else "disjoint")
        # Where a turn's non-tool time goes, Codex's side: means over the rollouts, by hand.
        for mode in results["modes"]:
            rs = [r for r in rollouts if r["mode"] == mode["name"]]
            turns = sum(r["turns"] for r in rs)
            non_tool = 1e3 * sum(r["non_tool_s"] for r in rs) / turns
            server = sum(r["prefill_ms"] + r["decode_ms"] + r["phases_ms"] for r in rs) / turns
            cells = _row(text, label, f"`{mode['server_mode']}`", mode["codex"])
            assert cells[3:6] == [f"{non_tool:.1f}", f"{server:.1f}", f"{non_tool - server:.1f}"]
            assert cells[9] == f"{statistics.median(r['tool_s'] for r in rs):.3f}"
        # Every tool once: the counts are the file's.
        ids = sum(len(r["call_ids"]) for r in rollouts)
        same = sum(r["call_ids"] == r["server_call_ids"] for r in rollouts)
        once = sum(set(r["markers"].values()) == {1} for r in rollouts)
        n = len(rollouts)
        assert f"- {label}: {n} rollouts, {ids} calls ({n} of {n} rollouts with the task's {calls}); " in text
        assert f"none twice, in {same} of {n};" in text and f"exactly once in {once} of {n}." in text


def test_codex_side_recomputes_from_the_kept_records() -> None:
    """Codex's summary is recomputed from the file's rollout records: the gains the run stored come back
    exactly (same pairs, same bootstrap seed), and the client-and-wire gain the run did not store is the mean
    of the pairs' ratios."""
    results = _json(RUNS / "codex" / "results.json")
    run = agent_findings.load_codex(RUNS)
    assert run is not None
    for model, cell in results["models"].items():
        sides = agent_findings.codex_sides(run.models[model])
        for mode in ("codex-ws", "codex-longlived"):
            for metric in ("e2e", "non_tool"):
                stored = cell["codex"][mode]["gains"][metric]
                again = sides[mode].gains[metric]
                assert (again.gain, again.low, again.high) == (stored["gain"], stored["low"], stored["high"])
            cw = sides[mode].gains["client_and_wire"]
            by_hand = _paired(
                _codex_by_index(cell["rollouts"], mode, "client_and_wire"),
                _codex_by_index(cell["rollouts"], "codex-http", "client_and_wire"),
            )
            assert cw.gain == pytest.approx(by_hand, rel=1e-12)
            assert cw.low is not None and cw.high is not None and cw.low <= by_hand <= cw.high


def test_the_peer_section_holds_the_files_figures() -> None:
    """ws and longlived against agentic-api, paired here by rollout (E2E and median TTFT per rollout, by
    hand), and the gateway/upstream split from the peer's per-turn records."""
    results = _json(RUNS / "peer-1k" / "results.json")
    runs = {r["mode"]: r for r in results["runs"]}
    text = "\n".join(agent_findings.sections(RUNS, kept(RUNS)))
    assert "## Peers: `ws` and `longlived` against vLLM's gateway (agentic-api)" in text

    def records(mode: str, key: str) -> dict[tuple[int, int], float]:
        return {(r["index"], r["session"]): r[key] for r in runs[mode]["rollout_records"]}

    for mode in ("http", "ws", "longlived"):
        row = _row(text, mode)
        for column, key in ((4, "e2e_s"), (5, "ttft_ms_p50"), (6, "turn_overhead_ms_p50")):
            assert _pct(_paired(records(mode, key), records("agentic-api", key))) in row[column]
        r = runs[mode]
        assert row[3] == f"{r['turn_overhead_ms_p50']:.1f} / {r['turn_overhead_ms_p90']:.1f}"
    peer = runs["agentic-api"]["peer"]
    gateway = statistics.median(t["gateway_ms"] for t in peer["turns"])
    upstream = statistics.median(t["upstream_ms"] for t in peer["turns"])
    for t in peer["turns"]:
        assert t["gateway_ms"] == pytest.approx(t["ttft_ms"] - t["upstream_ms"])
    added = runs["agentic-api"]["turn_overhead_ms_p50"] - runs["http"]["turn_overhead_ms_p50"]
    assert f"over {len(peer['turns'])} turns: gateway p50 {gateway:.1f} ms" in text
    assert f"upstream p50 {upstream:.1f} ms" in text
    assert f"Its turn overhead p50 less `http`'s: {added:+.1f} ms (" in text
    history = max(row[0] for rounds in runs["http"]["usage_by_round"].values() for row in rounds)
    assert f"history to {history:,} tokens".replace(",", " ") in text


def test_the_findings_carry_both_and_the_document_places_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTES.md's findings block gets one bullet each; the whole document generates from the fixture runs,
    the codex-client/1 file read only by the agent findings."""
    block = notes_block(RUNS)
    assert block.count("- *The real agent* (`codex`") == 1
    assert block.count("- *vLLM's gateway* (agentic-api in front of `http`)") == 1
    assert set(kept(RUNS)) == {"peer-1k"}
    assert agent_findings.is_codex(RUNS / "codex" / "results.json")
    assert not agent_findings.is_codex(RUNS / "peer-1k" / "results.json")
    text = lab(RUNS)
    assert text.index("## Findings") < text.index("## The real agent") < text.index("## Peers")


def test_a_run_without_per_rollout_overhead_has_no_overhead_gain(tmp_path: Path) -> None:
    """A peer run written before rollout records kept their median turn overhead: the column says so (–),
    the other gains stand."""
    results = _json(RUNS / "peer-1k" / "results.json")
    for run in results["runs"]:
        for r in run["rollout_records"]:
            del r["turn_overhead_ms_p50"]
    (tmp_path / "peer-1k").mkdir()
    (tmp_path / "peer-1k" / "results.json").write_text(json.dumps(results), encoding="utf-8")
    text = "\n".join(agent_findings.sections(tmp_path, kept(tmp_path)))
    for mode in ("http", "ws", "longlived"):
        row = _row(text, mode)
        assert row[6] == "–" and row[4] != "–" and row[5] != "–"


@pytest.mark.parametrize(("keep", "absent"), [("peer-1k", "codex"), ("codex", "peer-1k")])
def test_a_missing_run_leaves_its_section_out(tmp_path: Path, keep: str, absent: str) -> None:
    shutil.copytree(RUNS / keep, tmp_path / keep)
    text, block = lab(tmp_path), notes_block(tmp_path)
    heading = {"codex": "## The real agent", "peer-1k": "## Peers"}
    bullet = {"codex": "- *The real agent*", "peer-1k": "- *vLLM's gateway*"}
    assert heading[keep] in text and bullet[keep] in block
    assert heading[absent] not in text and bullet[absent] not in block


def test_the_kept_runs_generate_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/results as committed: the generator runs, with a section for each run that is kept and none for
    one that is not."""
    monkeypatch.chdir(KEPT.parent.parent)
    directory = Path("docs/results")
    runs = kept(directory)
    text = "\n".join(agent_findings.sections(directory, runs))
    assert ("## The real agent" in text) == (directory / "codex" / "results.json").is_file()
    assert ("## Peers" in text) == any(name in runs for name in agent_findings.PEER_RUNS)


def test_a_speed_whose_processes_waited_for_a_core_is_flagged_noisy(tmp_path: Path) -> None:
    """The codex file's per-speed ``lab_cpu`` (sampled over the Codex rollouts) reads as the lab's noise
    rule does: above 5 % of the CPU time waited, the speed is flagged; a file without it says nothing."""
    results = _json(RUNS / "codex" / "results.json")
    run = agent_findings.load_codex(RUNS)
    assert run is not None and agent_findings.noise_lines(run) == []  # written before the lab sampled it
    first, second = list(results["models"])
    results["models"][first]["lab_cpu"] = {"run_ms": 2000.0, "wait_ms": 40.0}
    results["models"][second]["lab_cpu"] = {"run_ms": 2000.0, "wait_ms": 300.0}
    (tmp_path / "codex").mkdir()
    (tmp_path / "codex" / "results.json").write_text(json.dumps(results), encoding="utf-8")
    run = agent_findings.load_codex(tmp_path)
    assert run is not None
    [line, _] = agent_findings.noise_lines(run)
    a, b = first.removeprefix("mock-"), second.removeprefix("mock-")
    assert f"{a} 2.0%," in line and f"{b} 15.0% (noisy)." in line
    # Beside each speed, the lab client's wait on the same plan: its groups' readings summed, one a group.
    group = {"profile": "local", "workload": "plan", "model": second}
    load = {"before": [0.1, 0.1, 0.1], "after": [0.2, 0.1, 0.1], "cores": 2}
    synthetic = {
        "runs": [
            {**group, "mode": "http", "load": {**load, "lab_cpu": {"run_ms": 1000.0, "wait_ms": 30.0}}},
            {**group, "mode": "ws", "load": {**load, "lab_cpu": {"run_ms": 1000.0, "wait_ms": 30.0}}},
            {
                **group,
                "profile": "remote",
                "mode": "http",
                "load": {**load, "lab_cpu": {"run_ms": 1000.0, "wait_ms": 10.0}},
            },
        ]
    }
    (tmp_path / "codex" / "synthetic" / second).mkdir(parents=True)
    (tmp_path / "codex" / "synthetic" / second / "results.json").write_text(json.dumps(synthetic), "utf-8")
    [line, _] = agent_findings.noise_lines(run, tmp_path)
    assert f"{a} 2.0%," in line and f"{b} 15.0% (noisy) (the lab client: 2.0%)." in line
