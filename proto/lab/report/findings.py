"""The kept set's curves and findings (docs/lab-results.md, "Findings" and "Curves"; NOTES.md's findings
block): every figure computed here from the kept runs' results.json (format 2: paired, interleaved, with
bootstrap intervals), never typed.

The kept set (docs/lab.md, "Kept runs") is read by run name: ``speed`` (the decode classes, local rules),
``hops`` (the rules factor at 1 000 tokens/s), ``turns-8`` / ``turns-30`` and ``tools-0`` / ``tools-1`` (the
other points of the turns and tool-time curves; ``speed``'s 1 000 tokens/s cell is their middle point),
``scenario-sglang`` and ``scenario-vllm`` (published comparisons), ``quick`` (``make bench``), ``validate``
(the fast model judged out of sample). A missing run leaves its rows out.

One sign everywhere (proto/lab/analysis/stats.py, ``SIGN``): a gain is the mean over rollout pairs of mode ÷
baseline − 1, negative = faster; a gain whose 95 % interval holds 0 is "no difference" (``=``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from msgspec import UNSET

from proto.lab.analysis.stats import FASTER, SAME, SLOWER, Gain, paired_gain
from proto.lab.records import Design, Provenance, Results, RunRecord
from proto.lab.report.results import BASELINES, cells, figure

SEED_GAIN = -0.40  # OpenAI's post (2026-04-22): agent loops up to 40 % faster end to end
MODES4 = ("http-cached", "http-prev", "ws", "longlived")
Cell = dict[str, RunRecord]  # mode → run record


@dataclass(frozen=True)
class Point:
    label: str  # the curve's factor at this point
    run: str  # the kept run it comes from
    cell: Cell


@dataclass(frozen=True)
class Curve:
    title: str
    factor: str
    points: tuple[Point, ...]


def _cells(runs: dict[str, Results], name: str) -> dict[tuple[str, str, str], Cell]:
    results = runs.get(name)
    if results is None or results.format is UNSET:
        return {}
    return cells(results.runs)


def _one(runs: dict[str, Results], name: str, model: str | None = None) -> Cell | None:
    """The run's cell at ``model`` (its only cell when None); None when the run or cell is missing."""
    found = [c for (_, _, m), c in _cells(runs, name).items() if model is None or m == model]
    return found[0] if found else None


def _model_label(model: str) -> str:
    return model.removeprefix("mock-")


def curves(runs: dict[str, Results]) -> list[Curve]:
    """The kept set's four curves, each point one (profile, workload, model) group of a kept run."""
    out = []
    speed = tuple(Point(_model_label(m), "speed", c) for (_, _, m), c in _cells(runs, "speed").items())
    if speed:
        out.append(Curve("Decode speed (coding agent, 15 turns, tools × 0.1, local rules)", "model", speed))
    rules = []
    local = _one(runs, "speed", "mock-1000tps")
    if local:
        rules.append(Point("local (measured work only)", "speed", local))
    rules += [Point(p, "hops", c) for (p, _, _), c in _cells(runs, "hops").items()]
    if rules:
        out.append(
            Curve(
                "Rules and hops (1 000 tok/s, coding agent, 15 turns, tools × 0.1)", "profile", tuple(rules)
            )
        )
    turns = [
        Point(label, name, c)
        for label, name in (("8", "turns-8"), ("15", "speed"), ("30", "turns-30"))
        if (c := _one(runs, name, "mock-1000tps" if name == "speed" else None))
    ]
    if len(turns) > 1:
        out.append(
            Curve("Turns (1 000 tok/s, coding agent, tools × 0.1, local rules)", "turns", tuple(turns))
        )
    tools = [
        Point(label, name, c)
        for label, name in (("× 0", "tools-0"), ("× 0.1", "speed"), ("× 1", "tools-1"))
        if (c := _one(runs, name, "mock-1000tps" if name == "speed" else None))
    ]
    if len(tools) > 1:
        out.append(
            Curve("Tool time (1 000 tok/s, coding agent, 15 turns, local rules)", "tool times", tuple(tools))
        )
    return out


def gain(cell: Cell, mode: str, base: str, metric: str) -> Gain | None:
    """The stored paired gain of ``mode`` against a baseline of the run (``BASELINES``), or one computed here
    from both modes' rollout records (the same pairs, the same bootstrap) against any other mode."""
    run, other = cell.get(mode), cell.get(base)
    if run is None or other is None:
        return None
    if base in BASELINES:
        return None if run.gains is UNSET else run.gains.get(base, {}).get(metric)
    field = {"e2e": "e2e_s", "ttft": "ttft_ms_p50"}[metric]
    mine = [] if run.rollout_records is UNSET else run.rollout_records
    theirs = {
        (r.index, r.session): r for r in ([] if other.rollout_records is UNSET else other.rollout_records)
    }
    pairs = [
        (float(getattr(r, field)), float(getattr(theirs[(r.index, r.session)], field)))
        for r in mine
        if (r.index, r.session) in theirs
    ]
    if not pairs:
        return None
    return paired_gain([a for a, _ in pairs], [b for _, b in pairs], baseline=base, metric=metric)


def short(g: Gain | None, verbose: bool = False) -> str:
    """``−9.1 [−11.9, −4.9]`` (percent); ``= −1.2 [−6.0, +3.9]`` when the interval holds 0. ``verbose``
    (the runs' own tables): ``−9.1 % [−11.9, −4.9]``, ``no difference (…)``, and the verdict and pairs when
    there are too few for an interval."""
    if g is None or g.gain is None:
        return "–"
    unit = " %" if verbose else ""
    if g.low is None or g.high is None:
        return f"{g.gain * 100:+.1f}{unit} " + (
            f"({g.verdict}, {g.pairs} pairs)" if verbose else "(too few pairs)"
        )
    text = f"{g.gain * 100:+.1f}{unit} [{g.low * 100:+.1f}, {g.high * 100:+.1f}]"
    if g.verdict != SAME:
        return text
    return f"no difference ({text})" if verbose else f"= {text}"


def _noisy(cell: Cell) -> str:
    reasons = next((r.noisy for r in cell.values() if r.noisy), None)
    return "; ".join(reasons) if reasons else "no"


def curve_tables(curve: Curve) -> list[str]:
    """Two tables a curve: the E2E gains and the TTFT gains, each mode against http and the two stateful
    designs against http-cached, with http's own p50 for scale."""
    out = [f"### {curve.title}", ""]
    for metric, unit, key, digits in (("e2e", "s", "e2e_s_p50", 2), ("ttft", "ms", "ttft_ms_p50", 1)):
        out += [
            f"**{metric.upper()}** — gain % [95 % CI] (`=`: no difference)",
            "",
            f"| {curve.factor} | run | http p50 {unit} | "
            + " | ".join(f"{m} vs http" for m in MODES4)
            + " | ws vs http-cached | longlived vs http-cached | longlived vs ws | noisy |",
            "|---|---|---|" + "---|" * (len(MODES4) + 4),
        ]
        for p in curve.points:
            http = figure(p.cell["http"], key) if "http" in p.cell else None
            out.append(
                f"| {p.label} | `{p.run}` | {'–' if http is None else f'{http:.{digits}f}'} | "
                + " | ".join(short(gain(p.cell, m, "http", metric)) for m in MODES4)
                + f" | {short(gain(p.cell, 'ws', 'http-cached', metric))}"
                + f" | {short(gain(p.cell, 'longlived', 'http-cached', metric))}"
                + f" | {short(gain(p.cell, 'longlived', 'ws', metric))}"
                + f" | {_noisy(p.cell)} |"
            )
        out.append("")
    return out


def _every_cell(runs: dict[str, Results]) -> list[tuple[str, tuple[str, str, str], Cell]]:
    return [
        (name, key, cell)
        for name, results in runs.items()
        if results.format is not UNSET and not (isinstance(results.design, Design) and results.design.quick)
        for key, cell in cells(results.runs).items()
    ]


def _where(name: str, key: tuple[str, str, str]) -> str:
    profile, workload, model = key
    return f"`{name}`: {profile} · {workload} · {model}"


def _verdicts(gs: Sequence[Gain | None]) -> str:
    counts = {v: sum(1 for g in gs if g is not None and g.verdict == v) for v in (FASTER, SAME, SLOWER)}
    return f"faster in {counts[FASTER]}, no difference in {counts[SAME]}, slower in {counts[SLOWER]}"


def findings(runs: dict[str, Results]) -> list[str]:
    """The findings' bullets, each figure from the kept runs (NOTES.md quotes exactly these)."""
    out: list[str] = []
    every = _every_cell(runs)
    stateful = [
        (name, key, m, g)
        for name, key, cell in every
        for m in ("ws", "longlived")
        if (g := gain(cell, m, "http", "e2e")) is not None and g.gain is not None
    ]
    if stateful:
        best = min(stateful, key=lambda s: float(s[3].gain or 0.0))
        reached = sum(1 for s in stateful if float(s[3].gain or 0.0) <= SEED_GAIN)
        out.append(
            f"- **OpenAI's −40 % end to end** is reached in {reached} of the {len(stateful)} measured `ws` "
            f"and `longlived` cells against `http`; the largest gain is {best[2]}'s {short(best[3])} "
            f"({_where(best[0], best[1])})."
        )
    for title, base in (
        ("against `http`", "http"),
        ("against `http-cached` (HTTP as it was before WebSockets)", "http-cached"),
    ):
        both = [cell for _, _, cell in every if "longlived" in cell and base in cell]
        gs = [gain(cell, "longlived", base, "e2e") for cell in both]
        ts = [gain(cell, "longlived", base, "ttft") for cell in both]
        if any(gs):
            out.append(
                f"- **`longlived` {title}**, over the {len(gs)} measured cells: E2E {_verdicts(gs)}; "
                f"TTFT p50 {_verdicts(ts)}."
            )
    lw = [
        gain(cell, "longlived", "ws", "e2e") for _, _, cell in every if "longlived" in cell and "ws" in cell
    ]
    lwt = [
        gain(cell, "longlived", "ws", "ttft") for _, _, cell in every if "longlived" in cell and "ws" in cell
    ]
    if any(lw):
        out.append(
            "- **`longlived` against `ws`** (the long-lived response's own part, beyond the GA WebSocket): "
            f"E2E {_verdicts(lw)}; TTFT p50 {_verdicts(lwt)} of {len(lw)} cells."
        )
    for curve in curves(runs):
        e2e = "; ".join(f"{p.label} {short(gain(p.cell, 'longlived', 'http', 'e2e'))}" for p in curve.points)
        vs_cached = "; ".join(
            f"{p.label} {short(gain(p.cell, 'longlived', 'http-cached', 'e2e'))}" for p in curve.points
        )
        out.append(
            f"- *{curve.title}*: `longlived` vs `http` E2E % by {curve.factor}: {e2e}. Against "
            f"`http-cached`: {vs_cached}."
        )
    sg = _cells(runs, "scenario-sglang")
    chains = sorted(
        ((int(w.removeprefix("chain-")), c) for (_, w, _), c in sg.items() if w.startswith("chain-")),
        key=lambda x: x[0],
    )
    if chains:
        out.append(
            "- *SGLang's gateway comparison* (`scenario-sglang`; they report `ws` vs an HTTP "
            "`previous_response_id` chain TTFT p50 −28 % at 8 turns, −41 % at 40): measured "
            + "; ".join(
                f"{n} turns {c['ws'].ttft_ms_p50:.2f} vs {c['http-prev'].ttft_ms_p50:.2f} ms, "
                f"{short(gain(c, 'ws', 'http-prev', 'ttft'))}"
                for n, c in chains
                if "ws" in c and "http-prev" in c
            )
            + "."
        )
    vl = _cells(runs, "scenario-vllm")
    if vl:
        out.append(
            "- *vLLM's `/v1/responses` API cost as the HTTP modes' knob* (`scenario-vllm`): `longlived` vs "
            "`http` E2E "
            + "; ".join(
                f"{w} {short(gain(c, 'longlived', 'http', 'e2e'))} "
                f"(TTFT {short(gain(c, 'longlived', 'http', 'ttft'))})"
                for (_, w, _), c in vl.items()
            )
            + "."
        )
    groups = {(name, key): cell for name, key, cell in every}
    noisy = [k for k, c in groups.items() if _noisy(c) != "no"]
    where = [r.provenance for r in runs.values() if r.format is not UNSET and r.format and r.runs]
    commits = sorted({str(pv.commit if isinstance(pv, Provenance) else "?")[:12] for pv in where})
    schedulers = sorted(
        {
            str(pv.scheduler if isinstance(pv, Provenance) and pv.scheduler is not UNSET else None)
            for pv in where
        }
    )
    if groups:
        out.append(
            f"- *Provenance*: {len(groups)} measured groups from {len(commits)} commit(s) "
            f"({', '.join(f'`{c}`' for c in commits)}), scheduled {', '.join(schedulers)}; {len(noisy)} "
            "flagged noisy" + (": " + ", ".join(_where(n, k) for n, k in noisy) if noisy else "") + "."
        )
    return out
