"""The fleet and network findings (docs/lab-results.md, "Fleets: load, KV budget and pinning", "Replicas and
routing", "The network between client and API" and "What to deploy when"; three lines of NOTES.md's findings
block): every figure computed here from the kept runs, never typed.

The runs are read by name from the kept directory (docs/lab.md, "Fleets" and "Network"): ``fleet`` and
``fleet-single`` (``bench fleet``'s fleet.json: loads × modes × pinning × KV budgets; ``fleet-single`` at one
agent with repeated draws), ``routing`` (a fleet.json at two or more replicas, every routing policy) and
``network`` (a ``bench --network`` results.json, profiles named ``PROFILE@NETWORK``). A missing run leaves
its section out; with none of them there is no section at all.

A fleet.json's intervals are its ``summary`` (proto/lab/analysis/fleet_stats.py). A summary written before
the pinning factor and the hit rate's interval (``bench fleet --summarize FILE`` rewrites it) is
recomputed here from the file's cells with the same code, and the section says so.

One sign everywhere (proto/lab/analysis/stats.py, ``SIGN``): a gain is the mean over pairs of x ÷ baseline
− 1, negative = faster (for goodput: negative = fewer rollouts within the SLO a second).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from proto.lab.analysis.fleet_stats import CellSummary, Interval, mean_interval, pin_gain_net, summarize
from proto.lab.analysis.stats import FASTER, FEW, SAME, SLOWER, Gain
from proto.lab.records import WAIT_SHARE, Results, RunRecord
from proto.lab.report.findings import short
from proto.lab.report.results import cells, load_results
from proto.lab.run.fleet import FleetCell, cells_of

# The load × KV × pinning sweeps, read together. ``fleet-64`` repeats the 64-agent slice of ``fleet`` over
# more draws (its first draw is the same schedule): the tables show both, the deploy table the one with more.
FLEETS = ("fleet", "fleet-64", "fleet-single")
ROUTING, NETWORK = "routing", "network"
SAME_HOST = "same-host"  # the network control: the namespace crossing alone


# ---- reading the kept runs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """One kept fleet.json: its config, its cells and its summary (the file's, or recomputed here)."""

    name: str
    config: dict[str, Any]
    cells: list[FleetCell]
    summary: list[CellSummary]
    recomputed_here: bool  # the file's summary predates the analysis
    command: str | None = None  # the command as it ran (absent in a file from before it was kept)
    provenance: dict[str, Any] | None = None  # proto/lab/records.py, Provenance
    complete: bool = True  # false: the sweep stopped before its last cell

    def cell(self, s: CellSummary, pin: bool | None = None, mode: str | None = None) -> list[FleetCell]:
        """The draws behind a summary row, by repeat (or behind its neighbour at ``pin`` and ``mode``)."""
        key = (
            s.agents,
            s.kv_blocks,
            s.pin_suspended if pin is None else pin,
            s.replicas,
            s.routing,
            s.mode if mode is None else mode,
        )
        return sorted(
            (
                c
                for c in self.cells
                if (c.agents, c.kv_blocks, c.pin_suspended, c.replicas, c.routing, c.mode) == key
            ),
            key=lambda c: c.repeat,
        )


def load_fleet(directory: Path, name: str) -> Fleet | None:
    path = directory / name / "fleet.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    fleet_cells = cells_of(doc)
    stored = doc.get("summary") or []
    current = bool(stored) and all(s.get("hit_rate") is not None and "vs_pin_off" in s for s in stored)
    summary = (
        msgspec.convert(stored, list[CellSummary]) if current else summarize(fleet_cells)  # same code
    )
    return Fleet(
        name,
        doc.get("config", {}),
        fleet_cells,
        summary,
        not current,
        doc.get("command"),
        doc.get("provenance"),
        bool(doc.get("complete", True)),
    )


def load_network(directory: Path) -> Results | None:
    path = directory / NETWORK / "results.json"
    return load_results(path) if path.is_file() else None


# ---- formatting ---------------------------------------------------------------------------------


def iv(x: Interval | None, digits: int, scale: float = 1.0) -> str:
    """``1.23 [1.10, 1.40]``; ``1.23 (n=2)`` without an interval; ``–`` without a value."""
    if x is None or x.value is None:
        return "–"
    if x.low is None or x.high is None:
        return f"{x.value * scale:.{digits}f} (n={x.n})"
    return f"{x.value * scale:.{digits}f} [{x.low * scale:.{digits}f}, {x.high * scale:.{digits}f}]"


def kv_text(kv: float) -> str:
    return f"{kv:,.0f}".replace(",", " ")


def _pin(on: bool) -> str:
    return "on" if on else "off"


def _gain(gains: Sequence[Gain], metric: str) -> Gain | None:
    return next((g for g in gains if g.metric == metric), None)


PIN_WORDS = {FASTER: "wins", SLOWER: "loses", SAME: "no difference", FEW: "too few pairs"}


def pin_word(g: Gain | None) -> str:
    """Pinning's verdict from its gain (pin on vs off): faster = pinning wins."""
    return "–" if g is None else PIN_WORDS[g.verdict]


def fleet_where(name: str, s: CellSummary) -> str:
    """The kept run and cell a figure comes from."""
    routed = f" · {s.replicas} replicas · {s.routing}" if s.replicas > 1 else ""
    pin = _pin(s.pin_suspended)
    return f"`{name}` · {_agents(s.agents)}{routed} · KV {kv_text(s.kv_blocks)} · pin {pin} · `{s.mode}`"


def _modes(rows: Sequence[CellSummary]) -> list[str]:
    return list(dict.fromkeys(s.mode for s in rows))


# ---- fleets: load, KV budget, pinning -----------------------------------------------------------


Group = tuple[str, int, float, bool]  # (run, agents, KV blocks, pinning)


def _groups(fleets: Sequence[Fleet]) -> dict[Group, dict[str, CellSummary]]:
    """(run, agents, KV, pin) → mode → its summary; one replica only, by load, then KV, pin on first."""
    out: dict[Group, dict[str, CellSummary]] = {}
    for f in fleets:
        for s in f.summary:
            if s.replicas == 1:
                out.setdefault((f.name, s.agents, s.kv_blocks, s.pin_suspended), {})[s.mode] = s
    return dict(sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0], -kv[0][2], not kv[0][3])))


def _config_line(f: Fleet) -> str:
    c = f.config
    kv = ", ".join("the model's own" if k is None else f"{kv_text(k)} blocks" for k in c.get("kv_blocks", []))
    loads = c.get("agents", [])
    agents = _agents(loads[0]) if len(loads) == 1 else f"{'/'.join(map(str, loads))} agents"
    draws = c.get("repeats", 1)
    pins = "/".join(_pin(p) for p in c.get("pins", []))
    pv = f.provenance or {}
    origin = (
        f"from **`{f.command}`** (commit `{str(pv.get('commit') or 'unknown')[:12]}`"
        + (", dirty tree" if pv.get("dirty") else "")
        + (f", {pv['scheduler']}" if isinstance(pv.get("scheduler"), str) else "")
        + "): "
        if f.command
        else ""
    )
    return (
        f"`{f.name}`, {origin}{c.get('workload')}"
        + (f" cut to {c['turns']} turns" if c.get("turns") else "")
        + f" on {c.get('model')}, {agents} arriving at {c.get('rate')} a second (Poisson), tool times × "
        f"{c.get('tool_time_scale')}, KV budget(s): {kv}; pinning {pins}, {draws} "
        f"draw{'s' if draws != 1 else ''} a cell; "
        f"SLO: every turn's TTFT ≤ {c.get('slo_ttft_ms'):g} ms and E2E ≤ {c.get('slo_e2e_s'):g} s"
        + (
            "; its summary predates the analysis and is recomputed here from its cells (`bench fleet "
            "--summarize` keeps it)"
            if f.recomputed_here
            else ""
        )
        + ("" if f.complete else f"; **incomplete: the sweep stopped after {len(f.cells)} cells**")
        + "."
    )


def _row_label(g: Group) -> str:
    name, agents, kv, pin = g
    return f"`{name}` | {agents} | {kv_text(kv)} | {_pin(pin)}"


def _table(
    groups: dict[Group, dict[str, CellSummary]],
    modes: Sequence[str],
    value: Callable[[Group, CellSummary], str],
) -> list[str]:
    out = [
        "| run | agents | KV blocks | pin | " + " | ".join(f"`{m}`" for m in modes) + " |",
        "|---|---|---|---|" + "---|" * len(modes),
    ]
    for g, by in groups.items():
        out.append(
            f"| {_row_label(g)} | " + " | ".join(value(g, by[m]) if m in by else "–" for m in modes) + " |"
        )
    return out


def _engine(f: Fleet, s: CellSummary) -> str:
    draws = f.cell(s)
    preempt = sum(c.engine_preemptions for c in draws) / len(draws) if draws else 0.0
    pinned = max((c.kv_pinned_max for c in draws), default=0.0)
    used = max((c.kv_used_max for c in draws), default=0.0)
    return f"{iv(s.hit_rate, 2)} · {preempt:.0f} · {used:.0f} / {pinned:.0f}"


def machine(draws: Sequence[FleetCell]) -> str:
    """The lab's processes' run-queue wait over a cell's draws, as a share of their CPU time ("–" for cells
    measured before the lab read it)."""
    if not draws or any(c.lab_run_ms is None or c.lab_wait_ms is None for c in draws):
        return "–"
    run = sum(c.lab_run_ms or 0.0 for c in draws)
    wait = sum(c.lab_wait_ms or 0.0 for c in draws)
    return f"{wait / run:.0%}" if run > 0 else "–"


def fleet_section(fleets: Sequence[Fleet]) -> list[str]:
    groups = _groups(fleets)
    if not groups:
        return []
    by_name = {f.name: f for f in fleets}
    modes = _modes([s for by in groups.values() for s in by.values()])
    base = modes[0]
    out = [
        "## Fleets: load, KV budget and pinning",
        "",
        *(f"- {_config_line(f)}" for f in fleets),
        "",
        'Per cell (docs/lab.md, "Fleets"): the median over the agents of their E2E and of their median '
        "TTFT, with a bootstrap 95 % interval resampling agents (pooled over the draws); goodput (rollouts "
        "meeting the SLO a second) with its interval over draws, or, below 3 draws, over the agents with "
        "the wall time held fixed; `(n=…)`: too few for an interval.",
        "",
        "**E2E p50, s**",
        "",
        *_table(groups, modes, lambda _, s: iv(s.e2e_s_p50, 2)),
        "",
        "**TTFT p50, ms** (the agents' median TTFT)",
        "",
        *_table(groups, modes, lambda _, s: iv(s.ttft_ms_p50, 0)),
        "",
        "**Goodput, rollouts a second within the SLO**",
        "",
        *_table(groups, modes, lambda _, s: iv(s.goodput_rps, 2)),
        "",
        "**The engine**: prefix hit rate [95 % CI over draws] · preemptions a draw · KV blocks used / "
        "pinned by suspended responses (the most sampled)",
        "",
        *_table(groups, modes, lambda g, s: _engine(by_name[g[0]], s)),
        "",
        f"**E2E against `{base}`**, same agents and draws: gain % [95 % CI] (`=`: no difference)",
        "",
        *_table(groups, modes[1:], lambda _, s: short(_gain(s.vs_mode, "e2e"))),
        "",
        "**The machine**: the share of their CPU time the lab's processes (its clients, the server, the "
        f"engine) waited for a core over the cell; above {WAIT_SHARE:.0%} the two cores, not the modelled "
        'GPU, bound the cell\'s latency (docs/lab.md, "Fleets": "Scale"); `–`: not recorded',
        "",
        *_table(groups, modes, lambda g, s: machine(by_name[g[0]].cell(s))),
        "",
    ]
    pinned = [(g, by) for g, by in groups.items() if g[3] and any(s.vs_pin_off for s in by.values())]
    net = net_pins(fleets)
    pinning = pinning_modes(fleets)
    if pinned:
        out += [
            "**Pinning** (`pin-suspended` on against off, same mode, load, budget and draws; a pair is one "
            "agent of one draw): E2E gain % [95 % CI] / TTFT gain % [95 % CI]; negative: pinning is faster. "
            "It acts on the designs whose suspended responses held pinned blocks ("
            + ", ".join(f"`{m}`" for m in pinning_modes(fleets))
            + "); for the others the two groups differ only in their engines and the time they ran, so "
            "their columns are the comparison's control, and the last columns give the pinning designs' gain "
            "net of it (per agent and draw: the design's on ÷ off over the mean of the controls' on ÷ off).",
            "",
            "| run | agents | KV blocks | "
            + " | ".join([*(f"`{m}`" for m in modes), *(f"`{m}` net of the control" for m in pinning)])
            + " |",
            "|---|---|---|" + "---|" * (len(modes) + len(pinning)),
        ]
        for (name, agents, kv, _), by in pinned:
            raw = [
                f"{short(_gain(by[m].vs_pin_off, 'e2e'))} / {short(_gain(by[m].vs_pin_off, 'ttft'))}"
                if m in by
                else "–"
                for m in modes
            ]
            nets = [
                " / ".join(short(net.get((name, agents, kv, m, metric))) for metric in ("e2e", "ttft"))
                for m in pinning
            ]
            out.append(f"| `{name}` | {agents} | {kv_text(kv)} | " + " | ".join(raw + nets) + " |")
        out.append("")
    chosen = set(best_drawn(groups))  # a load two runs hold counts once, from the run with more draws
    counted = {g: by for g, by in groups.items() if (g[0], g[1], g[2]) in chosen}
    out += [*(f"- {b}" for b in design_bullets(counted, modes, pinning, net)), ""]
    return out


def _fastest(by: dict[str, CellSummary]) -> CellSummary | None:
    measured = [s for s in by.values() if s.e2e_s_p50.value is not None]
    return min(measured, key=lambda s: float(s.e2e_s_p50.value or 0.0), default=None)


NetKey = tuple[str, int, float, str, str]  # (run, agents, KV, mode, metric)


def net_pins(fleets: Sequence[Fleet]) -> dict[NetKey, Gain]:
    """Pinning's gain net of the control (``fleet_stats.pin_gain_net``) for every design that pins, at every
    load and budget with both pinnings: the control is every design that does not pin, same agents and
    draws."""
    pinning = pinning_modes(fleets)
    out: dict[NetKey, Gain] = {}
    for f in fleets:
        for s in f.summary:
            if not (s.pin_suspended and s.mode in pinning and s.vs_pin_off and s.replicas == 1):
                continue
            others = {c.mode for c in f.cells if c.mode not in pinning}
            controls = [(f.cell(s, True, m), f.cell(s, False, m)) for m in sorted(others)]
            for metric in ("e2e", "ttft"):
                g = pin_gain_net(f.cell(s), f.cell(s, False), controls, metric)
                if g is not None:
                    out[(f.name, s.agents, s.kv_blocks, s.mode, metric)] = g
    return out


def pinning_modes(fleets: Sequence[Fleet]) -> list[str]:
    """The modes whose responses held blocks pinned while suspended (in some pin-on cell): the ones
    ``pin-suspended`` acts on. For the others, a pin on/off difference is whatever else separates the two
    groups' engines and times: a control."""
    return list(
        dict.fromkeys(c.mode for f in fleets for c in f.cells if c.pin_suspended and c.kv_pinned_max > 0)
    )


def _agents(n: int) -> str:
    return f"{n} agent" if n == 1 else f"{n} agents"


def design_bullets(
    groups: dict[Group, dict[str, CellSummary]],
    modes: Sequence[str],
    pinning: Sequence[str],
    net: dict[NetKey, Gain],
) -> list[str]:
    """Per design: where it has the lowest E2E p50, its verdicts against the first mode, and pinning's
    net of the control (for the designs that pin); over ``groups`` as given (one run's per load)."""
    out = []
    base = modes[0]
    for mode in modes:
        best = [g for g, by in groups.items() if (f := _fastest(by)) is not None and f.mode == mode]
        most = [g for g, by in groups.items() if mode in _most_goodput(by)]
        text = f"**`{mode}`**: the lowest E2E p50 at {_at(best)}; the most goodput at {_at(most)}."
        if mode != base:
            gs = [_gain(by[mode].vs_mode, "e2e") for by in groups.values() if mode in by]
            text += f" Against `{base}` (E2E): {_counts(gs)} of {len(gs)} cells."
        pins = [
            (g, net.get((g[0], g[1], g[2], mode, "e2e")))
            for g, by in groups.items()
            if mode in pinning and mode in by and by[mode].vs_pin_off
        ]
        if pins:
            text += (
                " Pinning (E2E, net of the control) "
                + "; ".join(f"{pin_word(gain)} at {_agents(g[1])} · KV {kv_text(g[2])}" for g, gain in pins)
                + "."
            )
        out.append(text)
    return out


def _at(groups: Sequence[Group]) -> str:
    return "; ".join(f"{_agents(g[1])} · KV {kv_text(g[2])} · pin {_pin(g[3])}" for g in groups) or "no cell"


def _most_goodput(by: dict[str, CellSummary]) -> list[str]:
    """The modes with the group's highest goodput point (ties all named; none when no rollout met the SLO)."""
    points = {m: float(s.goodput_rps.value or 0.0) for m, s in by.items()}
    top = max(points.values(), default=0.0)
    return [m for m, v in points.items() if v == top and top > 0]


def _counts(gs: Sequence[Gain | None]) -> str:
    n = {v: sum(1 for g in gs if g is not None and g.verdict == v) for v in (FASTER, SAME, SLOWER)}
    return f"faster in {n[FASTER]}, no difference in {n[SAME]}, slower in {n[SLOWER]}"


# ---- replicas and routing -----------------------------------------------------------------------


def routing_section(f: Fleet) -> list[str]:
    rows = [s for s in f.summary if s.replicas > 1]
    if not rows:
        return []
    policies = list(dict.fromkeys(s.routing for s in rows))
    out = [
        "## Replicas and routing",
        "",
        f"- {_config_line(f)}",
        "",
        f"Per design and policy ({rows[0].replicas} replicas, each its own KV cache): the engines' prefix "
        "hit rate (hits ÷ queries over the draws, 95 % CI over draws), the clients' (cached ÷ prompt tokens "
        "as the server reported them, 95 % CI over agents), TTFT p50 ms and E2E p50 s (95 % CI "
        f"over agents), their paired gains against `{policies[0]}` (same agents and draws), and each "
        "replica's requests a draw, and the share of their CPU time the lab's processes waited for a core.",
        "",
        f"| mode | pin | routing | hit rate | clients' hit rate | TTFT p50 ms | E2E p50 s | TTFT vs "
        f"`{policies[0]}` | E2E vs `{policies[0]}` | requests per replica | waited for a core |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in _modes(rows):
        for s in (r for r in rows if r.mode == mode):
            draws = f.cell(s)
            per = np.mean([c.replica_requests for c in draws], axis=0) if draws else []
            out.append(
                f"| `{mode}` | {_pin(s.pin_suspended)} | {s.routing} | {iv(s.hit_rate, 2)} | "
                f"{iv(s.client_hit_rate, 2)} | {iv(s.ttft_ms_p50, 0)} | {iv(s.e2e_s_p50, 2)} | "
                f"{short(_gain(s.vs_routing, 'ttft'))} | "
                f"{short(_gain(s.vs_routing, 'e2e'))} | {' / '.join(f'{r:.0f}' for r in per)} | "
                f"{machine(draws)} |"
            )
    out.append("")
    for mode in _modes(rows):
        mine = [r for r in rows if r.mode == mode and r.hit_rate is not None and r.hit_rate.value is not None]
        if not mine:
            continue
        rates = {id(r): round(float(r.hit_rate.value or 0.0), 2) for r in mine if r.hit_rate is not None}
        top = max(rates.values())
        hits = [r for r in mine if rates.get(id(r)) == top]  # equal to the two digits shown: all named
        fast = min(mine, key=lambda r: float(r.ttft_ms_p50.value or math.inf))
        out.append(
            f"- **`{mode}`**: the highest hit rate ({top:.2f}) under "
            + ", ".join(f"{r.routing} (pin {_pin(r.pin_suspended)})" for r in hits)
            + f"; the lowest TTFT p50 under {fast.routing}, pin "
            f"{_pin(fast.pin_suspended)} ({iv(fast.ttft_ms_p50, 0)} ms"
            + (
                f"; against `{policies[0]}` {short(_gain(fast.vs_routing, 'ttft'))} %"
                if fast.vs_routing
                else ""
            )
            + ")."
        )
    out.append("")
    return out


# ---- the network --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkCost:
    """One (network, mode) cell: what its bytes and the link's figures say a turn costs, against what was
    measured beside the same-host control."""

    network: str
    mode: str
    run: RunRecord
    group: tuple[str, str, str]  # (profile without its network, workload, model): a same-host control's
    bytes_per_turn: float
    rtt_ms: float  # the profile's
    up_payload_mbit: float | None  # the shaped uplink's TCP payload rate (None: not shaped)
    arithmetic_ms: float  # RTT + bytes ÷ payload rate, per turn
    measured_ms: Interval | None  # mean over paired rollouts of (E2E − same-host's) ÷ turns


def _network(profile: str) -> str:
    return profile.split("@", 1)[1] if "@" in profile else SAME_HOST


def _pairs(run: RunRecord, other: RunRecord) -> list[tuple[float, float, int]]:
    """(E2E here, E2E there, turns) for the rollouts both cells ran (same index, session and seed)."""
    mine = [] if run.rollout_records is UNSET else run.rollout_records
    theirs = {
        (r.index, r.session, r.seed): r
        for r in ([] if other.rollout_records is UNSET else other.rollout_records)
    }
    out = []
    for r in mine:
        o = theirs.get((r.index, r.session, r.seed))
        if o is not None and r.e2e_s is not None and o.e2e_s is not None and r.turns:
            out.append((r.e2e_s, o.e2e_s, r.turns))
    return out


def link_costs(results: Results) -> list[LinkCost]:
    by = cells(results.runs)
    control = {(p.split("@")[0], w, m): c for (p, w, m), c in by.items() if _network(p) == SAME_HOST}
    out = []
    for (profile, workload, model), modes in by.items():
        base = control.get((profile.split("@")[0], workload, model), {})
        for mode, run in modes.items():
            link = run.link if isinstance(run.link, dict) else {}
            rtt = float(link.get("rtt_ms", 0.0) or 0.0)
            up = link.get("expected_up_mbit")
            per_turn = float(run.client_bytes_sent_per_turn)
            arithmetic = rtt + (per_turn * 8 / (float(up) * 1e6) * 1e3 if up else 0.0)
            measured = None
            if mode in base and _network(profile) != SAME_HOST:
                diffs = [(a - b) / turns * 1e3 for a, b, turns in _pairs(run, base[mode])]
                measured = mean_interval(diffs, "rollouts") if diffs else None
            group = (profile.split("@")[0], workload, model)
            out.append(LinkCost(_network(profile), mode, run, group, per_turn, rtt, up, arithmetic, measured))
    return out


def _did(
    costs: Sequence[LinkCost], group: tuple[str, str, str], network: str, mode: str, base: str
) -> tuple[float, Interval] | None:
    """``mode``'s extra time a turn over ``base``'s on ``network``, beyond the same difference on same-host
    (paired by rollout across the four cells): its uplink arithmetic and the measured interval."""
    at = {(c.network, c.mode): c for c in costs if c.group == group}
    need = [(network, mode), (network, base), (SAME_HOST, mode), (SAME_HOST, base)]
    if any(k not in at for k in need):
        return None
    a, b, c, d = (at[k] for k in need)
    if a.up_payload_mbit is None:
        arithmetic = 0.0
    else:
        arithmetic = (a.bytes_per_turn - b.bytes_per_turn) * 8 / (a.up_payload_mbit * 1e6) * 1e3
    here = {(r.index, r.session, r.seed): r for r in _records(a.run)}
    rows = []
    for key, r in here.items():
        others = [_by(x.run).get(key) for x in (b, c, d)]
        if r.e2e_s is None or any(o is None or o.e2e_s is None for o in others) or not r.turns:
            continue
        e_b, e_c, e_d = (float(o.e2e_s) for o in others if o is not None and o.e2e_s is not None)
        rows.append(((r.e2e_s - e_b) - (e_c - e_d)) / r.turns * 1e3)
    return (arithmetic, mean_interval(rows, "rollouts")) if rows else None


def _records(run: RunRecord) -> list[Any]:
    return [] if run.rollout_records is UNSET else list(run.rollout_records)


def _by(run: RunRecord) -> dict[tuple[int, int, int | None], Any]:
    return {(r.index, r.session, r.seed): r for r in _records(run)}


def network_section(results: Results) -> list[str]:
    costs = link_costs(results)
    if not costs:
        return []
    command = results.command if isinstance(results.command, str) else "–"
    out = [
        "## The network between client and API",
        "",
        f"From `network` (**`{command}`**). Per turn: the bytes the client sent, the link's cost by "
        "arithmetic from its profile (its RTT, plus the bytes ÷ the shaped uplink's TCP payload rate; the "
        "downlink's bytes are not counted), and the measured extra E2E a turn over the same rollout on "
        "`same-host` (mean over paired rollouts [95 % CI]). The link's own check (ping p50, uplink measured) "
        'is the run\'s (docs/lab.md, "Network").',
        "",
        "| profile@network · workload · model | mode | KiB sent a turn | RTT ms | uplink Mbit/s (payload) | "
        "link ping p50 ms / uplink measured | arithmetic ms a turn | measured ms a turn | TTFT p50 ms | "
        "E2E p50 s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in costs:
        link = c.run.link if isinstance(c.run.link, dict) else {}
        ping = (link.get("ping") or {}).get("p50")
        checked = "–" if ping is None else f"{ping:.2f}"
        if ping is not None and c.up_payload_mbit is not None:
            checked += f" / {link.get('measured_up_mbit', 0.0):.2f}"
        out.append(
            f"| {c.run.profile} · {c.run.workload} · {c.run.model} | `{c.mode}` | "
            f"{c.bytes_per_turn / 1024:.1f} | {c.rtt_ms:g} | "
            f"{'not shaped' if c.up_payload_mbit is None else f'{c.up_payload_mbit:.2f}'} | {checked} | "
            f"{c.arithmetic_ms:.1f} | {iv(c.measured_ms, 1)} | "
            f"{'–' if c.run.ttft_ms_p50 is None else f'{c.run.ttft_ms_p50:.1f}'} | "
            f"{'–' if c.run.e2e_s_p50 is None else f'{c.run.e2e_s_p50:.2f}'} |"
        )
    out.append("")
    extra = http_extra(costs)
    for mode in dict.fromkeys(m for _, m, _, _ in extra):
        parts = [
            f"{where} {a:.1f} by arithmetic, {iv(m, 1)} measured" for where, o, a, m in extra if o == mode
        ]
        out.append(
            f"- **`http`'s extra bytes over `{mode}`'s**, ms a turn (beyond the same difference on "
            "same-host, paired by rollout): " + "; ".join(parts) + "."
        )
    return [*out, ""] if extra else out


def http_extra(costs: Sequence[LinkCost]) -> list[tuple[str, str, float, Interval]]:
    """(where, other mode, arithmetic ms, measured ms) of ``http``'s extra time a turn over every other
    mode on every shaped link (:func:`_did`); ``where`` is the network, with its profile, workload and model
    when the run has several."""
    groups = list(dict.fromkeys(c.group for c in costs))
    out = []
    for group in groups:
        mine = [c for c in costs if c.group == group]
        modes = list(dict.fromkeys(c.mode for c in mine))
        for network in dict.fromkeys(c.network for c in mine if c.network != SAME_HOST):
            where = network if len(groups) == 1 else f"{network} ({' · '.join(group)})"
            for mode in modes:
                if mode != "http" and (did := _did(costs, group, network, "http", mode)) is not None:
                    out.append((where, mode, *did))
    return out


# ---- what to deploy when ------------------------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    when: str
    deploy: str
    run: str  # the kept run's name
    cell: str  # the cell, as :func:`fleet_where` names it
    evidence: str
    gain: str = ""  # its paired gain against the baseline, :func:`short` (NOTES.md's lines)


def _versus(g: Gain | None, base: str) -> str:
    """What a chosen design's gain against the baseline allows one to say."""
    if g is None or g.verdict == FASTER:
        return ""
    if g.verdict == FEW:
        return f" (too few pairs to tell from `{base}`)"
    return f" ({'no faster' if g.verdict == SAME else 'slower'} than `{base}` within the interval)"


def _pin_choice(g: Gain | None) -> str:
    """What pinning's paired verdict tells one to set."""
    if g is not None and g.verdict == FASTER:
        return "pin-suspended on"
    if g is not None and g.verdict == SLOWER:
        return "pin-suspended off"
    return f"pin-suspended on or off ({pin_word(g)})"


def best_drawn(groups: dict[Group, dict[str, CellSummary]]) -> list[tuple[str, int, float]]:
    """Each (agents, KV) once, in the groups' order: from the run whose cells hold the most draws (the first
    such run on a tie), where more than one kept run measured it."""
    chosen: dict[tuple[int, float], tuple[str, int]] = {}
    for (name, agents, kv, _), by in groups.items():
        draws = max((s.repeats for s in by.values()), default=0)
        if (agents, kv) not in chosen or draws > chosen[(agents, kv)][1]:
            chosen[(agents, kv)] = (name, draws)
    return [(name, agents, kv) for (agents, kv), (name, _) in chosen.items()]


def deploy(fleets: Sequence[Fleet], routing: Fleet | None, network: Results | None) -> list[Advice]:
    out: list[Advice] = []
    groups = _groups(fleets)
    modes = _modes([s for by in groups.values() for s in by.values()])
    pinning = pinning_modes([*fleets, *([routing] if routing else [])])
    net = net_pins(fleets)
    for name, agents, kv in best_drawn(groups):
        both = {p: groups.get((name, agents, kv, p), {}) for p in (True, False)}
        candidates = [s for by in both.values() for s in by.values() if s.e2e_s_p50.value is not None]
        if not candidates:
            continue
        best = min(candidates, key=lambda s: float(s.e2e_s_p50.value or 0.0))
        design = f"`{best.mode}`"
        chosen = both[True].get(best.mode)
        if best.mode in pinning and chosen is not None and chosen.vs_pin_off:
            design += ", " + _pin_choice(net.get((name, agents, kv, best.mode, "e2e")))
        evidence = f"E2E p50 {iv(best.e2e_s_p50, 2)} s"
        if best.mode != modes[0]:
            g = _gain(best.vs_mode, "e2e")
            design += _versus(g, modes[0])
            evidence += f"; vs `{modes[0]}` {short(g)} %"
        for mode in pinning:
            pin = both[True].get(mode)
            if pin is not None and pin.vs_pin_off:
                pg = net.get((name, agents, kv, mode, "e2e"))
                evidence += (
                    f"; `{mode}` pinning {pin_word(pg)} net of the control ({short(pg)} %; "
                    f"raw {short(_gain(pin.vs_pin_off, 'e2e'))} %)"
                )
        out.append(
            Advice(
                f"{_agents(agents)} on one engine, KV {kv_text(kv)} blocks",
                design,
                name,
                fleet_where(name, best),
                evidence,
                "" if best.mode == modes[0] else f"E2E vs `{modes[0]}` {short(_gain(best.vs_mode, 'e2e'))} %",
            )
        )
    if routing is not None:
        rows = [s for s in routing.summary if s.replicas > 1]
        for mode in _modes(rows):
            mine = [r for r in rows if r.mode == mode and r.ttft_ms_p50.value is not None]
            if not mine:
                continue
            best = min(mine, key=lambda r: float(r.ttft_ms_p50.value or math.inf))
            g = _gain(best.vs_routing, "ttft")
            first = mine[0].routing
            both_pins = len({r.pin_suspended for r in mine}) > 1
            pick = f"{best.routing}" + (
                f", pin-suspended {_pin(best.pin_suspended)}" if mode in pinning and both_pins else ""
            )
            out.append(
                Advice(
                    f"`{mode}` behind {best.replicas} replicas",
                    pick + ("" if best.routing == first else _versus(g, first)),
                    routing.name,
                    fleet_where(routing.name, best),
                    f"hit rate {iv(best.hit_rate, 2)}"
                    + (f" (clients' {iv(best.client_hit_rate, 2)})" if best.client_hit_rate else "")
                    + f"; TTFT p50 {iv(best.ttft_ms_p50, 0)} ms"
                    + (f"; vs {first} {short(g)} %" if g is not None else ""),
                    "" if g is None else f"TTFT vs {first} {short(g)} %",
                )
            )
    if network is not None:
        for (profile, workload, model), by in cells(network.runs).items():
            measured = [r for r in by.values() if r.e2e_s_p50 is not None]
            if not measured:
                continue
            top = min(measured, key=lambda r: float(r.e2e_s_p50 or 0.0))
            gains = {} if top.gains is UNSET else top.gains.get("http", {})
            g = gains.get("e2e")
            design = f"`{top.mode}`"
            if top.mode != "http" and (g is None or g.verdict != FASTER):
                design += " (no faster than `http` within the interval)"
            out.append(
                Advice(
                    "no shaped link (same-host)"
                    if _network(profile) == SAME_HOST
                    else f"a {_network(profile)} link",
                    design,
                    NETWORK,
                    f"`{NETWORK}` · {profile} · {workload} · {model} · `{top.mode}`",
                    f"E2E p50 {top.e2e_s_p50:.2f} s" + (f"; vs `http` {short(g)} %" if g is not None else ""),
                    "" if g is None else f"E2E vs `http` {short(g)} %",
                )
            )
    return out


def deploy_section(advice: Sequence[Advice]) -> list[str]:
    if not advice:
        return []
    return [
        "## What to deploy when",
        "",
        "The design with the lowest E2E p50 in each situation (TTFT p50 for routing), from the kept run and "
        "cell named; its paired gain says whether it beats the baseline beyond the interval.",
        "",
        "| when | deploy | from (run · cell) | evidence |",
        "|---|---|---|---|",
        *(f"| {a.when} | {a.deploy} | {a.cell} | {a.evidence} |" for a in advice),
        "",
    ]


# ---- the document's and NOTES.md's parts --------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    fleets: list[Fleet]
    routing: Fleet | None
    network: Results | None


_KEPT: dict[tuple[Path, tuple[tuple[str, int], ...]], Kept] = {}


def kept(directory: Path) -> Kept:
    """The kept fleet, routing and network runs in ``directory``; read once per version of their files (the
    document and NOTES.md's block are generated from the same runs, and a summary recomputed here is the
    costly part)."""
    files = [directory / name / "fleet.json" for name in (*FLEETS, ROUTING)] + [
        directory / NETWORK / "results.json"
    ]
    key = (directory.resolve(), tuple((str(f), f.stat().st_mtime_ns) for f in files if f.is_file()))
    if key not in _KEPT:
        fleets = [f for name in FLEETS if (f := load_fleet(directory, name)) is not None]
        _KEPT[key] = Kept(fleets, load_fleet(directory, ROUTING), load_network(directory))
    return _KEPT[key]


def sections(directory: Path) -> list[str]:
    """docs/lab-results.md's fleet, routing, network and deployment sections ([] when no such run is kept)."""
    k = kept(directory)
    out = fleet_section(k.fleets)
    if k.routing is not None:
        out += routing_section(k.routing)
    if k.network is not None:
        out += network_section(k.network)
    return out + deploy_section(deploy(k.fleets, k.routing, k.network))


def bullets(directory: Path) -> list[str]:
    """NOTES.md's findings: the deploy table in three lines (fleets, routing, network), and the network's
    byte arithmetic against its measurement."""
    k = kept(directory)
    advice = deploy(k.fleets, k.routing, k.network)
    out = []
    for title, runs in (
        ("Fleets, what to deploy", {f.name for f in k.fleets}),
        ("Replicas, which routing", {ROUTING}),
        ("Links, what to deploy", {NETWORK}),
    ):
        rows = [a for a in advice if a.run in runs]
        if rows:
            out.append(
                f"- *{title}* ({', '.join(f'`{r}`' for r in sorted(runs & {a.run for a in rows}))}; "
                'docs/lab-results.md, "What to deploy when"): '
                + "; ".join(f"{a.when}: {a.deploy}" + (f", {a.gain}" if a.gain else "") for a in rows)
                + "."
            )
    if k.network is not None:
        parts = [
            f"over `{mode}` on {where} {a:.1f} ms a turn by the uplink's arithmetic, {iv(m, 1)} measured"
            for where, mode, a, m in http_extra(link_costs(k.network))
        ]
        if parts:
            out.append(f"- *`http`'s extra bytes on a shaped link* (`{NETWORK}`): " + "; ".join(parts) + ".")
    return out
