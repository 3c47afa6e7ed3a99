"""``responses-lab bench fleet``: a small fleet through a real server and engine process, every mode on the
same arrival schedule and tool times, its figures held to the engine's own /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from proto.core.response import MODES
from proto.engine.routing import POLICIES
from proto.lab.analysis.fleet_stats import summarize
from proto.lab.run.fleet import FleetCell, FleetConfig, arrivals, main, run_fleet

SMALL = FleetConfig(
    modes=tuple(MODES),
    model="mock-4000tps",
    agents=(6,),
    rate=8.0,
    turns=3,
    tool_time_scale=0.02,
    pins=(True,),
    seed=7,
)


def test_arrivals_are_a_seeded_poisson_schedule() -> None:
    a = arrivals(2000, 4.0, seed=3)
    assert a == arrivals(2000, 4.0, seed=3)
    assert a != arrivals(2000, 4.0, seed=4)
    assert a[0] == 0.0 and all(x < y for x, y in itertools.pairwise(a))
    gaps = [y - x for x, y in itertools.pairwise(a)]
    mean = sum(gaps) / len(gaps)
    assert 0.9 * 0.25 < mean < 1.1 * 0.25  # exponential gaps of mean 1 / rate
    # Exponential: the standard deviation equals the mean (a fixed-gap schedule would have none).
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert 0.85 < sd / mean < 1.15
    with pytest.raises(ValueError):
        arrivals(3, 0.0, seed=1)


@pytest.fixture(scope="module")
def pinned_cells() -> list[FleetCell]:
    return asyncio.run(run_fleet(SMALL))


@pytest.fixture(scope="module")
def unpinned_cells() -> list[FleetCell]:
    return asyncio.run(run_fleet(dataclasses.replace(SMALL, modes=("longlived",), pins=(False,))))


@pytest.mark.process
def test_every_mode_runs_the_same_schedule_and_draws(pinned_cells: list[FleetCell]) -> None:
    assert [c.mode for c in pinned_cells] == list(MODES)
    for c in pinned_cells:
        assert c.settled
        assert c.arrivals_s == arrivals(6, 8.0, seed=7)
        assert c.seeds == pinned_cells[0].seeds and len(set(c.seeds)) == 6
        assert c.rollouts == c.completed == 6
        assert c.turns == 6 * 3  # every agent's every turn reported
        assert c.slo_met <= c.rollouts and c.goodput_rps == pytest.approx(c.slo_met / c.wall_s)
        assert c.e2e_s_p50 <= c.e2e_s_p99 and c.ttft_ms_p50 <= c.ttft_ms_p99


@pytest.mark.process
def test_the_figures_are_the_engines_own(pinned_cells: list[FleetCell]) -> None:
    for c in pinned_cells:
        # Every turn the clients saw is one engine request, and the queue wait the server reported per
        # turn sums to the engine's queue-time histogram.
        assert c.engine_requests == c.turns
        assert c.queue_wait_ms_sum == pytest.approx(c.engine_queue_time_ms_sum, rel=1e-6, abs=1e-3 * c.turns)
        # A cache far above demand: nothing preempted.
        assert c.engine_preemptions == 0
        assert c.kv_samples > 0
        for _, used, pinned, _ in c.kv_trace:
            assert 0 <= pinned <= used <= c.kv_blocks
        # The client's cached/prompt ratio counts the same lookups the engine's counters do.
        assert c.prefix_hit_rate_client == pytest.approx(c.engine_prefix_hit_rate, abs=0.02)


@pytest.mark.process
def test_pinning_holds_suspended_kv_only_when_on(
    pinned_cells: list[FleetCell], unpinned_cells: list[FleetCell]
) -> None:
    on = next(c for c in pinned_cells if c.mode == "longlived")
    (off,) = unpinned_cells
    assert on.pin_suspended and not off.pin_suspended
    assert on.kv_pinned_max > 0  # suspended long-lived responses hold their blocks through tool time
    assert off.kv_pinned_max == 0  # off: stored but evictable at once
    assert off.arrivals_s == on.arrivals_s and off.seeds == on.seeds


@pytest.mark.process
def test_a_kv_budget_below_demand_queues_and_loses_prefix_hits(
    pinned_cells: list[FleetCell], tmp_path: Path
) -> None:
    """The same schedule and draws on 1 200 blocks (six agents' prompts need ~450 each): turns wait for KV
    in the engine's queue and suspended prefixes are evicted, so the queue wait grows and the hit rate
    falls. Through the command line, which writes fleet.json."""
    out = tmp_path / "fleet"
    argv = ["--modes", "longlived", "--agents", "6", "--rate", "8", "--turns", "3", "--tool-time-scale"]
    argv += ["0.02", "--pin", "on", "--kv-blocks", "1200", "--seed", "7", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads((out / "fleet.json").read_text())
    # what ran and where: the command, the checkout and machine; complete (rewritten after every cell)
    assert doc["command"] == "responses-lab bench fleet " + " ".join(argv) and doc["complete"] is True
    assert doc["provenance"]["commit"] and doc["provenance"]["cpu_model"]
    (tight,) = doc["cells"]
    roomy = next(c for c in pinned_cells if c.mode == "longlived")
    assert tight["kv_blocks"] == 1200 and roomy.kv_blocks > 6 * 3 * 500
    assert tight["arrivals_s"] == roomy.arrivals_s and tight["seeds"] == roomy.seeds
    assert tight["completed"] == 6
    assert tight["engine_requests"] == tight["turns"] == 18
    assert tight["queue_wait_ms_sum"] == pytest.approx(tight["engine_queue_time_ms_sum"], rel=1e-6, abs=0.02)
    assert tight["queue_wait_ms_sum"] > roomy.queue_wait_ms_sum
    assert tight["engine_prefix_hit_rate"] < roomy.engine_prefix_hit_rate
    assert all(0 <= pinned <= used for _, used, pinned, _ in tight["kv_trace"])


# ---- replicas and routing ----------------------------------------------------------------------------

ROUTED = dataclasses.replace(
    SMALL, modes=("http", "ws", "longlived"), agents=(4,), replicas=(2,), routings=POLICIES, pins=(True,)
)


@pytest.fixture(scope="module")
def routed_cells() -> list[FleetCell]:
    return asyncio.run(run_fleet(ROUTED))


def _cell(cells: list[FleetCell], mode: str, routing: str) -> FleetCell:
    return next(c for c in cells if c.mode == mode and c.routing == routing)


@pytest.mark.process
def test_every_engine_request_is_counted_once_across_replicas(routed_cells: list[FleetCell]) -> None:
    assert {(c.mode, c.routing) for c in routed_cells} == {(m, r) for m in ROUTED.modes for r in POLICIES}
    for c in routed_cells:
        assert c.replicas == 2 and len(c.replica_requests) == 2
        assert c.settled and c.completed == c.rollouts == 4
        assert c.arrivals_s == arrivals(4, 8.0, seed=7)  # one schedule for every mode and policy
        assert sum(c.replica_requests) == c.engine_requests == c.turns == 4 * 3
        assert sum(c.replica_prefix_hits) / sum(c.replica_prefix_queries) == pytest.approx(
            c.engine_prefix_hit_rate
        )
        assert c.prefix_hit_rate_client == pytest.approx(c.engine_prefix_hit_rate, abs=0.02)
        # the lab's own processes over the cell (clients, server, both engines), from schedstat
        assert c.lab_run_ms is not None and c.lab_run_ms > 0
        assert c.lab_wait_ms is not None and c.lab_wait_ms >= 0
        # per rollout, the same tokens: the clients' rate rollout by rollout, for its interval over agents
        assert len(c.rollout_prompt_tokens) == len(c.rollout_cached_tokens) == 4
        assert sum(c.rollout_cached_tokens) / sum(c.rollout_prompt_tokens) == pytest.approx(
            c.prefix_hit_rate_client
        )
    for s in summarize(routed_cells):
        rate = s.client_hit_rate
        assert rate is not None and rate.n == 4 and rate.resampled == "rollouts"
        cells = [c for c in routed_cells if (c.mode, c.routing) == (s.mode, s.routing)]
        assert rate.value == pytest.approx(sum(c.prefix_hit_rate_client for c in cells) / len(cells))
        assert rate.low is not None and rate.high is not None and rate.low <= rate.high


@pytest.mark.process
def test_a_long_lived_response_and_a_sticky_connection_stay_on_their_replica(
    routed_cells: list[FleetCell],
) -> None:
    """Each long-lived rollout is one response: all its 3 turns on the replica its first turn went to,
    under every policy. Each ws rollout is one connection, three responses, and so is each http rollout
    (one keep-alive connection): under sticky all three go where the first went. Either way each replica
    served a whole number of rollouts."""
    cells = [_cell(routed_cells, "longlived", routing) for routing in POLICIES]
    for c in [*cells, _cell(routed_cells, "ws", "sticky"), _cell(routed_cells, "http", "sticky")]:
        assert all(n % 3 == 0 for n in c.replica_requests), (c.mode, c.routing, c.replica_requests)


@pytest.mark.process
def test_prefix_aware_routing_hits_more_than_random_for_http(routed_cells: list[FleetCell]) -> None:
    """HTTP responses are routed turn by turn: random sends a rollout's next turn to the replica without its
    prefix about half the time; prefix-aware sends it where its prefix went."""
    aware, rand = _cell(routed_cells, "http", "prefix-aware"), _cell(routed_cells, "http", "random")
    assert aware.engine_prefix_hit_rate > rand.engine_prefix_hit_rate
    assert aware.arrivals_s == rand.arrivals_s and aware.seeds == rand.seeds


@pytest.mark.process
def test_least_loaded_balances_the_replicas(routed_cells: list[FleetCell]) -> None:
    for mode in ROUTED.modes:
        a, b = _cell(routed_cells, mode, "least-loaded").replica_requests
        assert abs(a - b) <= 3, (mode, a, b)  # at most one rollout's turns apart


@pytest.mark.process
def test_the_summary_pairs_modes_and_routings(routed_cells: list[FleetCell]) -> None:
    summary = summarize(routed_cells)
    assert len(summary) == len(routed_cells)
    for s in summary:
        assert s.repeats == 1 and s.e2e_s_p50.n == 4
        assert s.e2e_s_p50.low is not None and s.e2e_s_p50.high is not None and s.e2e_s_p50.value is not None
        assert s.e2e_s_p50.low <= s.e2e_s_p50.value <= s.e2e_s_p50.high
        # One draw: goodput's interval resamples the cell's 4 agents, its wall time held fixed.
        assert s.goodput_rps.resampled == "rollouts, wall fixed" and s.goodput_rps.n == 4
        assert s.vs_pin_off == []  # pinning on only: nothing to pair it with
        assert [g.metric for g in s.vs_mode] == ([] if s.mode == "http" else ["e2e", "ttft", "goodput"])
        assert all(g.baseline == "http" for g in s.vs_mode)
        assert all(g.pairs == 4 for g in s.vs_mode if g.metric != "goodput")
        assert (s.vs_routing == []) == (s.routing == POLICIES[0])


@pytest.mark.process
def test_an_unfinished_sweep_resumes_from_its_last_whole_group(tmp_path: Path) -> None:
    """fleet.json is rewritten after every cell; cut it as a failure in the second group leaves it (one
    whole group and one cell of the next), and ``--resume`` keeps the whole group as it was, runs the
    second group again from its start, and records itself."""
    out = tmp_path / "fleet"
    argv = ["--modes", "http,longlived", "--agents", "2,3", "--rate", "8", "--turns", "2"]
    argv += ["--tool-time-scale", "0.02", "--pin", "on", "--seed", "7", "--out", str(out)]
    assert main(argv) == 0
    path = out / "fleet.json"
    whole = json.loads(path.read_text())
    assert whole["complete"] is True and [c["agents"] for c in whole["cells"]] == [2, 2, 3, 3]
    cut = dict(whole, complete=False, cells=whole["cells"][:3], summary=[])
    path.write_text(json.dumps(cut))
    assert main(["--resume", str(out)]) == 0
    done = json.loads(path.read_text())
    assert done["complete"] is True and done["command"] == whole["command"]
    assert done["cells"][:2] == whole["cells"][:2]  # the whole group, kept as it was
    order = [(c["agents"], c["mode"]) for c in done["cells"]]
    assert order == [(2, "http"), (2, "longlived"), (3, "http"), (3, "longlived")]
    assert done["cells"][2] != cut["cells"][2]  # the cut group ran again
    assert done["cells"][2]["arrivals_s"] == whole["cells"][2]["arrivals_s"]  # on the same schedule
    [again] = done["resumed"]
    assert again["cells_kept"] == 2 and again["provenance"]["commit"]
    assert len(done["summary"]) == 4
    with pytest.raises(SystemExit):  # a complete sweep has nothing to resume
        main(["--resume", str(out)])
