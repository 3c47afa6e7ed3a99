"""The real agent's and the peers' findings (docs/lab-results.md, "The real agent" and "Peers"; NOTES.md's
findings block), generated from the kept runs by name (docs/lab.md, "Kept runs"), never typed:

* ``codex``: ``bench --client codex`` (results.json format ``codex-client/1``, proto/lab/run/codex_bench.py).
  Codex's side is recomputed here from the file's own rollout records (:func:`codex_summary`), so an
  analysis added there reads a run kept before it; the lab client's side is the file's summary of its run
  on the same plan.
* ``peer-1k`` and ``peer-100k``: ``bench --peer agentic-api`` beside ``http``, ``ws`` and ``longlived`` at
  about 1 k and 100 k tokens of history (format 2, proto/lab/run/peers.py). Gains against the gateway are
  paired here from the rollout records, as against any mode that is not a baseline of the run.

A missing run leaves its section and its findings out. One sign everywhere (proto/lab/analysis/stats.py,
``SIGN``): negative = faster; a gain whose 95 % interval holds 0 is "no difference".
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from proto.lab.analysis.stats import Gain, Percentiles, paired_gain, percentiles
from proto.lab.config import AGENTIC_API
from proto.lab.records import WAIT_SHARE, CpuTime, Load, Provenance, Results, RunRecord
from proto.lab.report.findings import _model_label, gain, short
from proto.lab.report.results import cells
from proto.lab.run.codex_bench import codex_summary
from proto.lab.run.codex_client import BASELINE, MODES, CodexRollout

CODEX_RUN = "codex"
CODEX_FORMAT = "codex-client/1"
PEER_RUNS = ("peer-1k", "peer-100k")
OURS = ("http", "ws", "longlived")  # this server's modes a peer run measures beside the gateway


# ---- reading the kept codex run -------------------------------------------------------------------


class Side(msgspec.Struct, kw_only=True):
    """One client's summary of one design (codex_bench's ``codex_summary`` / ``synthetic_summary``)."""

    rollouts: int
    e2e_s: Percentiles
    non_tool_s: Percentiles
    non_tool_ms_per_turn: float
    server_ms_per_turn: float
    gains: dict[str, Gain] = {}


class CodexCell(msgspec.Struct, kw_only=True):
    """One speed of a ``codex-client/1`` file: every Codex rollout, and the lab client's summary."""

    rollouts: list[CodexRollout]
    synthetic: dict[str, Side] = {}
    lab_cpu: CpuTime | None = None  # over the measured Codex rollouts; absent in a file from before it


class CodexRun(msgspec.Struct, kw_only=True):
    """What the findings read of a ``codex-client/1`` results.json."""

    format: str
    command: str
    generated: str
    provenance: Provenance
    quick: bool
    rollouts: int
    task: dict[str, str]
    models: dict[str, CodexCell]


class _Format(msgspec.Struct):
    format: int | str | None = None


def is_codex(path: Path) -> bool:
    """Whether a results.json is ``bench --client codex``'s (not a lab run's format 1 or 2)."""
    return msgspec.json.decode(path.read_bytes(), type=_Format).format == CODEX_FORMAT


def load_codex(directory: Path) -> CodexRun | None:
    """The kept ``codex`` run, or None when it is not kept."""
    path = directory / CODEX_RUN / "results.json"
    if not path.is_file():
        return None
    return msgspec.convert(json.loads(path.read_text(encoding="utf-8")), CodexRun)


def codex_sides(cell: CodexCell) -> dict[str, Side]:
    """Codex's summary per mode, recomputed from the cell's rollout records."""
    return msgspec.convert(codex_summary(cell.rollouts), dict[str, Side])


# ---- the real agent ---------------------------------------------------------------------------------

AGREE = {True: "overlap", False: "disjoint", None: "no interval"}


def overlap(a: Gain | None, b: Gain | None) -> bool | None:
    """Whether two gains' intervals overlap (None: either has none)."""
    if a is None or b is None or a.low is None or a.high is None or b.low is None or b.high is None:
        return None
    return a.low <= b.high and b.low <= a.high


def _g(side: Side | None, metric: str) -> Gain | None:
    return None if side is None else side.gains.get(metric)


def _calls(task: dict[str, str]) -> int:
    """The task's calls, from its prompt's directive lines (docs/protocol.md, "The directive script")."""
    return sum(1 for line in task.get("prompt", "").splitlines() if line.startswith("!call "))


class _Cell(msgspec.Struct):
    """What :func:`synthetic_cpu` reads of a cell record (records.RunRecord's fields of the same names)."""

    profile: str = ""
    workload: str = ""
    model: str = ""
    load: Load | None = None


class _Cells(msgspec.Struct):
    runs: list[_Cell] = []


def synthetic_cpu(directory: Path, model: str) -> CpuTime | None:
    """The lab client's run on a speed's plan: its groups' CPU and run-queue wait summed (the kept
    ``synthetic/MODEL/results.json``); None where that file or its ``lab_cpu`` is missing."""
    path = directory / CODEX_RUN / "synthetic" / model / "results.json"
    if not path.is_file():
        return None
    groups = {  # the cells of one group share its reading
        (c.profile, c.workload, c.model): c.load.lab_cpu
        for c in msgspec.json.decode(path.read_bytes(), type=_Cells).runs
        if c.load is not None and isinstance(c.load.lab_cpu, CpuTime)
    }
    if not groups:
        return None
    return CpuTime(sum(c.run_ms for c in groups.values()), sum(c.wait_ms for c in groups.values()))


def noise_lines(run: CodexRun, directory: Path | None = None) -> list[str]:
    """How much the lab's processes (Codex and its tools, the server, the lab) waited for a core over each
    speed's Codex rollouts, which speeds that flags noisy, and beside it the lab client's wait on the same
    plan: on a machine otherwise idle the difference is Codex's own processes contending with the server
    (docs/lab.md, "The real agent")."""

    def share(cpu: CpuTime) -> str:
        return f"{cpu.wait_share:.1%}" + (" (noisy)" if cpu.noisy else "")

    parts = []
    for m, c in run.models.items():
        if c.lab_cpu is None or c.lab_cpu.wait_share is None:
            continue
        lab = synthetic_cpu(directory, m) if directory is not None else None
        beside = f" (the lab client: {share(lab)})" if lab is not None and lab.wait_share is not None else ""
        parts.append(f"{_model_label(m)} {share(c.lab_cpu)}{beside}")
    if not parts:
        return []
    return [
        "**Noise**: the share of their CPU time the lab's processes waited for a core over the Codex "
        f"rollouts (above {WAIT_SHARE:.0%}: noisy), and over the lab client's on the same plan: "
        + ", ".join(parts)
        + ".",
        "",
    ]


def once_line(model: str, rollouts: Sequence[CodexRollout], calls: int) -> str:
    """Every tool once, counted from the file: call ids (server's log against Codex's rollout file) and the
    workspace's effects."""
    n = len(rollouts)
    ids = sum(len(r.call_ids) for r in rollouts)
    same = sum(
        1 for r in rollouts if r.call_ids == r.server_call_ids and len(set(r.call_ids)) == len(r.call_ids)
    )
    effects = sorted({k for r in rollouts for k in r.markers})
    once = sum(1 for r in rollouts if sorted(r.markers) == effects and set(r.markers.values()) == {1})
    full = sum(1 for r in rollouts if len(r.call_ids) == calls)
    return (
        f"- {_model_label(model)}: {n} rollouts, {ids} calls ({full} of {n} rollouts with the task's "
        f"{calls}); the server's log and Codex's rollout file name the same call ids in the same order, none "
        f"twice, in {same} of {n}; the workspace shows each of the task's {len(effects)} effects "
        f"({', '.join(effects)}) exactly once in {once} of {n}."
    )


def _rows(model: str, sides: dict[str, Side], synthetic: dict[str, Side]) -> list[str]:
    out = []
    for mode in MODES:
        if mode.name == BASELINE or mode.name not in sides or mode.synthetic not in synthetic:
            continue
        c, s = sides[mode.name], synthetic[mode.synthetic]
        cells_ = [_model_label(model), f"`{mode.server_mode}`"]
        for metric in ("e2e", "non_tool"):
            cg, sg = _g(c, metric), _g(s, metric)
            cells_ += [short(cg, verbose=True), short(sg, verbose=True), AGREE[overlap(cg, sg)]]
        out.append("| " + " | ".join(cells_) + " |")
    return out


def _split_rows(
    model: str, rollouts: Sequence[CodexRollout], sides: dict[str, Side], synthetic: dict[str, Side]
) -> list[str]:
    out = []
    plan_s = plan_tool_s(rollouts)
    for mode in MODES:
        c, s = sides.get(mode.name), synthetic.get(mode.synthetic)
        if c is None:
            continue
        mine = [r for r in rollouts if r.mode == mode.name]
        tokens = statistics.fmean(r.input_tokens / max(r.server_turns, 1) for r in mine)
        lab = (
            ["–"] * 3
            if s is None
            else [f"{s.non_tool_ms_per_turn:.1f}", f"{s.server_ms_per_turn:.1f}", f"{_cw(s):.1f}"]
        )
        out.append(
            f"| {_model_label(model)} | `{mode.server_mode}` | {mode.version} | "
            f"{c.non_tool_ms_per_turn:.1f} | {c.server_ms_per_turn:.1f} | {_cw(c):.1f} | "
            + " | ".join(lab)
            + f" | {statistics.median(r.tool_s for r in mine):.3f} | {plan_s:.3f} | {_int(tokens)} |"
        )
    return out


def _cw(side: Side) -> float:
    return side.non_tool_ms_per_turn - side.server_ms_per_turn


def plan_tool_s(rollouts: Sequence[CodexRollout]) -> float:
    """The tool time a rollout of the lab client's plan waits: each call's median over every Codex rollout of
    the speed, as proto/lab/run/codex_client.py's ``synthetic_plan`` writes it (ms to 3 decimals)."""
    k = min((len(r.tool_ms) for r in rollouts), default=0)
    return sum(round(statistics.median(r.tool_ms[i] for r in rollouts), 3) for i in range(k)) / 1e3


def why(
    model: str, rollouts: Sequence[CodexRollout], sides: dict[str, Side], synthetic: dict[str, Side]
) -> list[str]:
    """For each design whose two clients' gains disagree (an interval of either figure disjoint), where each
    client's non-tool time a turn changed against its own HTTP, split into server and client-and-wire, with
    the tools' and the prompt's change on Codex's side."""
    base, lab_base = sides.get(BASELINE), synthetic.get("http")
    if base is None or lab_base is None:
        return []
    out = []
    for mode in MODES:
        c, s = sides.get(mode.name), synthetic.get(mode.synthetic)
        if mode.name == BASELINE or c is None or s is None:
            continue
        agree = {m: overlap(_g(c, m), _g(s, m)) for m in ("e2e", "non_tool")}
        if False not in agree.values():
            continue
        mine = [r for r in rollouts if r.mode == mode.name]
        theirs = [r for r in rollouts if r.mode == BASELINE]
        tools = [statistics.median(r.tool_s for r in rs) for rs in (theirs, mine)]
        tokens = [
            statistics.fmean(r.input_tokens / max(r.server_turns, 1) for r in rs) for rs in (theirs, mine)
        ]
        share = (tools[1] - tools[0]) / base.e2e_s.p50 * 100 if base.e2e_s.p50 else float("nan")
        differ = ", ".join(f"{'E2E' if m == 'e2e' else 'non-tool'} {AGREE[v]}" for m, v in agree.items())
        out.append(
            f"- `{mode.server_mode}` at {_model_label(model)} ({differ}): against its client's HTTP, a "
            f"turn's non-tool time changes by {_delta(base, c)} for Codex ({mode.name}, {mode.version}) and "
            f"by {_delta(lab_base, s)} for the lab client. Codex's client and wire a turn: {_cw(base):.1f} → "
            f"{_cw(c):.1f} ms ({short(_g(c, 'client_and_wire'), verbose=True)}, paired); the lab client's "
            f"{_cw(lab_base):.1f} → {_cw(s):.1f} ms. Codex's tools a rollout (p50): {tools[0]:.3f} → "
            f"{tools[1]:.3f} s, {share:+.1f} % of `{BASELINE}`'s E2E p50 (the lab client waits the plan's "
            f"{plan_tool_s(rollouts):.3f} s in every mode); its prompt a turn: {_int(tokens[0])} → "
            f"{_int(tokens[1])} input tokens."
        )
    return out


def _delta(base: Side, side: Side) -> str:
    """``−21.4 ms from 96.7 (server −2.9, client and wire −18.5)``."""
    d = side.non_tool_ms_per_turn - base.non_tool_ms_per_turn
    ds = side.server_ms_per_turn - base.server_ms_per_turn
    return (
        f"{d:+.1f} ms from {base.non_tool_ms_per_turn:.1f} (server {ds:+.1f}, client and wire "
        f"{_cw(side) - _cw(base):+.1f})"
    )


def verdict(run: CodexRun) -> str:
    """How many of the clients' comparisons agree (intervals overlap) and, where not, whose gain is the
    larger (the more negative)."""
    agree = codex_larger = lab_larger = 0
    for cell in run.models.values():
        sides = codex_sides(cell)
        for mode in MODES:
            c, s = sides.get(mode.name), cell.synthetic.get(mode.synthetic)
            if mode.name == BASELINE or c is None or s is None:
                continue
            for metric in ("e2e", "non_tool"):
                cg, sg = _g(c, metric), _g(s, metric)
                both = overlap(cg, sg)
                if both is None or cg is None or sg is None:  # too few pairs for an interval
                    continue
                if both:
                    agree += 1
                elif float(cg.gain or 0.0) < float(sg.gain or 0.0):
                    codex_larger += 1
                else:
                    lab_larger += 1
    total = agree + codex_larger + lab_larger
    return (
        f"the two clients' intervals overlap in {agree} of {total} comparisons (speed × design × E2E and "
        f"non-tool); of the others, Codex's gain is the larger (the more negative) in {codex_larger} and "
        f"the lab client's in {lab_larger}"
    )


def codex_section(run: CodexRun, directory: Path | None = None) -> list[str]:
    """docs/lab-results.md's section on the real agent, from the kept ``codex`` run."""
    calls = _calls(run.task)
    per_mode = {
        _model_label(m): min(Counter(r.mode for r in c.rollouts).values(), default=0)
        for m, c in run.models.items()
    }
    counts = (
        f"{next(iter(per_mode.values()))} rollouts a mode at each of {', '.join(per_mode)}"
        if len(set(per_mode.values())) == 1
        else ", ".join(f"{n} rollouts a mode at {m}" for m, n in per_mode.items())
    )
    pv = run.provenance
    out = [
        f"From **`{run.command}`** (generated {run.generated}; commit `{(pv.commit or 'unknown')[:12]}`, "
        f"{pv.cores_usable} of {pv.cores} cores"
        + (f", {pv.scheduler}" if isinstance(pv.scheduler, str) else "")
        + f"): the task `{run.task.get('name', '?')}` ({calls} calls), {counts}"
        + (" (`--quick`: fewer than a default run's)" if run.quick else "")
        + ", the modes interleaved per rollout. Codex's gains are against `codex-http` (Codex 0.171 over "
        "HTTP; `codex-longlived` is Codex 0.107, so its gain holds a version change too), the lab client's "
        'against `http`, on the same plan (docs/lab.md, "The real agent"). Non-tool time = E2E − the tools\' '
        f"times. In short: {verdict(run)}.",
        "",
        "**Every tool ran exactly once**, counted from the file (each rollout's call ids as the server "
        "logged them and as Codex's rollout file holds them, and the workspace's markers):",
        "",
        *(once_line(m, c.rollouts, calls) for m, c in run.models.items()),
        "",
        *noise_lines(run, directory),
        "**The gains, side by side**: each design against its client's HTTP, % [95 % CI], and whether the "
        "two clients' intervals overlap.",
        "",
        "| speed | design | E2E: Codex | E2E: lab client | E2E intervals | non-tool: Codex | non-tool: "
        "lab client | non-tool intervals |",
        "|---|---|---|---|---|---|---|---|",
    ]
    split = [
        "",
        "**Where a turn's non-tool time goes** (ms a turn, mean over the rollouts; server = what the "
        "server's report accounts for: modelled prefill and decode, API phases; the rest is the client's own "
        "work and the wire), with the tools Codex measured and its prompt:",
        "",
        "| speed | design | Codex | Codex: non-tool | server | client + wire | lab client: non-tool | "
        "server | client + wire | Codex's tools s a rollout, p50 | the plan's tools s | Codex's input "
        "tokens a turn |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    reasons: list[str] = []
    for model, cell in run.models.items():
        sides = codex_sides(cell)
        out += _rows(model, sides, cell.synthetic)
        split += _split_rows(model, cell.rollouts, sides, cell.synthetic)
        reasons += why(model, cell.rollouts, sides, cell.synthetic)
    out += split
    if reasons:
        out += ["", "**Where the clients differ, and why:**", "", *reasons]
    return [*out, ""]


def codex_notes(run: CodexRun) -> list[str]:
    """NOTES.md's finding on the real agent: each design's E2E gain, Codex's beside the lab client's."""
    parts = []
    n = calls = 0
    for model, cell in run.models.items():
        sides = codex_sides(cell)
        n += len(cell.rollouts)
        calls += sum(len(r.call_ids) for r in cell.rollouts if r.call_ids == r.server_call_ids)
        pairs = [
            f"`{m.server_mode}` {short(_g(sides.get(m.name), 'e2e'))} vs "
            f"{short(_g(cell.synthetic.get(m.synthetic), 'e2e'))}"
            for m in MODES
            if m.name != BASELINE and m.name in sides
        ]
        base, lab = sides.get(BASELINE), cell.synthetic.get("http")
        cw = f" (HTTP's client and wire a turn {_cw(base):.1f} vs {_cw(lab):.1f} ms)" if base and lab else ""
        parts.append(f"{_model_label(model)}: " + ", ".join(pairs) + cw)
    return [
        f"- *The real agent* (`{CODEX_RUN}`: Codex CLI through a repository task, {n} rollouts, {calls} "
        "calls, each run once as the server logged it): E2E gain against its client's HTTP, Codex vs the lab "
        "client on the same plan — " + "; ".join(parts) + f"; {verdict(run)} (docs/lab-results.md, "
        '"The real agent").'
    ]


# ---- the peers ----------------------------------------------------------------------------------------


def history_tokens(cell: dict[str, RunRecord]) -> int:
    """The largest prompt of a round the server counted in the cell (its history's reach)."""
    return max(
        (row[0] for r in cell.values() for rounds in r.usage_by_round.values() for row in rounds), default=0
    )


def _pct2(a: float | None, b: float | None) -> str:
    return " / ".join("–" if x is None else f"{x:.1f}" for x in (a, b))


def overhead_gain(cell: dict[str, RunRecord], mode: str, base: str) -> Gain | None:
    """The paired gain of ``mode`` against ``base`` on each rollout's median turn overhead (the same pairs
    and bootstrap as the E2E and TTFT gains); None where a file predates the per-rollout figure."""
    mine, theirs = (cell[m].rollout_records if m in cell else UNSET for m in (mode, base))
    if mine is UNSET or theirs is UNSET or mode == base:
        return None
    by_key = {(r.index, r.session): r.turn_overhead_ms_p50 for r in theirs}
    pairs = [(r.turn_overhead_ms_p50, by_key.get((r.index, r.session))) for r in mine]
    values = [(a, b) for a, b in pairs if isinstance(a, float) and isinstance(b, float)]
    if not values or len(values) < len(pairs):
        return None
    return paired_gain([a for a, _ in values], [b for _, b in values], baseline=base, metric="overhead")


def peer_table(cell: dict[str, RunRecord], peer: str) -> list[str]:
    out = [
        f"| mode | E2E s p50 | TTFT ms p50 / p90 | turn overhead ms p50 / p90 | E2E vs {peer} | TTFT vs "
        f"{peer} | turn overhead vs {peer} | E2E vs http | TTFT vs http |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in (*OURS, peer):
        r = cell.get(mode)
        if r is None:
            continue
        vs_peer = [
            short(gain(cell, mode, peer, m), verbose=True) if mode != peer else "–" for m in ("e2e", "ttft")
        ]
        vs_peer.append(short(overhead_gain(cell, mode, peer), verbose=True))
        vs_http = [
            short(gain(cell, mode, "http", m), verbose=True) if mode != "http" else "–"
            for m in ("e2e", "ttft")
        ]
        out.append(
            f"| {mode} | {'–' if r.e2e_s_p50 is None else f'{r.e2e_s_p50:.3f}'} | "
            f"{_pct2(r.ttft_ms_p50, r.ttft_ms_p90)} | "
            f"{_pct2(r.turn_overhead_ms_p50, r.turn_overhead_ms_p90)} | "
            + " | ".join(vs_peer + vs_http)
            + " |"
        )
    return out


def split_line(cell: dict[str, RunRecord], peer: str) -> str:
    """The gateway/upstream split of the peer's TTFT, and its turn overhead against ``http``'s."""
    r = cell[peer]
    info: dict[str, Any] = r.peer if isinstance(r.peer, dict) else {}
    gw = [float(t["gateway_ms"]) for t in info.get("turns") or []]
    first_last = [
        f"{name} {_ms(xs[0])} at the first turn, {_ms(xs[-1])} at the last ({len(xs)})"
        for name, xs in (
            ("gateway", info.get("gateway_ms_by_turn") or []),
            ("upstream", info.get("upstream_ms_by_turn") or []),
        )
        if xs and None not in (xs[0], xs[-1])
    ]
    http = cell.get("http")
    added = (
        " Its turn overhead p50 less `http`'s: "
        f'{r.turn_overhead_ms_p50 - http.turn_overhead_ms_p50:+.1f} ms (docs/lab.md, "Peers", on what '
        "each holds)."
        if http is not None and r.turn_overhead_ms_p50 is not None and http.turn_overhead_ms_p50 is not None
        else ""
    )
    calls = ", ".join(f"{k} {v}" for k, v in (info.get("upstream_calls") or {}).items())
    return (
        f"{peer} {info.get('version', '')} in front of `{info.get('upstream', '?')}`, each turn's TTFT "
        f"split over {len(gw)} turns: gateway p50 {_ms(info.get('gateway_ms_p50'))} (p90 "
        f"{_ms(percentiles(gw).p90)}), upstream p50 {_ms(info.get('upstream_ms_p50'))}; medians per turn "
        f"index: {'; '.join(first_last) or '–'}.{added} The upstream's model made the calls "
        f"{calls or 'none'} in the measured turns, each run by the client and answered through the gateway. "
        "The gateway's rollouts run after this server's modes, not interleaved with them."
    )


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} ms"


def _int(x: float) -> str:
    """``5 143``: thousands apart by a space, as the docs write them."""
    return f"{x:,.0f}".replace(",", " ")


def _peer_cells(runs: dict[str, Results]) -> list[tuple[str, tuple[str, str, str], dict[str, RunRecord]]]:
    return [
        (name, key, cell)
        for name in PEER_RUNS
        if name in runs and runs[name].format is not UNSET
        for key, cell in cells(runs[name].runs).items()
        if AGENTIC_API in cell
    ]


def peers_section(runs: dict[str, Results]) -> list[str]:
    """docs/lab-results.md's section on the peers, from the kept ``peer-1k`` / ``peer-100k`` runs."""
    out: list[str] = []
    for name, (profile, workload, model), cell in _peer_cells(runs):
        results = runs[name]
        noisy = sorted({why for r in cell.values() for why in (r.noisy or [])})
        n = min(len(r.rollout_records or []) for r in cell.values())
        out += [
            f"**`{name}`** — {profile} · {workload} · {model}, history to {_int(history_tokens(cell))} "
            f"tokens, {n} rollouts a mode, from **`{results.command}`**"
            + (f"; noisy: {'; '.join(noisy)}" if noisy else "")
            + ".",
            "",
            *peer_table(cell, AGENTIC_API),
            "",
            split_line(cell, AGENTIC_API),
            "",
        ]
    return out


def peers_notes(runs: dict[str, Results]) -> list[str]:
    """NOTES.md's finding on vLLM's gateway: ``ws`` and ``longlived`` against it, per run."""
    parts = []
    for name, _, cell in _peer_cells(runs):
        peer = cell[AGENTIC_API].peer
        info: dict[str, Any] = peer if isinstance(peer, dict) else {}
        mine = [
            f"`{m}` E2E {short(gain(cell, m, AGENTIC_API, 'e2e'))}, TTFT "
            f"{short(gain(cell, m, AGENTIC_API, 'ttft'))}"
            for m in ("ws", "longlived")
            if m in cell
        ]
        parts.append(
            f"`{name}` (history to {history_tokens(cell) / 1000:.0f} k tokens): "
            + "; ".join(mine)
            + f"; the gateway's share of its TTFT p50 {_ms(info.get('gateway_ms_p50'))}"
        )
    if not parts:
        return []
    return [
        "- *vLLM's gateway* (agentic-api in front of `http`): this server's designs against it, gain % — "
        + ". ".join(parts)
        + ' (docs/lab-results.md, "Peers").'
    ]


# ---- the hooks writeup.py calls --------------------------------------------------------------------


def sections(directory: Path, runs: dict[str, Results]) -> list[str]:
    """The document's sections on the real agent and the peers; none for a run that is not kept."""
    out: list[str] = []
    codex = load_codex(directory)
    if codex is not None:
        out += [
            "## The real agent: does the lab client's result hold for Codex?",
            "",
            *codex_section(codex, directory),
        ]
    peers = peers_section(runs)
    if peers:
        out += [
            "## Peers: `ws` and `longlived` against vLLM's gateway (agentic-api)",
            "",
            "Each design's gain against agentic-api paired here by rollout (the same plans and tool times), "
            'and against `http` as the run stored it, % [95 % CI] (docs/lab.md, "Peers"). Turn overhead = '
            "TTFT − the modelled prefill and queue wait the server reported for that turn (the gateway's: "
            "its upstream's report); its gain is paired on each rollout's median, which a run written "
            "before the lab kept that figure lacks (–).",
            "",
            *peers,
        ]
    return out


def notes(directory: Path, runs: dict[str, Results]) -> list[str]:
    """NOTES.md's findings on the real agent and the peers; none for a run that is not kept."""
    codex = load_codex(directory)
    return (codex_notes(codex) if codex is not None else []) + peers_notes(runs)
