"""The lab's experimental design and statistics (docs/lab.md, "Statistics"): paired gains with bootstrap
intervals, the counterbalanced order, per-rollout seeds, provenance; and one small real run over loopback
whose results carry all of it."""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import subprocess
import sys
from collections import Counter

import msgspec
import numpy as np
import pytest
from test_lab_records import made_up_run

from proto.client.frames import SENT, Frame
from proto.client.http import HttpClient
from proto.lab.analysis.stats import FASTER, FEW, SAME, SLOWER, paired_gain, percentiles
from proto.lab.config import PROFILES, BenchConfig, jitter_overrides
from proto.lab.records import (
    ROOT,
    CpuTime,
    Floor,
    Load,
    RolloutRecord,
    RunRecord,
    TreeCpuSampler,
    cpu_between,
    noise,
    provenance,
    run_of,
    tree_cpu,
)
from proto.lab.report.results import add_gains, design_json, floors_json, run_record
from proto.lab.run.design import draw_tool_times, mode_order, rollout_seed, williams_rows
from proto.lab.run.runner import CellResult, run_bench, server_flags
from proto.lab.workload.synthetic import TOOL_P50_S, coding_agent
from proto.lab.workload.traces import load_replay
from proto.server.serve import ThreadedServer

# ---- the paired gain ----------------------------------------------------------------------------


def test_a_known_paired_sample_gives_the_normal_theory_interval() -> None:
    # 400 pairs whose per-pair gain is N(-0.10, 0.05): the mean's 95 % interval is -0.10 ± 1.96 × 0.05 / 20
    # (± 0.0049) around the sample's own mean; the bootstrap's must agree to a few per cent of its width.
    rng = np.random.default_rng(7)
    base = rng.uniform(50, 150, 400)
    d = rng.normal(-0.10, 0.05, 400)
    g = paired_gain(list(base * (1 + d)), list(base), baseline="http", metric="e2e", seed=3)
    half = 1.96 * d.std(ddof=1) / 20
    assert g.pairs == 400 and g.verdict == FASTER
    assert g.gain == pytest.approx(d.mean(), abs=1e-12)
    assert g.low is not None and g.high is not None
    assert g.low == pytest.approx(d.mean() - half, abs=0.1 * half)
    assert g.high == pytest.approx(d.mean() + half, abs=0.1 * half)
    again = paired_gain(list(base * (1 + d)), list(base), baseline="http", metric="e2e", seed=3)
    assert again == g  # a fixed seed: a file recomputes to the same interval


def test_pairing_removes_the_between_rollout_spread() -> None:
    # Rollouts that differ 3x among themselves, each pair 5 % faster ± 1 %: paired, the gain is certain.
    rng = np.random.default_rng(1)
    base = rng.uniform(10, 30, 12)
    mode = base * rng.normal(0.95, 0.01, 12)
    g = paired_gain(list(mode), list(base), baseline="http", metric="e2e")
    assert g.verdict == FASTER and g.high is not None and g.high < -0.03


def test_a_zero_centred_sample_is_no_difference() -> None:
    rng = np.random.default_rng(11)
    base = rng.uniform(80, 120, 30)
    d = rng.normal(0.0, 0.05, 30)
    d -= d.mean()  # centred exactly on 0
    g = paired_gain(list(base * (1 + d)), list(base), baseline="http-cached", metric="ttft")
    assert g.low is not None and g.high is not None and g.low < 0 < g.high
    assert g.verdict == SAME


def test_slower_too_few_and_identical_pairs() -> None:
    base = [10.0, 12.0, 11.0, 13.0, 9.0]
    slower = paired_gain([b * 1.2 + 0.1 * i for i, b in enumerate(base)], base, baseline="http", metric="e2e")
    assert slower.verdict == SLOWER
    few = paired_gain([9.0, 10.0], [10.0, 11.0], baseline="http", metric="e2e")
    assert few.verdict == FEW and few.low is None and few.gain is not None
    same = paired_gain([b * 0.9 for b in base], base, baseline="http", metric="e2e")
    assert same.low == same.high == pytest.approx(-0.1) and same.verdict == FASTER
    with pytest.raises(ValueError):
        paired_gain([1.0], [1.0, 2.0], baseline="http", metric="e2e")


def test_percentiles_are_numpys() -> None:
    xs = [float(x) for x in range(1, 101)]
    p = percentiles(xs)
    assert p.p50 == 50.5 and p.p90 == pytest.approx(90.1) and p.p99 == pytest.approx(99.01) and p.n == 100
    assert percentiles([]).p50 is None


# ---- the order ----------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [2, 3, 4, 5])
def test_the_order_is_a_williams_design(m: int) -> None:
    rows = williams_rows(m)
    assert len(rows) == (m if m % 2 == 0 else 2 * m)
    for row in rows:
        assert sorted(row) == list(range(m))
    per = len(rows) // m
    for position in range(m):  # every mode in every position equally often
        assert Counter(row[position] for row in rows) == {k: per for k in range(m)}
    follows = Counter((a, b) for row in rows for a, b in itertools.pairwise(row))
    assert set(follows.values()) == {per}  # every mode right after every other equally often
    assert len(follows) == m * (m - 1)


def test_mode_order_cycles_over_the_rows() -> None:
    modes = ("http", "http-cached", "http-prev", "ws", "longlived")
    orders = [mode_order(modes, i) for i in range(10)]
    assert len(set(orders)) == 10
    assert mode_order(modes, 10) == orders[0]
    assert Counter(o[-1] for o in orders) == dict.fromkeys(modes, 2)  # longlived is not always last


# ---- the seeds ----------------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_tool_times() -> None:
    session = load_replay("coding-agent").sessions[0]
    a, b = draw_tool_times(session, 1_000_000), draw_tool_times(session, 1_000_000)
    c = draw_tool_times(session, rollout_seed(1, 1, 0))
    waits = [r.tool_wait_s for r in a.rounds]
    assert waits == [r.tool_wait_s for r in b.rounds]
    assert waits != [r.tool_wait_s for r in c.rounds]
    assert waits != [r.tool_wait_s for r in session.rounds]  # not the workload file's single draw
    for old, new in zip(session.rounds, a.rounds, strict=True):  # only the waits change
        assert (old.calls, old.output_tokens, old.result_tokens) == (
            new.calls,
            new.output_tokens,
            new.result_tokens,
        )
        if not old.calls:
            assert new.tool_wait_s == old.tool_wait_s
    assert len({rollout_seed(1, i, s) for i in range(100) for s in range(50)}) == 5000


@pytest.mark.slow
def test_draws_cover_the_fitted_distribution() -> None:
    # One call per round: the round's median over many seeds is the fit's p50 (0.3 s).
    workload = coding_agent(30)
    single = [k for k, t in enumerate(workload["turns"]) if len(t.get("calls", [])) == 1]
    session = load_replay("coding-agent").sessions[0]
    draws = [draw_tool_times(session, s).rounds[single[0]].tool_wait_s for s in range(2000)]
    assert statistics.median(draws) == pytest.approx(TOOL_P50_S, rel=0.15)


# ---- provenance, noise, jitter ------------------------------------------------------------------


def test_provenance_names_the_commit_the_cpu_and_the_versions() -> None:
    p = provenance()
    assert p.commit is not None and len(p.commit) == 40 and isinstance(p.dirty, bool)
    assert p.cpu_model and p.kernel and p.cores >= 1 and p.cores_usable >= 1
    assert p.python.count(".") == 2
    assert p.uvloop is not None  # a dev install has it (pyproject's dev extra)
    assert p.scheduler is not None and p.scheduler.startswith(
        ("SCHED_OTHER nice ", "SCHED_RR ", "SCHED_FIFO ")
    )


def test_a_noisy_cell_says_why() -> None:
    quiet = Load((0.5, 0.4, 0.3), (1.2, 0.5, 0.3), 2)
    busy = Load((0.5, 0.4, 0.3), (2.5, 0.5, 0.3), 2)
    calm = Floor("ws_ping", 100, 0.08, 0.09, 0.12, 0.44)
    wide = Floor("http_noop", 100, 0.5, 1.0, 2.6, 2.1)
    assert noise(quiet, [calm]) == []
    assert noise(busy, [calm]) == ["load 2.50 > 1 x 2 cores"]
    assert noise(quiet, [wide]) == ["http_noop floor spread 2.10 > 1"]


def test_the_labs_own_wait_for_a_core_decides_where_the_kernel_says_it() -> None:
    """With schedstat, the machine's load average alone does not flag a cell: the lab's own processes'
    run-queue wait does."""
    calm = Floor("ws_ping", 100, 0.08, 0.09, 0.12, 0.44)
    shared_but_served = Load((6.0, 5.0, 4.0), (7.0, 5.0, 4.0), 2, CpuTime(run_ms=1000.0, wait_ms=20.0))
    starved = Load((0.5, 0.4, 0.3), (0.9, 0.5, 0.3), 2, CpuTime(run_ms=1000.0, wait_ms=300.0))
    assert noise(shared_but_served, [calm]) == []
    assert noise(starved, [calm]) == ["the lab's processes waited for a core 30.0% of their CPU time > 5%"]


@pytest.mark.process
def test_the_lab_reads_its_own_process_trees_cpu_and_wait() -> None:
    before = tree_cpu()
    assert before is not None and any(pid == os.getpid() for pid, _ in before)
    child = subprocess.Popen([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"])
    seen = tree_cpu()
    child.wait()
    assert seen is not None and any(pid == child.pid for pid, _ in seen)  # a descendant is counted
    sum(i * i for i in range(1_000_000))
    spent = cpu_between(before, tree_cpu())
    assert spent is not None and spent.run_ms > 0 and spent.wait_ms >= 0


BUSY = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end:\n    pass\n"


@pytest.mark.process
async def test_the_sampler_counts_a_child_that_ended_between_two_readings() -> None:
    """A child that spends 0.4 s on a core and exits: two bare readings around it miss it (it is gone at the
    second), the sampler counts it up to its last sample (at most one period short)."""
    before = tree_cpu()
    async with TreeCpuSampler(period_s=0.05) as sampled:
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", BUSY)
        await child.wait()
    bare, spent = cpu_between(before, tree_cpu()), sampled.cpu()
    assert bare is not None and spent is not None
    assert spent.run_ms - bare.run_ms > 250  # the child's 400 ms, less at most its last 50 ms period
    assert spent.wait_ms >= 0


def test_jitter_is_on_by_default_seeded_and_can_be_turned_off() -> None:
    config = BenchConfig(models=("mock-1000tps", "mock-4000tps"), seed=7)
    assert jitter_overrides(config) == (
        "mock-1000tps:ttft-jitter-std=0.08,itl-jitter-std=0.1,seed=7",
        "mock-4000tps:ttft-jitter-std=0.08,itl-jitter-std=0.1,seed=7",
    )
    config.model_overrides = ("mock-1000tps:itl-jitter-std=0",)
    flags = server_flags(PROFILES["local"], config)
    overrides = [flags[i + 1] for i, f in enumerate(flags) if f == "--model-override"]
    assert overrides == [
        *jitter_overrides(config),
        "mock-1000tps:itl-jitter-std=0",
    ]  # the user's last: it wins
    config.jitter = False
    assert jitter_overrides(config) == ()
    assert "ttft-jitter-std" not in " ".join(server_flags(PROFILES["local"], config))


def test_a_default_cell_has_ten_rollouts_a_mode_and_quick_says_it_has_fewer() -> None:
    default, quick = design_json(BenchConfig()), design_json(BenchConfig.quick_preset())
    assert default["rollouts_per_mode"] >= default["default_rollouts_per_mode_at_least"] == 10
    assert quick["quick"] is True and quick["rollouts_per_mode"] == 4
    assert default["sign"].endswith("negative = faster than the baseline")
    assert default["jitter"] == {"ttft-jitter-std": 0.08, "itl-jitter-std": 0.1, "seed": 1}


def test_gains_pair_rollouts_by_index_and_session() -> None:
    def run(mode: str, e2e: list[float]) -> RunRecord:
        records = [
            RolloutRecord(i // 2, i % 2, None, 0, x, 10 * x, 1, 0.0, "completed") for i, x in enumerate(e2e)
        ]
        return made_up_run("local", "w", "m", mode, rollout_records=records)

    base = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    runs = [
        run("http", base),
        run("http-cached", [x * 0.9 for x in base]),
        run("ws", [x * 0.8 for x in base]),
    ]
    assert isinstance(runs[2].rollout_records, list)
    runs[2].rollout_records = list(reversed(runs[2].rollout_records))
    old = made_up_run("local", "w", "m2", "ws")  # a format-1 run: left alone
    add_gains([*runs, old])
    ws = runs[2].gains
    assert isinstance(ws, dict) and isinstance(runs[0].gains, dict)
    assert ws["http"]["e2e"].gain == pytest.approx(-0.2) and ws["http"]["e2e"].pairs == 6
    assert ws["http-cached"]["ttft"].gain == pytest.approx(0.8 / 0.9 - 1)
    assert list(runs[0].gains) == ["http-cached"]  # not against itself
    assert old.gains is msgspec.UNSET


def test_pooled_floors_count_each_group_once() -> None:
    f = [Floor("ws_ping", 9, None, 0.1, None, None), Floor("http_noop", 9, None, 1.0, None, None)]
    runs = [made_up_run("local", "w", "m", m, floors=f) for m in ("http", "ws")]
    pooled = floors_json(runs)
    assert pooled["ws_ping"]["n"] == 1 and pooled["http_noop"]["p50"] == 1.0


# ---- over loopback ------------------------------------------------------------------------------


@pytest.mark.process
def test_a_small_run_records_the_design_the_floors_and_the_gains() -> None:
    modes = ("http", "http-cached", "longlived")
    config = BenchConfig(
        modes=modes,
        models=("mock-4000tps",),
        profiles=("local",),
        sessions=1,
        rollouts=3,
        turns=4,
        tool_time_scale=0.01,
        pings=30,
        predict=False,
        seed=5,
    )
    cells: list[CellResult] = []
    result = asyncio.run(run_bench(config, on_done=cells.append))
    assert [c.mode for c in cells] == list(modes)
    runs = [msgspec.to_builtins(run_record(c)) for c in cells]
    add_gains(typed := [run_of(r) for r in runs], config.seed)
    runs = msgspec.to_builtins(typed)  # the entries as results.json holds them
    orders = runs[0]["orders"]
    assert orders == [list(mode_order(modes, i)) for i in range(3)]
    assert {tuple(o) for o in orders} == {tuple(mode_order(modes, i)) for i in range(3)}
    for run in runs:
        assert run["orders"] == orders and run["blocks"] == 1
        records = run["rollout_records"]
        assert [(r["index"], r["session"], r["seed"]) for r in records] == [
            (i, 0, rollout_seed(5, i, 0)) for i in range(3)
        ]
        for r in records:  # where the mode ran in its index's order
            assert orders[r["index"]][r["position"]] == run["mode"]
            assert r["turns"] == 4 and r["status"] == "completed" and r["e2e_s"] > 0
        assert run["e2e_s_pct"]["n"] == 3 and run["ttft_ms_pct"]["n"] == 12
        assert run["e2e_s_pct"]["p50"] <= run["e2e_s_pct"]["p90"] <= run["e2e_s_pct"]["p99"]
        assert {f["name"]: f["n"] for f in run["floors"]} == {"ws_ping": 30, "http_noop": 30}
        assert all(f["p50"] > 0 for f in run["floors"])
        assert len(run["load"]["before"]) == 3 and run["load"]["cores"] >= 1
        assert isinstance(run["noisy"], list)
    # every mode replayed the same tool times: the same seed, the same planned waits
    waits = {run["mode"]: [r["tool_wait_s"] for r in run["rollout_records"]] for run in runs}
    assert waits["http"] == waits["http-cached"] == waits["longlived"]
    longlived = runs[2]["gains"]
    for baseline in ("http", "http-cached"):
        for metric in ("e2e", "ttft"):
            g = longlived[baseline][metric]
            assert g["pairs"] == 3 and g["low"] is not None and g["low"] <= g["gain"] <= g["high"]
    assert result.pings_ms["local"] and len(result.pings_ms["local"]) == 30


def test_the_http_send_mark_is_taken_where_the_bytes_leave(server: ThreadedServer) -> None:
    async def go(url: str) -> None:
        frames: list[Frame] = []
        async with HttpClient(url, observer=frames.append) as client:
            request = client._request({"model": "mock-4000tps", "input": "hi", "stream": True})
            assert frames == []  # built, not sent: no mark yet
            response = await client.http.send(request, stream=True)
            await response.aclose()
            assert [f.direction for f in frames] == [SENT] and frames[0].wire_bytes > 0
            frames.clear()
            r = await client.get("/healthz")
            assert r.status_code == 200 and [f.direction for f in frames] == [SENT]

    asyncio.run(go(server.http_url))


@pytest.mark.process  # runs git to check the reading of its files
def test_the_commit_and_dirty_flag_agree_with_git() -> None:
    import subprocess

    p = provenance()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet"], capture_output=True)
    assert p.commit == head.stdout.strip()
    assert p.dirty == (diff.returncode == 1)


@pytest.mark.process
def test_fresh_server_starts_new_servers_per_rollout_index() -> None:
    config = BenchConfig(
        modes=("http", "ws"),
        models=("mock-4000tps",),
        profiles=("local",),
        sessions=1,
        rollouts=2,
        turns=3,
        tool_time_scale=0.0,
        pings=10,
        predict=False,
        fresh_server=True,
    )
    cells: list[CellResult] = []
    asyncio.run(run_bench(config, on_done=cells.append))
    runs = [msgspec.to_builtins(run_record(c)) for c in cells]
    assert [r["mode"] for r in runs] == ["http", "ws"]
    for run in runs:
        assert run["blocks"] == 2 and [r["index"] for r in run["rollout_records"]] == [0, 1]
        assert run["orders"] == [["http", "ws"], ["ws", "http"]]
    assert cells[0].server_cpu_s is not None and cells[0].server_cpu_s > 0  # summed over both servers
