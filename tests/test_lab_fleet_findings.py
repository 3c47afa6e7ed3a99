"""The fleet, routing and network findings (proto/lab/report/fleet_findings.py; docs/lab.md, "Fleets" and
"Network") over small real runs, their figures recomputed by hand from the rollout records.

The fixtures under tests/fixtures/fleet-findings/ are real runs' files, as the commands wrote them (the
network run's results.json alone of its outputs):

    F="--turns 2 --rate 8 --kv-sample-ms 500 --modes http,ws,longlived"
    responses-lab bench fleet --agents 4 --pin on,off --kv-blocks default,700 $F --out fleet
    responses-lab bench fleet --agents 1 --repeats 3 --pin on,off $F --out fleet-single
    responses-lab bench fleet --agents 4 --replicas 2 --routing random,prefix-aware --repeats 3 --pin on \\
        $F --out routing
    responses-lab bench --network same-host,slow-uplink --modes http,ws,longlived --profile local \\
        --model mock-1000tps --workload coding-agent --turns 3 --tool-time-scale 0.1 --quick --no-predict \\
        --sessions 1 --rollouts 3 --out network
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import msgspec
import pytest

from proto.lab.analysis.fleet_stats import summarize
from proto.lab.report import fleet_findings as ff
from proto.lab.report.writeup import lab, notes_block
from proto.lab.run.fleet import cells_of, main

FIX = Path(__file__).resolve().parent / "fixtures" / "fleet-findings"
KEPT = Path(__file__).resolve().parent.parent / "docs" / "results"
HEADERS = {
    "fleet": "## Fleets: load, KV budget and pinning",
    "routing": "## Replicas and routing",
    "network": "## The network between client and API",
}


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIX / name / "fleet.json").read_text(encoding="utf-8"))
    return doc


def _same(c: dict[str, Any], **key: Any) -> bool:
    return all(c[k] == v for k, v in key.items())


def _text() -> str:
    return "\n".join(ff.sections(FIX))


def _row(text: str, after: str, start: str) -> str:
    """The first line beginning with ``start`` after the line holding ``after``."""
    tail = text.split(after, 1)[1]
    return next(line for line in tail.splitlines() if line.startswith(start))


# ---- the analysis (fleet_stats) over the fixtures -----------------------------------------------


def test_goodput_of_one_draw_resamples_the_agents_with_the_wall_fixed() -> None:
    cells = _doc("fleet")["cells"]
    summary = summarize(cells_of(_doc("fleet")))
    assert summary
    for s in summary:
        (c,) = [
            x for x in cells if _same(x, mode=s.mode, pin_suspended=s.pin_suspended, kv_blocks=s.kv_blocks)
        ]
        g = s.goodput_rps
        assert g.resampled == "rollouts, wall fixed" and g.n == c["agents"] == 4
        # By hand: the agents within the SLO over the cell's wall time.
        assert g.value == pytest.approx(sum(c["rollout_slo_met"]) / c["wall_s"])
        assert g.value == pytest.approx(c["goodput_rps"])
        assert g.value is not None and g.low is not None and g.high is not None
        assert g.low <= g.value <= g.high


def test_goodput_of_three_draws_resamples_the_draws() -> None:
    doc = _doc("fleet-single")
    for s in summarize(cells_of(doc)):
        draws = [
            c
            for c in doc["cells"]
            if _same(c, mode=s.mode, pin_suspended=s.pin_suspended, kv_blocks=s.kv_blocks)
        ]
        assert s.goodput_rps.resampled == "draws" and s.goodput_rps.n == len(draws) == 3
        assert s.goodput_rps.value == pytest.approx(statistics.mean(c["goodput_rps"] for c in draws))


def test_pinning_is_paired_by_agent_with_the_same_mode_and_budget() -> None:
    doc = _doc("fleet")
    summary = summarize(cells_of(doc))
    pinned = [s for s in summary if s.pin_suspended]
    assert pinned and all(not s.vs_pin_off for s in summary if not s.pin_suspended)
    for s in pinned:
        key = {"mode": s.mode, "kv_blocks": s.kv_blocks}
        (on,) = [c for c in doc["cells"] if _same(c, pin_suspended=True, **key)]
        (off,) = [c for c in doc["cells"] if _same(c, pin_suspended=False, **key)]
        assert on["arrivals_s"] == off["arrivals_s"] and on["seeds"] == off["seeds"]  # the same schedule
        by_metric = {g.metric: g for g in s.vs_pin_off}
        assert {g.baseline for g in s.vs_pin_off} == {"pin off"}
        for metric, field in (("e2e", "rollout_e2e_s"), ("ttft", "rollout_ttft_ms_p50")):
            by_hand = statistics.mean(a / b - 1 for a, b in zip(on[field], off[field], strict=True))
            assert by_metric[metric].gain == pytest.approx(by_hand)
            assert by_metric[metric].pairs == 4


def test_pinning_net_of_the_control_divides_by_the_designs_that_do_not_pin() -> None:
    """Per agent: longlived's on ÷ off over the mean of the other designs' on ÷ off (the same agent, whose
    on and off ran on different engines at different times), then the mean of that ratio − 1."""
    doc = _doc("fleet")
    net = ff.net_pins(ff.kept(FIX).fleets)

    def ratio(mode: str, kv: float, field: str) -> list[float]:
        on, off = (
            next(c for c in doc["cells"] if _same(c, mode=mode, kv_blocks=kv, pin_suspended=p))
            for p in (True, False)
        )
        return [a / b for a, b in zip(on[field], off[field], strict=True)]

    for kv in sorted({c["kv_blocks"] for c in doc["cells"]}):
        for metric, field in (("e2e", "rollout_e2e_s"), ("ttft", "rollout_ttft_ms_p50")):
            mine = ratio("longlived", kv, field)
            others = zip(ratio("http", kv, field), ratio("ws", kv, field), strict=True)
            control = [statistics.mean(x) for x in others]
            by_hand = statistics.mean(m / c - 1 for m, c in zip(mine, control, strict=True))
            g = net[("fleet", 4, kv, "longlived", metric)]
            assert g.gain == pytest.approx(by_hand) and g.pairs == 4
    assert {k[3] for k in net} == {"longlived"}  # only the design that pins is judged


def test_the_hit_rate_sums_hits_and_queries_over_draws_and_replicas() -> None:
    doc = _doc("routing")
    for s in summarize(cells_of(doc)):
        draws = [c for c in doc["cells"] if _same(c, mode=s.mode, routing=s.routing)]
        hits = sum(h for c in draws for h in c["replica_prefix_hits"])
        queries = sum(q for c in draws for q in c["replica_prefix_queries"])
        assert s.hit_rate is not None and s.hit_rate.n == 3 and s.hit_rate.resampled == "draws"
        assert s.hit_rate.value == pytest.approx(hits / queries)
        low, value, high = s.hit_rate.low, s.hit_rate.value, s.hit_rate.high
        assert low is not None and value is not None and high is not None and low <= value <= high


@pytest.mark.process  # git rev-parse, for the record of who recomputed it
def test_summarize_rewrites_a_stale_summary_and_records_it(tmp_path: Path) -> None:
    kept = _doc("fleet")
    stale = json.loads(json.dumps(kept))
    for s in stale["summary"]:
        del s["hit_rate"], s["vs_pin_off"]
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(stale), encoding="utf-8")
    assert main(["--summarize", str(path)]) == 0
    done = json.loads(path.read_text(encoding="utf-8"))
    assert done["summary"] == kept["summary"]  # the same analysis, the same seeds: the same figures
    assert done["cells"] == kept["cells"]  # nothing measured is touched
    assert set(done["summary_recomputed"]) == {"commit", "utc"} and done["summary_recomputed"]["commit"]


# ---- the generated sections -------------------------------------------------------------------


def test_every_kept_run_has_its_section_and_a_deploy_table() -> None:
    text = _text()
    for header in HEADERS.values():
        assert text.count(header) == 1
    assert "## What to deploy when" in text


@pytest.mark.parametrize("missing", ["fleet", "fleet-single", "routing", "network"])
def test_a_missing_run_leaves_its_section_out(tmp_path: Path, missing: str) -> None:
    for run in ("fleet", "fleet-single", "routing", "network"):
        if run != missing:
            shutil.copytree(FIX / run, tmp_path / run)
    text = "\n".join(ff.sections(tmp_path))
    if missing in ("routing", "network"):  # the fleet section stays while one of its two runs is kept
        assert HEADERS[missing] not in text
    assert HEADERS["fleet"] in text
    assert f"`{missing}`" not in text  # no figure, no deploy row names it
    assert "## What to deploy when" in text


def test_no_kept_fleet_or_network_run_gives_no_section(tmp_path: Path) -> None:
    assert ff.sections(tmp_path) == [] and ff.bullets(tmp_path) == []


def test_the_kept_directory_generates_the_sections_of_the_runs_it_holds() -> None:
    text = "\n".join(ff.sections(KEPT))
    present = {name for name in ("fleet", "fleet-single", "routing", "network") if (KEPT / name).is_dir()}
    assert (HEADERS["fleet"] in text) == bool(present & {"fleet", "fleet-single"})
    assert (HEADERS["routing"] in text) == ("routing" in present)
    assert (HEADERS["network"] in text) == ("network" in present)


def test_the_fleet_tables_hold_the_rollouts_figures() -> None:
    text = _text()
    doc = _doc("fleet")
    modes = doc["config"]["modes"]
    for c in doc["cells"]:
        row_start = (
            f"| `fleet` | 4 | {ff.kv_text(c['kv_blocks'])} | {'on' if c['pin_suspended'] else 'off'} |"
        )
        column = modes.index(c["mode"])
        e2e = _row(text, "**E2E p50, s**", row_start).split(" | ")[4 + column]
        assert e2e.startswith(f"{statistics.median(c['rollout_e2e_s']):.2f} [")
        ttft = _row(text, "**TTFT p50, ms**", row_start).split(" | ")[4 + column]
        assert ttft.startswith(f"{statistics.median(c['rollout_ttft_ms_p50']):.0f} [")
        good = _row(text, "**Goodput", row_start).split(" | ")[4 + column]
        assert good.startswith(f"{sum(c['rollout_slo_met']) / c['wall_s']:.2f} ")
    # The pinning table: longlived's E2E gain, pin on vs off, by hand.
    for kv in sorted({c["kv_blocks"] for c in doc["cells"]}):
        on, off = (
            next(c for c in doc["cells"] if _same(c, mode="longlived", kv_blocks=kv, pin_suspended=p))
            for p in (True, False)
        )
        gain = statistics.mean(
            a / b - 1 for a, b in zip(on["rollout_e2e_s"], off["rollout_e2e_s"], strict=True)
        )
        row = _row(text, "**Pinning**", f"| `fleet` | 4 | {ff.kv_text(kv)} |")
        assert f"{gain * 100:+.1f} [" in row.split(" | ")[3 + modes.index("longlived")]


def test_only_the_designs_that_pin_are_judged_on_pinning() -> None:
    fleets = ff.kept(FIX).fleets
    assert ff.pinning_modes(fleets) == ["longlived"]  # the others' suspended KV is never pinned
    bullets = [line for line in _text().splitlines() if line.startswith("- **`")]
    assert any(b.startswith("- **`longlived`**") and "Pinning " in b for b in bullets)
    assert not any("Pinning " in b for b in bullets if not b.startswith("- **`longlived`**"))


def test_the_routing_table_holds_each_policys_hit_rate() -> None:
    text = _text()
    doc = _doc("routing")
    for mode in doc["config"]["modes"]:
        for routing in doc["config"]["routings"]:
            draws = [c for c in doc["cells"] if _same(c, mode=mode, routing=routing)]
            rate = sum(h for c in draws for h in c["replica_prefix_hits"]) / sum(
                q for c in draws for q in c["replica_prefix_queries"]
            )
            row = _row(text, "## Replicas and routing", f"| `{mode}` | on | {routing} |")
            assert row.split(" | ")[3].startswith(f"{rate:.2f}")


def test_the_network_cost_is_the_links_arithmetic_against_the_paired_rollouts() -> None:
    results = json.loads((FIX / "network" / "results.json").read_text(encoding="utf-8"))
    runs = {(r["profile"].split("@")[1], r["mode"]): r for r in results["runs"]}
    kept = ff.kept(FIX).network
    assert kept is not None
    costs = {(c.network, c.mode): c for c in ff.link_costs(kept)}
    assert set(costs) == set(runs)
    text = _text()
    for (network, mode), run in runs.items():
        c = costs[(network, mode)]
        link = run["link"]
        per_turn = run["client_bytes_sent_per_turn"]
        up = link["expected_up_mbit"]
        by_hand = link["rtt_ms"] + (per_turn * 8 / (up * 1e6) * 1e3 if up else 0.0)
        assert c.arithmetic_ms == pytest.approx(by_hand)
        if network == "same-host":
            assert c.measured_ms is None and c.rtt_ms == 0 and c.up_payload_mbit is None
            continue
        assert up is not None and c.rtt_ms == 35  # slow-uplink: 35 ms, 10 Mbit/s up (its profile)
        base = {(r["index"], r["session"]): r for r in runs[("same-host", mode)]["rollout_records"]}
        diffs = [
            (r["e2e_s"] - base[(r["index"], r["session"])]["e2e_s"]) / r["turns"] * 1e3
            for r in run["rollout_records"]
        ]
        assert c.measured_ms is not None and c.measured_ms.value == pytest.approx(statistics.mean(diffs))
        row = _row(
            text, HEADERS["network"], f"| {run['profile']} · {run['workload']} · {run['model']} | `{mode}` |"
        )
        assert f"| {per_turn / 1024:.1f} |" in row and f"| {by_hand:.1f} |" in row


def test_every_deploy_row_names_a_kept_run_and_one_of_its_cells() -> None:
    k = ff.kept(FIX)
    advice = ff.deploy(k.fleets, k.routing, k.network)
    assert {a.run for a in advice} == {"fleet", "fleet-single", "routing", "network"}
    named = {f.name: {ff.fleet_where(f.name, s) for s in f.summary} for f in [*k.fleets, k.routing] if f}
    assert k.network is not None
    named["network"] = {
        f"`network` · {r.profile} · {r.workload} · {r.model} · `{r.mode}`" for r in k.network.runs
    }
    for a in advice:
        assert (FIX / a.run).is_dir()
        assert a.cell in named[a.run], a
    table = _text().split("## What to deploy when", 1)[1]
    assert all(f"| {a.cell} |" in table for a in advice)


def test_the_lab_document_and_notes_carry_the_generated_parts() -> None:
    text = lab(FIX)
    assert "\n".join(ff.sections(FIX)) in text
    block = notes_block(FIX)
    bullets = ff.bullets(FIX)
    assert bullets and all(b in block for b in bullets)


def test_https_extra_bytes_are_a_difference_in_differences_by_rollout() -> None:
    results = json.loads((FIX / "network" / "results.json").read_text(encoding="utf-8"))
    runs = {(r["profile"].split("@")[1], r["mode"]): r for r in results["runs"]}
    kept = ff.kept(FIX).network
    assert kept is not None
    extra = {(where, mode): (a, m) for where, mode, a, m in ff.http_extra(ff.link_costs(kept))}
    assert set(extra) == {("slow-uplink", "ws"), ("slow-uplink", "longlived")}
    for (where, mode), (arithmetic, measured) in extra.items():
        up = runs[(where, "http")]["link"]["expected_up_mbit"]
        sent = (
            runs[(where, "http")]["client_bytes_sent_per_turn"]
            - runs[(where, mode)]["client_bytes_sent_per_turn"]
        )
        assert arithmetic == pytest.approx(sent * 8 / (up * 1e6) * 1e3)

        def e2e(network: str, m: str) -> dict[tuple[int, int], dict[str, Any]]:
            return {(r["index"], r["session"]): r for r in runs[(network, m)]["rollout_records"]}

        http, other = e2e(where, "http"), e2e(where, mode)
        http0, other0 = e2e("same-host", "http"), e2e("same-host", mode)
        per_turn = [
            ((http[k]["e2e_s"] - other[k]["e2e_s"]) - (http0[k]["e2e_s"] - other0[k]["e2e_s"]))
            / http[k]["turns"]
            * 1e3
            for k in http
        ]
        assert measured.n == len(per_turn) == 3
        assert measured.value == pytest.approx(statistics.mean(per_turn))


def test_the_machine_column_is_the_cells_wait_over_its_cpu() -> None:
    """Per cell, the lab's processes' run-queue wait over their CPU time, summed over its draws; a cell
    measured before the lab read it shows "–"."""
    k = ff.kept(FIX)
    fleet = next(f for f in k.fleets if f.name == "fleet")
    draws = fleet.cell(fleet.summary[0])
    assert draws and ff.machine(draws) == "–"  # the fixtures predate the reading
    read = [
        dataclasses.replace(c, lab_run_ms=1000.0 * (i + 1), lab_wait_ms=30.0) for i, c in enumerate(draws)
    ]
    assert ff.machine(read) == f"{30.0 * len(read) / sum(1000.0 * (i + 1) for i in range(len(read))):.0%}"


def test_a_failed_rollout_is_left_out_of_the_medians_and_the_pairs() -> None:
    """A rollout whose response failed has no figures (None): the medians are the other agents', and each
    paired gain leaves its pair out (the first agent of every draw here, in every cell)."""
    fleet = next(f for f in ff.kept(FIX).fleets if f.name == "fleet")
    failed = [
        dataclasses.replace(
            c,
            rollout_e2e_s=[None, *c.rollout_e2e_s[1:]],
            rollout_ttft_ms_p50=[None, *c.rollout_ttft_ms_p50[1:]],
        )
        for c in fleet.cells
    ]
    before = {(s.agents, s.kv_blocks, s.pin_suspended, s.mode): s for s in summarize(fleet.cells)}
    for s in summarize(failed):
        was = before[(s.agents, s.kv_blocks, s.pin_suspended, s.mode)]
        assert s.e2e_s_p50.n == was.e2e_s_p50.n - s.repeats
        for g, w in zip(s.vs_mode, was.vs_mode, strict=True):
            if g.metric in ("e2e", "ttft"):
                assert g.pairs == w.pairs - s.repeats


def test_a_load_measured_by_two_runs_is_advised_from_the_one_with_more_draws(tmp_path: Path) -> None:
    """``fleet-64`` repeats a load of ``fleet`` over more draws: both show in the fleet tables, and the deploy
    table's row for that load comes from the run with more draws."""
    for run in ("fleet", "fleet-single"):
        shutil.copytree(FIX / run, tmp_path / run)
    more = _doc("fleet")
    # A second draw of every cell (the same figures, as a rerun of the same schedule would give).
    more["cells"] += [dict(c, repeat=1) for c in more["cells"]]
    more["summary"] = msgspec.to_builtins(summarize(cells_of(more)))
    (tmp_path / "fleet-64").mkdir()
    (tmp_path / "fleet-64" / "fleet.json").write_text(json.dumps(more), encoding="utf-8")
    k = ff.kept(tmp_path)
    assert [f.name for f in k.fleets] == ["fleet", "fleet-64", "fleet-single"]
    advice = ff.deploy(k.fleets, None, None)
    by_load = {a.when: a.run for a in advice}
    four = [when for when in by_load if when.startswith("4 agents")]
    assert four and all(by_load[when] == "fleet-64" for when in four)  # 2 draws beat 1
    assert any(run == "fleet-single" for run in by_load.values())  # a load no other run holds stays
    assert len(advice) == len(by_load)  # each load once
    text = "\n".join(ff.sections(tmp_path))
    table = text.split("**E2E p50, s**", 1)[1].split("\n\n", 2)[1]
    assert "| `fleet` | 4 |" in table and "| `fleet-64` | 4 |" in table
    # The per-design bullets count each load once too: as many cells as the deploy table's loads.
    bullet = next(line for line in text.splitlines() if line.startswith("- **`ws`**"))
    loads = {(s.agents, s.kv_blocks, s.pin_suspended) for f in k.fleets for s in f.summary}
    assert f"of {len(loads)} cells." in bullet, bullet
