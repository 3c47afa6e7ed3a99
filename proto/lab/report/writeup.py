"""``responses-lab bench report``: the lab's results as Markdown, generated from bench runs' results.json —
never typed by hand.

    responses-lab bench report bench-out/results.json [--again OTHER/results.json] [--write FILE]
        [--marker results] [--title Results]
    responses-lab bench report --lab [DIR] [--out FILE] [--notes NOTES.md]

Prints one run's Markdown (a format-2 run: with its paired gains, :func:`paired_section`); with ``--write``
it replaces the text between the ``<!-- MARKER:begin -->`` and ``<!-- MARKER:end -->`` markers of that file
(``results`` unless ``--marker``). ``--again`` adds the repeatability check: every ratio of the first run
(mode ÷ http, per profile) set against the same ratio of a second run of the same command.

``--lab`` writes the lab's results document from the runs kept in DIR (``docs/results``: one sub-directory
per run, each with its results.json) into ``--out`` (``docs/lab-results.md``; ``-`` prints it): the lab's one
sign (proto/lab/analysis/stats.py, ``SIGN``) and the findings (:func:`findings`: the figures NOTES.md quotes;
``--notes`` writes them into its marked block); the measured curves (proto/lab/report/findings.py, which
reads the kept set by name: ``speed``, ``hops``, ``turns-8`` / ``turns-30``, ``tools-0`` / ``tools-1``) and
the scenarios (``scenario-sglang``, ``scenario-vllm``); the real agent (``codex``) and vLLM's gateway
(``peer-1k``, ``peer-100k``), from proto/lab/report/agent_findings.py; the fleets, routing and network
(``fleet``, ``fleet-single``, ``routing``, ``network``), from proto/lab/report/fleet_findings.py; the fast
model's calibration and
curves (``speed``'s), its grid (``grid-predicted``), predicted vs measured for every real-clock cell and the
validation sample (``validate-sample``); then, for every run of format 2, its paired gains with their
bootstrap intervals, noisy flags and provenance (:func:`paired_section`). A run that is missing leaves its
section out.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from proto.core.response import MODES
from proto.helpfmt import HelpFormatter
from proto.lab.analysis.stats import SIGN, Gain, Percentiles
from proto.lab.records import Design, GridRow, Load, Provenance, Results, RunRecord
from proto.lab.report import agent_findings, fleet_findings
from proto.lab.report.findings import SEED_GAIN, _model_label, curve_tables, curves, short
from proto.lab.report.findings import findings as kept_findings
from proto.lab.report.markdown import change, render, value
from proto.lab.report.results import cells, figure, load_results

RESULTS = Path("docs/results")
DOCUMENT = Path("docs/lab-results.md")

REFERENCE = {"H=1k": 1000, "H=8k": 8000, "H=32k": 32000, "H=100k": 100_000}


def fitted(fit: dict[str, Any], key: str, h: int, a: int = 1000, chain: int = 5, out: int = 50) -> float:
    c = fit[key]
    return max(float(c[0] + c[1] * h + c[2] * a + c[3] * chain + c[4] * out), 0.0)


def calibration_section(first: Results) -> list[str]:
    cal = first.calibration or {}
    rows = [
        f"Command: **`{first.command}`** (started {first.started_utc}; calibration {cal['wall_s']:.0f} "
        f"s, "
        f"{sum(cal['rounds_by_mode'].values())} rounds, history to {cal['h_max'] // 1000} k tokens).",
        "",
        "Fitted per-round overhead `c` (ms; one session, no hops, a continuation appending 1 k tokens, 50 "
        "output tokens, "
        "chain 5), its part before the first token `o`, and the remote calls per round:",
        "",
        "| mode | "
        + " | ".join(f"c at {k}" for k in REFERENCE)
        + " | o at H=32k | rewrite c at H=32k | safety hops | resolutions |",
        "|---|" + "---|" * (len(REFERENCE) + 4),
    ]
    for mode in MODES:
        kinds = cal["fits"].get(mode)
        if not kinds:
            continue
        cont = kinds.get("outputs") or next(iter(kinds.values()))
        rewrite = kinds.get("rewrite", cont)
        rows.append(
            f"| {mode} | "
            + " | ".join(f"{fitted(cont, 'c_ms', h):.2f}" for h in REFERENCE.values())
            + f" | {fitted(cont, 'o_ms', 32000):.2f} | {fitted(rewrite, 'c_ms', 32000, a=8000, chain=0):.2f} "
            f"| {cont['safety_hops']:.2f} | {cont['model_resolutions']:.2f} |"
        )
    rows += [
        "",
        "Per-1 k-token slopes of `c` (ms per 1 000 history tokens H / appended tokens A), continuation "
        "rounds: "
        + "; ".join(
            f"{m} {k['outputs']['c_ms'][1] * 1e3:.3f} / {k['outputs']['c_ms'][2] * 1e3:.3f}"
            for m, k in cal["fits"].items()
            if "outputs" in k
        )
        + ".",
    ]
    return rows


def curve_table(
    sweep: list[dict[str, Any]], curve: str, x_key: str, x_label: str, profiles: tuple[str, ...]
) -> list[str]:
    rows_ = [r for r in sweep if r.get("curve") == curve]
    if not rows_:
        return ["(no sweep in this run)"]
    modes = [m for m in MODES if any(r["mode"] == m for r in rows_) and m != "http"]
    out = [
        f"| {x_label} | profile | http E2E s (predicted) | "
        + " | ".join(f"{m} E2E / TTFT (predicted)" for m in modes)
        + " |",
        "|---|---|---|" + "---|" * len(modes),
    ]
    for profile in profiles:
        xs = sorted({r[x_key] for r in rows_ if profile in ("", r["profile"])})
        for x in xs:
            at = {r["mode"]: r for r in rows_ if r[x_key] == x and profile in ("", r["profile"])}
            if "http" not in at:
                continue
            cellv = [
                f"{at[m]['predicted_e2e_vs_http'] * 100:+.1f} % / "
                f"{at[m]['predicted_ttft_vs_http'] * 100:+.1f} %"
                if m in at
                else "–"
                for m in modes
            ]
            out.append(
                f"| {x:g} | {at['http']['profile']} | {at['http']['predicted_e2e_s']:.2f} | "
                + " | ".join(cellv)
                + " |"
            )
    return out


def curves_section(results: Results) -> list[str]:
    sweep = results.sweep or []
    scale = sweep[0]["tool_time_scale"] if sweep else 1.0
    return [
        f"From **`{results.command}`**; **predicted by the fast model**, not measured; one session, "
        f"coding-agent, tool times × {scale:g}. Gain vs http, E2E / TTFT p50.",
        "",
        "**Against decode speed** (each speed with its class's prefill: GPU-served 80 ms + 8.5 µs/token "
        "below 500 "
        "tokens/s, wafer-scale 1 ms + 39 µs/token from 500; `gain_vs_speed.png`):",
        "",
        *curve_table(sweep, "speed", "decode_tps", "tokens/s", ("local", "production-like")),
        "",
        "**Against turns** (mock-1000tps; `gain_vs_turns.png`):",
        "",
        *curve_table(sweep, "turns", "turns", "turns", ("local", "production-like")),
        "",
        "**Against the hop cost** (mock-1000tps; resolve hop a tenth of the safety hop; `gain_vs_hops.png`):",
        "",
        *curve_table(sweep, "hops", "safety_hop_ms", "safety hop ms", ("",)),
        "",
    ]


def predicted_section(runs_by_name: dict[str, Results]) -> tuple[list[str], float]:
    rows = [
        "| run | profile · workload · model | mode | E2E p50 s | predicted | error | TTFT p50 ms | predicted "
        "|",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for name, results in runs_by_name.items():
        for run in results.runs:
            err = figure(run, "prediction_error")
            if err is None:
                continue
            worst = max(worst, abs(err))
            rows.append(
                f"| {name} | {run.profile} · {run.workload} · {run.model} | {run.mode} | "
                f"{run.e2e_s_p50:.2f} "
                f"| {figure(run, 'predicted_e2e_s_p50'):.2f} | {err * 100:+.1f} % | {run.ttft_ms_p50:.1f} | "
                f"{figure(run, 'predicted_ttft_ms_p50'):.1f} |"
            )
    return rows, worst


def measured_cells(
    runs: dict[str, Results], tool_time_scale: float
) -> dict[tuple[str, str, str], dict[str, RunRecord]]:
    """(profile, workload, model) → mode → the real-clock cell of a kept run at ``tool_time_scale`` over whole
    workloads (no ``--turns`` cut), for marking a predicted grid's measured cells."""
    out: dict[tuple[str, str, str], dict[str, RunRecord]] = {}
    for results in runs.values():
        config = results.config or {}
        if config.get("turns") is not None or config.get("tool_time_scale") != tool_time_scale:
            continue
        for key, modes in cells(
            [r for r in results.runs if figure(r, "prediction_error") is not None]
        ).items():
            out.setdefault(key, {}).update(modes)
    return out


def grid_section(
    results: Results, measured: dict[tuple[str, str, str], dict[str, RunRecord]] | None = None
) -> list[str]:
    """``bench --predict``'s grid: per (workload, model), http's E2E p50 and the WebSocket designs' E2E (and
    ``longlived``'s TTFT) against it, in both profiles; the best gain and where the seed's −40 % is met. With
    ``measured`` (:func:`measured_cells`), a last column names the cells the real clock measured and the
    largest error of their own runs' predictions."""
    rows = results.grid or []
    if not rows:
        return ["(no grid in this run)"]
    measured = measured or {}
    by = cells(rows)
    profiles = list(dict.fromkeys(k[0] for k in by))
    pairs = list(dict.fromkeys((k[1], k[2]) for k in by))
    scale = rows[0].tool_time_scale
    wall = sum(r.predicted_wall_s for r in rows)
    gains = [r for r in rows if r.mode in ("ws", "longlived") and r.predicted_e2e_vs_http is not None]
    best = min(gains, key=_grid_gain, default=None)
    met = [r for r in gains if _grid_gain(r) <= SEED_GAIN]
    head = ["workload", "model"]
    for profile in profiles:
        head += [f"{profile} http E2E s", "ws", "longlived", "longlived TTFT"]
    head = [h if h in ("workload", "model") else f"{h} (predicted)" for h in head]
    grid_keys = {(r.profile, r.workload, r.model, r.mode) for r in rows}
    hits = {
        (*key, mode): run
        for key, modes in measured.items()
        for mode, run in modes.items()
        if (*key, mode) in grid_keys
    }
    if hits:
        head.append("measured on the real clock (largest error)")
    out = [
        f"From **`{results.command}`**"
        + (f" (calibration from `{results.calibration_from}`)" if results.calibration_from else "")
        + f": {len(rows)} cells, tool times × {scale:g}, {rows[0].sessions} sessions × "
        f"{rows[0].rollouts} rollouts for the synthetic workloads (a trace: its own sessions). "
        + (
            f"**Predicted by the fast model**; {len(hits)} of its cells measured on the real clock (the last "
            "column: each profile's measured modes and the largest |error| of their own runs' predictions, "
            'E2E p50; docs/lab.md, "The validation sample"), the rest not run.'
            if hits
            else "**Predicted by the fast model, not run on the real clock.**"
        )
        + " Gain vs http, p50.",
        "",
        "| " + " | ".join(head) + " |",
        "|---|---|" + "---|" * (len(head) - 2),
    ]
    for workload, model in pairs:
        cellv = [workload, model]
        for profile in profiles:
            modes = by.get((profile, workload, model), {})
            base = modes.get("http")
            cellv.append("–" if base is None else f"{base.predicted_e2e_s_p50:.1f}")
            for mode, key in (("ws", "e2e"), ("longlived", "e2e"), ("longlived", "ttft")):
                r = figure(modes[mode], f"predicted_{key}_vs_http") if mode in modes else None
                cellv.append("–" if r is None else f"{r * 100:+.1f} %")
        if hits:
            done = []
            for profile in profiles:
                runs = {
                    m: run for (p, w, mo, m), run in hits.items() if (p, w, mo) == (profile, workload, model)
                }
                if runs:
                    worst = max(abs(figure(run, "prediction_error")) for run in runs.values())
                    names = ", ".join(m for m in MODES if m in runs)
                    done.append(f"{profile}: {names} ({worst * 100:.1f} %)")
            cellv.append("; ".join(done) or "–")
        out.append("| " + " | ".join(cellv) + " |")
    out += [
        "",
        (
            "Largest predicted E2E gain of a WebSocket design: "
            f"**{_grid_gain(best) * 100:+.1f} %** "
            f"({best.mode}, {best.profile} · {best.workload} · {best.model}). "
            if best
            else ""
        )
        + f"Cells at or beyond the seed's {SEED_GAIN * 100:.0f} %: **{len(met)}** of {len(gains)}. "
        f"The whole grid on the real clock: {wall / 3600:.1f} h of measured rollouts by the fast model's "
        'walls (docs/lab.md, "The fast model\'s grid").',
    ]
    return out


def _grid_gain(row: GridRow) -> float:
    """A grid row's predicted E2E gain against ``http`` (rows without one are left out before)."""
    return float(row.predicted_e2e_vs_http or 0.0)


def scenario_section(results: Results) -> list[str]:
    sc = results.scenario or {}
    out = [
        f"- **Authors**: {sc.get('authors', '–')}",
        f"- **Conditions here**: {sc.get('conditions', '–')}",
        f"- **Command**: `{results.command}`",
    ]
    fast = scenario_answers(results)
    if fast:
        out.append(
            "- **Fast model (predicted)**: " + "; ".join(f"{k} = {_fmt_any(v)}" for k, v in fast.items())
        )
    if results.runs:
        out += ["", "Measured (real clock):", ""]
        for (profile, workload, model), modes in cells(results.runs).items():
            base = modes.get(
                "http-prev" if "sglang" in sc.get("name", "") or sc.get("name") == "xai" else "http"
            )
            out.append(
                f"- {profile} · {workload} · {model}: "
                + "; ".join(
                    f"{m} E2E {r.e2e_s_p50:.2f} s ({change(r.e2e_s_p50, value(base, 'e2e_s_p50'))}), "
                    f"TTFT {r.ttft_ms_p50:.1f} ms "
                    f"({change(r.ttft_ms_p50, value(base, 'ttft_ms_p50'))})"
                    for m, r in modes.items()
                )
            )
    return out


def scenario_answers(results: Results) -> dict[str, Any]:
    """A scenario's fast-model answers in the lab's one sign (negative = faster). A run kept before the
    format field (no ``format``) wrote its gains as the share saved, ``1 − mode ÷ base``: negated here."""
    fast: dict[str, Any] = (results.scenario or {}).get("fast_model") or {}
    if results.format is not UNSET:
        return fast

    def flip(key: str, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: flip(k, x) for k, x in v.items()}
        return -v if "gain" in key and isinstance(v, float) else v

    return {k: flip(k, v) for k, v in fast.items()}


def _fmt_any(v: Any) -> str:
    if isinstance(v, float):
        return f"{v * 100:+.1f} %" if abs(v) < 5 else f"{v:.1f}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt_any(x)}" for k, x in v.items()) + "}"
    return "never (within 2 s)" if v is None else str(v)


def _pct3(p: Percentiles | None, digits: int) -> str:
    if p is None or p.p50 is None:
        return "–"
    return " / ".join(f"{x:.{digits}f}" for x in (p.p50, p.p90, p.p99))


def interval(g: Gain | None) -> str:
    """A paired gain with its bootstrap interval: ``−6.2 % [−8.0, −4.1]``; "no difference" when the
    interval holds 0; the verdict alone when there are too few pairs for one."""
    return short(g, verbose=True)


def provenance_line(results: Results) -> str:
    """Where and how a format-2 run ran: commit, CPU, load, floors."""
    pv = results.provenance if isinstance(results.provenance, Provenance) else None
    commit = pv.commit if pv else None
    loads = [r.load for r in results.runs if isinstance(r.load, Load)]
    worst = max((max(x.before[0], x.after[0]) for x in loads), default=None)
    floors = results.floors or {}
    floor_text = "; ".join(
        f"{name} p50 {f.p50:.3f} ms (p10–p90 {f.p10:.3f}–{f.p90:.3f})"
        for name, f in floors.items()
        if f.p50 is not None
    )
    return (
        f"Provenance: commit `{commit[:12] if commit else 'unknown'}`"
        + (" (dirty tree)" if pv and pv.dirty else "")
        + f", {pv.cpu_model if pv else '?'}, {pv.cores_usable if pv else '?'} of {pv.cores if pv else '?'} "
        f"cores, kernel {pv.kernel if pv else '?'}, Python {pv.python if pv else '?'}, "
        f"uvloop {(pv.uvloop if pv else None) or 'none'}; "
        + (f"1-min load up to {worst:.2f} around the cells; " if worst is not None else "")
        + f"floors: {floor_text or 'none measured'}."
    )


def paired_section(results: Results) -> list[str]:
    """A format-2 run: per cell and mode, E2E and TTFT p50 / p90 / p99, the paired gains against both
    baselines with their bootstrap 95 % intervals, and the noisy flags; the provenance line first."""
    design = results.design if isinstance(results.design, Design) else None
    out = [
        f"From **`{results.command}`** (started {results.started_utc}); "
        f"{design.rollouts_per_mode if design else '?'} measured rollouts per mode"
        + (" (`--quick`: fewer than a default cell's)" if design and design.quick else "")
        + ", modes interleaved per rollout, seed "
        f"{design.seed if design else '?'}, jitter {'on' if design and design.jitter else 'off'}.",
        "",
        provenance_line(results),
        "",
    ]
    for (profile, workload, model), modes in cells(results.runs).items():
        out += [
            f"**{profile} · {workload} · {model}**",
            "",
            "| mode | E2E s p50 / p90 / p99 | TTFT ms p50 / p90 / p99 | E2E vs http | E2E vs http-cached "
            "| TTFT vs http | TTFT vs http-cached | noisy |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode in MODES:
            r = modes.get(mode)
            if r is None:
                continue
            gains = r.gains or {}
            out.append(
                f"| {mode} | {_pct3(figure(r, 'e2e_s_pct'), 2)} | {_pct3(figure(r, 'ttft_ms_pct'), 1)} | "
                + " | ".join(
                    interval((gains.get(base) or {}).get(metric))
                    for metric in ("e2e", "ttft")
                    for base in ("http", "http-cached")
                )
                + f" | {'; '.join(r.noisy or []) or 'no'} |"
            )
        out.append("")
    return out


def gains_section(runs: dict[str, Results], directory: Path) -> list[str]:
    """The fast model judged on its gains (proto/lab/analysis/validate.py): per kept run, each mode's gain
    against ``http`` and ``http-cached`` measured (p50 ratio in a run without paired gains) against
    predicted; then the kept validation sample's own table (``DIR/validate-sample/validation.json``:
    ``bench validate --run``), if kept."""
    from proto.lab.analysis.validate import Validation, check_cells, markdown, summarize

    rows = [
        "| run | mode cells | gains | E2E gain error pp, largest / median | TTFT gain error pp, largest / "
        "median | point gains of the other sign | predicted inside the measured 95 % CI |",
        "|---|---|---|---|---|---|---|",
    ]
    every = []
    for name, results in runs.items():
        checks = check_cells(name, [r for r in results.runs if figure(r, "predicted_e2e_s_p50") is not None])
        s = summarize(checks)
        if not s.gains:
            continue
        every += checks
        rows.append(
            f"| {name} | {s.cells} | {s.gains} | {_pp2(s.max_error_pp['e2e'], s.median_error_pp['e2e'])} | "
            f"{_pp2(s.max_error_pp['ttft'], s.median_error_pp['ttft'])} | {s.sign_mismatches} | "
            + (f"{s.inside} of {s.with_interval}" if s.with_interval else "no interval")
            + " |"
        )
    out: list[str] = []
    if every:
        total = summarize(every)
        out += [
            "## The fast model on the gains, every real-clock cell",
            "",
            "Each mode's gain against `http` and `http-cached` (E2E and TTFT p50: mode ÷ baseline − 1) "
            "measured against the fast model's prediction of the same cells, from each run's own calibration "
            "(measured before its cells, on its own server, on the calibration's own workload). Error = "
            "predicted − measured, in percentage points:",
            "",
            *rows,
            "",
            f"All runs: {total.gains} gains; largest / median error E2E "
            f"{_pp2(total.max_error_pp['e2e'], total.median_error_pp['e2e'])}, TTFT "
            f"{_pp2(total.max_error_pp['ttft'], total.median_error_pp['ttft'])}; point gains of the other "
            f"sign: **{total.sign_mismatches}**.",
            "",
        ]
    kept = directory / "validate-sample" / "validation.json"
    if kept.is_file():
        v = msgspec.json.decode(kept.read_bytes(), type=Validation)
        out += ["## The validation sample (`bench validate --run`)", "", *markdown(v), ""]
    return out


def sample_finding(directory: Path) -> list[str]:
    """The kept validation sample's summary (``DIR/validate-sample/validation.json``), as a finding."""
    from proto.lab.analysis.validate import Validation

    kept = directory / "validate-sample" / "validation.json"
    if not kept.is_file():
        return []
    s = msgspec.json.decode(kept.read_bytes(), type=Validation).summary
    return [
        f"- *The validation sample, measured vs predicted* (`validate-sample`, {s.cells} mode cells, out of "
        f"sample): the gains vs `http` and `http-cached` ({s.gains}) err by up to "
        f"{_pp2(s.max_error_pp['e2e'], s.median_error_pp['e2e'])} (largest / median) on E2E and "
        f"{_pp2(s.max_error_pp['ttft'], s.median_error_pp['ttft'])} on TTFT; **{s.sign_disagreements}** sign "
        f"disagreements; the predicted gain inside the measured 95 % interval in {s.inside} of "
        f'{s.with_interval} (docs/lab-results.md, "The validation sample (`bench validate --run`)").'
    ]


def _pp2(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None else f"{a:.1f} / {b:.1f} pp"


def _pcts(xs: list[float | None]) -> str:
    return " / ".join("–" if x is None else f"{x * 100:+.1f} %" for x in xs)


def findings(runs: dict[str, Results], directory: Path = RESULTS) -> list[str]:
    """The figures NOTES.md's findings quote, each computed from the kept runs (the block between
    ``FINDINGS_BEGIN`` and ``FINDINGS_END`` there is this text): the measured curves and scenarios
    (proto/lab/report/findings.py), then the fast model's grid (predicted, and labelled so) and the fast
    model judged against the real clock."""
    out = [
        f'**Sign, everywhere in the lab\'s tables**: {SIGN}; `=` or "no difference": its bootstrap 95 % '
        "interval holds 0. A predicted figure is marked predicted. Every figure here is generated from "
        f"`{directory}/*/results.json`.",
        "",
        *kept_findings(runs),
    ]
    kept_grid = runs.get("grid-predicted")
    grid = (kept_grid.grid or []) if kept_grid is not None else []
    if grid:
        prod_cells = cells([r for r in grid if r.profile == "production-like"])
        grid_models = list(dict.fromkeys(r.model for r in grid))
        ttft = []
        for m in grid_models:
            ll = prod_cells.get(("production-like", "coding-agent", m), {}).get("longlived")
            ttft.append(None if ll is None else ll.predicted_ttft_vs_http)
        gains = [r for r in grid if r.mode in ("ws", "longlived") and r.predicted_e2e_vs_http is not None]
        best = min(gains, key=_grid_gain)
        out.append(
            f"- *The grid, predicted* (`grid-predicted`, the fast model, not measured): "
            f"{sum(_grid_gain(r) <= SEED_GAIN for r in gains)} of {len(gains)} `ws` and "
            f"`longlived` cells predicted at or beyond the seed's {SEED_GAIN * 100:.0f} % end to end; the "
            f"best predicted {_grid_gain(best) * 100:+.1f} % "
            f"({best.mode}, {best.profile} · "
            f"{best.workload} · {best.model}). Predicted `longlived` TTFT vs `http` on coding-agent, "
            f"production-like, {' / '.join(_model_label(m) for m in grid_models)}: {_pcts(ttft)} (predicted; "
            "measured above)."
        )
    measured = [r for res in runs.values() for r in res.runs if figure(r, "prediction_error") is not None]
    if measured:
        from proto.lab.analysis.validate import check_cells, summarize

        worst = max(abs(figure(r, "prediction_error")) for r in measured)
        judged = summarize(
            [
                c
                for name, res in runs.items()
                for c in check_cells(name, [r for r in res.runs if figure(r, "prediction_error") is not None])
            ]
        )
        out.append(
            f"- *The fast model against the real clock*: every kept real-clock cell ({len(measured)} mode "
            f"cells) within {worst * 100:.1f} % of its prediction on E2E p50 — the absolute time, most of "
            f"it modelled. On the *gains* vs `http` and `http-cached` ({judged.gains}): predicted − measured "
            f"up to {_pp2(judged.max_error_pp['e2e'], judged.median_error_pp['e2e'])} (largest / median) on "
            f"E2E, {_pp2(judged.max_error_pp['ttft'], judged.median_error_pp['ttft'])} on TTFT; "
            f"{judged.sign_mismatches} predicted gains of the other sign (docs/lab-results.md, "
            '"The fast model on the gains, every real-clock cell").'
        )
    out += sample_finding(directory)
    out += agent_findings.notes(directory, runs)  # the real agent and the peers
    out += fleet_findings.bullets(directory)  # the fleet, routing and network runs (fleet_findings.py)
    return out


FINDINGS_BEGIN, FINDINGS_END = "<!-- generated: bench report -->", "<!-- end generated -->"
NOTES = Path("NOTES.md")


def kept(directory: Path) -> dict[str, Results]:
    """The runs kept in ``directory`` (``NAME/results.json``), by name; ``bench --client codex``'s is read
    by :mod:`proto.lab.report.agent_findings` instead."""
    paths = sorted(directory.glob("*/results.json"))
    return {p.parent.name: load_results(p) for p in paths if not agent_findings.is_codex(p)}


def notes_block(directory: Path) -> str:
    runs = kept(directory)
    return "\n".join(findings(runs, directory)).rstrip() + "\n"


def write_notes(path: Path, text: str) -> None:
    """Replace ``path``'s findings block (between ``FINDINGS_BEGIN`` and ``FINDINGS_END``) with ``text``."""
    doc = path.read_text(encoding="utf-8")
    if FINDINGS_BEGIN not in doc or FINDINGS_END not in doc:
        raise SystemExit(f"{path}: no {FINDINGS_BEGIN} … {FINDINGS_END} block")
    head, rest = doc.split(FINDINGS_BEGIN, 1)
    _, tail = rest.split(FINDINGS_END, 1)
    path.write_text(f"{head}{FINDINGS_BEGIN}\n{text}{FINDINGS_END}{tail}", encoding="utf-8")


def lab(directory: Path) -> str:
    runs = kept(directory)
    out = [
        "# Lab results (generated)",
        "",
        f"Generated by `responses-lab bench report --lab {directory}` from the kept runs' results.json (one "
        f"directory per run under `{directory}/`, named as the sections below cite them). Read with "
        "docs/lab.md (the method, and which runs are kept and why).",
        "",
        "## Findings",
        "",
        *findings(runs, directory),
        "",
    ]
    measured_curves = curves(runs)
    if measured_curves:
        out += [
            "## The curves, measured",
            "",
            "Each point a group of a kept run (its own paired rollouts); the full tables, p90 and p99 with "
            "them, are the runs' own sections below.",
            "",
        ]
        for curve in measured_curves:
            out += curve_tables(curve)
    for name, title in (
        ("scenario-sglang", "SGLang / SMG model gateway"),
        ("scenario-vllm", "vLLM's /v1/responses API cost"),
    ):
        if name in runs:
            out += [f"## Scenario: {title}", "", *scenario_section(runs[name]), ""]
    out += agent_findings.sections(directory, runs)  # the real agent and the peers
    out += fleet_findings.sections(directory)  # fleets, routing, network, what to deploy when
    if "speed" in runs and runs["speed"].calibration:
        out += [
            "## The fast model: per-round overhead on this machine (the `speed` run's calibration)",
            "",
            *calibration_section(runs["speed"]),
            "",
            "## The fast model's curves (predicted, tool times × 1)",
            "",
            *curves_section(runs["speed"]),
        ]
    for name, title in (
        ("grid-predicted", "The fast model's grid: every model × workload × profile (predicted)"),
    ):
        if name in runs:
            grid = runs[name].grid or []
            real = measured_cells(runs, grid[0].tool_time_scale if grid else 1.0)
            out += [f"## {title}", "", *grid_section(runs[name], real), ""]
    measured = {k: v for k, v in runs.items() if v.runs}
    rows, worst = predicted_section(measured)
    out += [
        "## Predicted vs measured, every real-clock cell",
        "",
        *(
            ["No real-clock cell here carries a prediction (`--no-predict`)."]
            if len(rows) == 2
            else [
                "Largest |predicted − measured| / measured on E2E p50: "
                f"**{worst * 100:.1f} %** — the absolute time, most of it modelled time the prediction "
                "takes from the same engine; the fast model is judged on its gains (next section).",
                "",
                *rows,
            ]
        ),
        "",
        *gains_section(measured, directory),
    ]
    for name, results in runs.items():
        if results.format is not UNSET and results.runs:
            out += [f"## Run `{name}`: paired gains", "", *paired_section(results)]
    return "\n".join(out).rstrip() + "\n"


def write_lab(directory: Path, out: Path, notes: Path | None = None) -> None:
    """The lab's results document from the runs kept in ``directory``, written to ``out`` (``-``: printed);
    with ``notes``, that file's findings block too (:func:`write_notes`)."""
    if not any(directory.glob("*/results.json")):
        raise SystemExit(f"{directory}: no kept run (DIR/NAME/results.json)")
    text = lab(directory)
    if notes is not None:
        write_notes(notes, notes_block(directory))
    if str(out) == "-":
        print(text, end="")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")


def write_marked(path: Path, marker: str, text: str) -> None:
    """Replace what lies between ``path``'s ``<!-- MARKER:begin -->`` and ``<!-- MARKER:end -->`` with
    ``text``."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    doc = path.read_text(encoding="utf-8")
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path}: no {begin} … {end} markers")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}{end}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="responses-lab bench report",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("results", type=Path, nargs="?", help="one run's results.json")
    lab = parser.add_argument_group("the lab's results document")
    one = parser.add_argument_group("one run's Markdown")
    lab.add_argument(
        "--lab",
        type=Path,
        nargs="?",
        const=RESULTS,
        default=None,
        metavar="DIR",
        help=f"write the lab's results document from the kept runs in DIR ({RESULTS} when DIR is left out)",
    )
    lab.add_argument(
        "--out",
        type=Path,
        default=DOCUMENT,
        help=f"with --lab: the file to write (default {DOCUMENT}; - prints)",
    )
    lab.add_argument(
        "--notes",
        type=Path,
        default=None,
        help=f"with --lab: also replace this file's findings block ({NOTES}: {FINDINGS_BEGIN} … "
        f"{FINDINGS_END})",
    )
    one.add_argument("--again", type=Path, default=None, help="a second run of the same command")
    one.add_argument("--write", type=Path, default=None, help="replace the marked section of this file")
    one.add_argument("--marker", default="results", help="the section's marker name")
    one.add_argument("--title", default="Results", help="the generated document's title")
    args = parser.parse_args(argv)
    if args.lab is not None:
        write_lab(args.lab, args.out, args.notes)
        return 0
    if args.results is None:
        parser.error("a results.json, or --lab DIR")
    results = load_results(args.results)
    text = render(results, load_results(args.again) if args.again else None, args.title)
    if results.format is not UNSET and results.runs:  # format 2: its intervals and provenance
        text += "\n".join(["", "#### Paired gains", "", *paired_section(results)]).rstrip() + "\n"
    if args.write is None:
        print(text, end="")
    else:
        write_marked(args.write, args.marker, text)
    return 0
