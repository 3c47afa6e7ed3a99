"""``responses-lab bench --reconnect K``: two servers share one database, the GA WebSocket client reconnects
to the other one every K turns, and the run reports those turns (the store path) against the cached ones.

Shape and consistency only, never speed: which turns reconnected, that they were served from the store,
that the two sides' counts add up.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from databases import PostgresServer

from proto.lab.analysis.metrics import RECONNECT, SEND, Mark, Trace, store_vs_cached
from proto.lab.bench import main as bench_main

TINY = {
    "format": 1,
    "name": "tiny",
    "first_user_text": "Rename a helper and run the tests.",
    "first_user_tokens": 200,
    "turns": [
        {
            "calls": [{"name": "grep", "arguments": {"pattern": "helper"}}],
            "output_tokens": 12,
            "tool_output_tokens": 80,
            "client_tool_time_s": 0.0,
        },
        {
            "calls": [{"name": "read_file", "arguments": {"path": "a.py"}}],
            "output_tokens": 20,
            "tool_output_tokens": 120,
            "client_tool_time_s": 0.0,
        },
        {
            "calls": [{"name": "run_tests", "arguments": {}}],
            "output_tokens": 8,
            "tool_output_tokens": 40,
            "client_tool_time_s": 0.0,
        },
        {"say": "Renamed; tests pass.", "output_tokens": 15},
    ],
}


@pytest.mark.process
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_bench_reconnect_reports_the_store_path_against_the_cached_one(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    workload = tmp_path / "tiny.json"
    workload.write_text(json.dumps(TINY), encoding="utf-8")
    flags: list[str] = []
    url = None
    if database == "postgresql":
        pg: PostgresServer = request.getfixturevalue("pg")
        url = pg.fresh()
        flags = ["--db", url]
    code = bench_main(
        [
            "--modes",
            "ws,http-prev",
            "--workload",
            str(workload),
            "--model",
            "mock-4000tps",
            "--profile",
            "local",
            "--sessions",
            "2",
            "--rollouts",
            "2",
            "--warmup",
            "0",
            "--pings",
            "5",
            "--reconnect",
            "2",
            "--no-plots",
            "--out",
            str(tmp_path / "out"),
            "--model-override",
            "mock-4000tps:prefill-overhead=5,prefill-time-per-token=0",
            # the fast model's calibration (240 rounds a mode) is test_lab_e2e's subject, not this one's
            "--no-predict",
            *flags,
        ]
    )
    assert code == 0
    runs = {run["mode"]: run for run in json.loads((tmp_path / "out" / "results.json").read_text())["runs"]}
    split = runs["ws"]["store_vs_cached"]
    # Four sends per rollout; continuation turns 1, 2, 3; a reconnect before turn 2: one store turn, two
    # cached, in each of 2 sessions x 2 rollouts.
    assert (split["store"]["turns"], split["cached"]["turns"]) == (4, 8)
    assert all(split[side][key] > 0 for side in split for key in ("ttft_ms_p50", "turn_overhead_ms_p50"))
    assert runs["ws"]["phases_ms"].get("store_load", 0) > 0  # those turns loaded their chain from the store
    assert runs["http-prev"]["store_vs_cached"] == {}  # the knob is the GA WebSocket mode's
    if url is not None:  # both servers wrote the one database: each ws turn billed once, in SQL
        with psycopg.connect(url, autocommit=True) as conn:
            [(rows, ids)] = conn.execute(
                "SELECT count(*), count(DISTINCT response_id) FROM usage WHERE mode = 'ws'"
            ).fetchall()
        assert rows == ids == 2 * 2 * 4


def test_store_vs_cached_splits_turns_at_reconnect_marks() -> None:
    marks = [Mark(0.0, SEND), Mark(0.01, "response.output_text.delta"), Mark(0.02, "response.completed")]
    for k in (1, 2, 3):
        t = k * 0.1
        if k == 2:
            marks.append(Mark(t - 0.001, RECONNECT))
        marks += [
            Mark(t, SEND),
            Mark(t + 0.005 * k, "response.output_text.delta"),
            Mark(t + 0.02, "response.completed"),
        ]
    trace = Trace(
        "ws", marks=marks, reports=[{"output_tokens": 1, "prefill_ms": 1.0, "queue_wait_ms": 0.0}] * 4
    )
    split = store_vs_cached([trace])
    assert split["store"]["turns"] == 1 and split["cached"]["turns"] == 2
    assert split["store"]["ttft_ms_p50"] == pytest.approx(10.0)  # turn 2: 0.005 x 2 s
    assert split["cached"]["ttft_ms_p50"] == pytest.approx(10.0)  # turns 1 and 3: 5 and 15 ms
    assert split["store"]["turn_overhead_ms_p50"] == pytest.approx(9.0)
    assert (
        store_vs_cached(
            [
                Trace(
                    "ws", marks=marks[:3], reports=[{"output_tokens": 1, "prefill_ms": 0, "queue_wait_ms": 0}]
                )
            ]
        )
        == {}
    )
