"""``responses-lab bench --peer agentic-api``: vLLM's gateway (the pinned wheel ``make peers`` installs) in
front of a real upstream server on loopback, measured beside ``ws`` and ``longlived``, with the split of
each turn's TTFT between the gateway and the upstream.

Shape, counts and arithmetic only, never speed: the rows exist, every tool call the upstream's model made
is counted from the upstream's own log, each turn's split adds up to the TTFT the lab measured.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from proto.lab.bench import main as bench_main
from proto.lab.run.peers import AGENTIC_API_VERSION, CLIENT_ONLY, PeerUnavailable, agentic_api, agentic_server

TOOL_LOOP = {
    "format": 1,
    "name": "tool-loop",
    "first_user_text": "Find the helper, read it, run the tests.",
    "first_user_tokens": 300,
    "turns": [
        {
            "calls": [{"name": "grep", "arguments": {"pattern": "helper"}}],
            "output_tokens": 12,
            "tool_output_tokens": 400,
            "client_tool_time_s": 0.0,
        },
        {
            "calls": [{"name": "read_file", "arguments": {"path": "a.py"}}],
            "output_tokens": 20,
            "tool_output_tokens": 600,
            "client_tool_time_s": 0.0,
        },
        {
            "calls": [{"name": "run_tests", "arguments": {}}],
            "output_tokens": 8,
            "tool_output_tokens": 200,
            "client_tool_time_s": 0.0,
        },
        {"say": "The helper is fine; tests pass.", "output_tokens": 15},
    ],
}
ROLLOUTS = 2


def _bench(tmp_path: Path, *flags: str) -> tuple[int, Path]:
    workload = tmp_path / "tool-loop.json"
    workload.write_text(json.dumps(TOOL_LOOP), encoding="utf-8")
    out = tmp_path / "out"
    code = bench_main(
        [
            "--workload",
            str(workload),
            "--model",
            "mock-4000tps",
            "--profile",
            "local",
            "--sessions",
            "1",
            "--rollouts",
            str(ROLLOUTS),
            "--warmup",
            "0",
            "--pings",
            "5",
            "--no-predict",
            "--no-plots",
            "--out",
            str(out),
            *flags,
        ]
    )
    return code, out


@pytest.mark.process
@pytest.mark.nonconforming(
    "agentic-api 0.9.0's Response objects omit fields the spec requires (reasoning, store, metadata, …) and "
    'echo tool_choice null: another project\'s server, measured as it is (docs/lab.md, "Peers")'
)
def test_agentic_api_runs_beside_ws_and_longlived_with_its_split(tmp_path: Path) -> None:
    code, out = _bench(tmp_path, "--modes", "ws,longlived", "--peer", "agentic-api")
    assert code == 0
    runs = {r["mode"]: r for r in json.loads((out / "results.json").read_text(encoding="utf-8"))["runs"]}
    assert set(runs) == {"ws", "longlived", "agentic-api"}
    turns = len(TOOL_LOOP["turns"])  # type: ignore[arg-type]
    for run in runs.values():
        assert run["statuses"] == ["completed"]
        assert run["turns"] == ROLLOUTS * turns
    # The same plan, the same prompts: the gateway sent upstream exactly what the lab's ws client sends.
    assert runs["agentic-api"]["usage"]["input_tokens"] == runs["ws"]["usage"]["input_tokens"]
    assert runs["agentic-api"]["usage"]["output_tokens"] == runs["ws"]["usage"]["output_tokens"]
    assert "peer" not in runs["ws"] and "peer" not in runs["longlived"]

    peer: dict[str, Any] = runs["agentic-api"]["peer"]
    assert (peer["name"], peer["version"], peer["upstream"]) == ("agentic-api", AGENTIC_API_VERSION, "http")
    # Every call the upstream's model made, from the upstream's own log: each tool once per rollout.
    assert peer["upstream_calls"] == {"grep": ROLLOUTS, "read_file": ROLLOUTS, "run_tests": ROLLOUTS}
    # The upstream's report reached the row as the other modes' terminal events bring it.
    assert runs["agentic-api"]["phases_ms"]["render_tokenize"] > 0
    assert runs["agentic-api"]["prefill_ms_per_turn"] > 0
    # The split: one row per turn, gateway + upstream = the TTFT the lab measured for that turn.
    rows = peer["turns"]
    assert len(rows) == ROLLOUTS * turns
    for row in rows:
        assert row["upstream_ms"] > 0
        assert math.isclose(row["gateway_ms"] + row["upstream_ms"], row["ttft_ms"], abs_tol=1e-6)
    assert sorted(round(r["ttft_ms"], 3) for r in rows) == sorted(runs["agentic-api"]["ttft_ms_all"])
    assert len(peer["gateway_ms_by_turn"]) == len(peer["upstream_ms_by_turn"]) == turns


def test_a_missing_agentic_api_fails_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RESPONSES_LAB_PEERS_DIR", str(tmp_path / "nothing-here"))
    with pytest.raises(PeerUnavailable, match="make peers"):
        agentic_server()
    code, out = _bench(tmp_path, "--modes", "ws", "--peer", "agentic-api")
    assert code == 1
    assert "agentic-api 0.9.0 is not installed" in capsys.readouterr().err
    assert not (out / "results.json").exists()  # refused before any cell ran


@pytest.mark.process
@pytest.mark.nonconforming("agentic-api 0.9.0 stands for any other Responses server here: see above")
def test_url_measures_any_responses_server_from_the_client_side(tmp_path: Path) -> None:
    """agentic-api as a server the user started: timed from the client side only, and the rows say so;
    what needs the server's own report reads as unknown (null), never 0."""
    with agentic_api(["--log-level", "warning"]) as (_, gateway):
        code, out = _bench(tmp_path, "--url", gateway.ws_url, "--modes", "ws,http-prev")
    assert code == 0
    runs = {r["mode"]: r for r in json.loads((out / "results.json").read_text(encoding="utf-8"))["runs"]}
    assert set(runs) == {"ws", "http-prev"}
    for run in runs.values():
        assert run["profile"] == "external"
        assert run["peer"] == {"name": "external", "url": gateway.ws_url, "timing": CLIENT_ONLY}
        assert run["statuses"] == ["completed"]
        assert run["turns"] == ROLLOUTS * len(TOOL_LOOP["turns"])  # type: ignore[arg-type]
        assert run["ttft_ms_p50"] > 0 and run["e2e_s_p50"] > 0
        assert run["turn_overhead_ms_p50"] is None and run["prefill_ms_per_turn"] is None
        assert run["usage"]["output_tokens"] > 0


@pytest.mark.slow
def test_the_fast_models_curves_leave_a_peer_out() -> None:
    """A run with ``--peer`` and its prediction on composes the fast model's curves for this server's modes
    only: a peer's mode has no fit (it was a KeyError that ended the run after its calibration)."""
    from proto.lab.analysis.predict import Calibration
    from proto.lab.analysis.sweep import sweep

    kept = json.loads(Path("docs/results/speed/results.json").read_text(encoding="utf-8"))
    rows = sweep(Calibration.from_json(kept["calibration"]), ("http", "agentic-api"), 0.1)
    assert rows and {row["mode"] for row in rows} == {"http"}
