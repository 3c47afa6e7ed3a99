"""``responses-lab bench validate``: the fast model judged on what it claims (docs/lab.md, "The validation
sample"). The grid (``bench --predict``) claims each mode's E2E and TTFT p50 and, above all, its **gain**
against ``http`` and ``http-cached``; so each measured cell is set against the fast model's prediction of it
on all of these, the gains first:

* per cell: measured and predicted E2E and TTFT p50, and each relative error;
* per mode × baseline × metric (E2E, TTFT): the measured paired gain with its bootstrap 95 % interval
  (proto/lab/analysis/stats.py), the predicted gain (the grid's own figure: predicted p50 ÷ the baseline's
  predicted p50 − 1), the error in percentage points and relative to the measured gain, whether the two
  have the same sign, and whether the prediction lies inside the measured interval;
* the summary: the largest and median |error| on gains in pp, the sign disagreements (the measured
  interval excludes 0 and the prediction has the other sign), the predictions inside their interval.

**Out of sample only.** The predictions are composed from a calibration that never measured the validated
cells: the calibration replays its own seeded workload (``proto/lab/analysis/predict.py``,
``calibration_replay``) on its own server, before and apart from any cell. :func:`check_out_of_sample`
refuses a calibration whose workload is one of the validated cells', or one measured by the run being
validated when it is not declared as that run's own (``--own``).

    responses-lab bench validate --run OUT              # measure the sample (below), then tabulate it
    responses-lab bench validate RUN… [--calibration F] [--out FILE]   # tabulate kept runs

``--run OUT`` measures the stratified sample (:data:`SAMPLE`) in the grid's own configuration (4 lock-step
sessions, every mode, ``http`` and ``http-cached`` included): first a calibration of its own
(``OUT/calibration.json``, as ``bench --predict`` measures it), then each stratum as a real-clock run
without predictions (``responses-lab bench --no-predict …``, ``OUT/<stratum>/``), then each cell predicted
from that calibration; it writes ``OUT/validation.json`` and ``OUT/validation.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from proto.core.response import MODES
from proto.helpfmt import HelpFormatter
from proto.lab.analysis.stats import Gain
from proto.lab.records import RunRecord, run_of
from proto.lab.report.results import cells, figure, load

BASELINES = ("http", "http-cached")
METRICS = (("e2e", "e2e_s_p50"), ("ttft", "ttft_ms_p50"))
PREDICTED = "predicted"  # the label every predicted figure carries in the tables (tests hold it)


class GainCheck(msgspec.Struct, frozen=True):
    """One mode's gain against one baseline on one metric: measured (with its interval) against predicted.
    Gains are fractions (−0.12 = 12 % faster); ``error_pp`` is in percentage points."""

    mode: str
    baseline: str
    metric: str  # e2e | ttft
    measured: float | None
    low: float | None
    high: float | None
    verdict: (
        str | None
    )  # the measured gain's (proto/lab/analysis/stats.py): faster | slower | no difference | …
    predicted: float | None
    error_pp: float | None  # (predicted − measured) × 100
    error_rel: float | None  # (predicted − measured) ÷ |measured|
    same_sign: bool | None  # the two point gains on the same side of 0
    disagrees: bool  # the measured interval excludes 0 and the prediction lies on its other side
    inside: bool | None  # the prediction inside the measured interval (None: no interval)


class CellCheck(msgspec.Struct, frozen=True):
    run: str
    profile: str
    workload: str
    model: str
    mode: str
    e2e_s_p50: float
    predicted_e2e_s_p50: float | None
    e2e_error: float | None
    ttft_ms_p50: float
    predicted_ttft_ms_p50: float | None
    ttft_error: float | None
    output_tokens_per_round: float | None
    gains: list[GainCheck]


class Summary(msgspec.Struct, frozen=True):
    cells: int
    gains: int  # gain checks with both a measured and a predicted figure
    max_error_pp: dict[str, float | None]  # by metric
    median_error_pp: dict[str, float | None]
    max_cell_error: dict[str, float | None]  # |predicted ÷ measured − 1| of the p50s, by metric
    sign_disagreements: int
    sign_mismatches: int  # the point gains on other sides of 0, whatever the interval
    inside: int
    with_interval: int
    max_output_tokens_per_round: float | None
    calibration_outputs: tuple[int, int] | None


class Validation(msgspec.Struct):
    calibration_from: str
    cells: list[CellCheck]
    summary: Summary


def _rel(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or not measured or math.isnan(predicted):
        return None
    return predicted / measured - 1


def gain_check(
    mode: str, baseline: str, metric: str, measured: Gain | float | None, predicted: float | None
) -> GainCheck:
    """``measured``: a cell's ``gains[baseline][metric]``, or a gain alone (no interval, no verdict: a run
    without paired gains); ``predicted``: the fast model's gain of the same cell."""
    if isinstance(measured, Gain):
        g, low, high, verdict = measured.gain, measured.low, measured.high, measured.verdict
    else:
        g, low, high, verdict = measured, None, None, None
    error_pp = error_rel = same = inside = None
    disagrees = False
    if g is not None and predicted is not None and not math.isnan(predicted):
        error_pp = (predicted - g) * 100
        error_rel = (predicted - g) / abs(g) if g else None
        same = (predicted < 0) == (g < 0)
        if low is not None and high is not None:
            inside = low <= predicted <= high
            disagrees = (high < 0 and predicted > 0) or (low > 0 and predicted < 0)
    return GainCheck(
        mode, baseline, metric, g, low, high, verdict, predicted, error_pp, error_rel, same,
        disagrees, inside,
    )  # fmt: skip


def check_cells(name: str, runs: Sequence[RunRecord]) -> list[CellCheck]:
    """Every measured mode cell of one run against its prediction (the run's ``predicted_*`` fields)."""
    out: list[CellCheck] = []
    for (profile, workload, model), modes in cells(runs).items():
        for mode in sorted(modes, key=lambda m: MODES.index(m) if m in MODES else len(MODES)):
            run = modes[mode]
            checks: list[GainCheck] = []
            for base_name in BASELINES:
                base = modes.get(base_name)
                if base is None or mode == base_name:
                    continue
                for metric, key in METRICS:
                    stored = (run.gains or {}).get(base_name, {}).get(metric)
                    # a run without paired gains: the p50s' ratio, no interval
                    measured = stored if stored is not None else _rel(figure(run, key), figure(base, key))
                    predicted = _rel(figure(run, f"predicted_{key}"), figure(base, f"predicted_{key}"))
                    checks.append(gain_check(mode, base_name, metric, measured, predicted))
            turns, output = run.turns, run.usage.output_tokens
            predicted_e2e, predicted_ttft = (
                figure(run, "predicted_e2e_s_p50"),
                figure(run, "predicted_ttft_ms_p50"),
            )
            out.append(
                CellCheck(
                    name, profile, workload, model, mode,
                    float(run.e2e_s_p50), predicted_e2e, _rel(predicted_e2e, run.e2e_s_p50),  # type: ignore[arg-type]
                    float(run.ttft_ms_p50), predicted_ttft, _rel(predicted_ttft, run.ttft_ms_p50),  # type: ignore[arg-type]
                    output / turns if turns and output else None,
                    checks,
                )
            )  # fmt: skip
    return out


def summarize(checks: Sequence[CellCheck], calibration_outputs: tuple[int, int] | None = None) -> Summary:
    gains = [g for c in checks for g in c.gains if g.error_pp is not None]
    by_metric = {
        m: [abs(g.error_pp) for g in gains if g.metric == m and g.error_pp is not None] for m, _ in METRICS
    }
    cell_err = {
        "e2e": [abs(c.e2e_error) for c in checks if c.e2e_error is not None],
        "ttft": [abs(c.ttft_error) for c in checks if c.ttft_error is not None],
    }
    outs = [c.output_tokens_per_round for c in checks if c.output_tokens_per_round is not None]
    return Summary(
        cells=len(checks),
        gains=len(gains),
        max_error_pp={m: max(v) if v else None for m, v in by_metric.items()},
        median_error_pp={m: statistics.median(v) if v else None for m, v in by_metric.items()},
        max_cell_error={m: max(v) if v else None for m, v in cell_err.items()},
        sign_disagreements=sum(g.disagrees for g in gains),
        sign_mismatches=sum(g.same_sign is False for g in gains),
        inside=sum(g.inside is True for g in gains),
        with_interval=sum(g.inside is not None for g in gains),
        max_output_tokens_per_round=max(outs) if outs else None,
        calibration_outputs=calibration_outputs,
    )


# ---- out of sample -----------------------------------------------------------------------------


class InSample(ValueError):
    """A calibration that measured what it is asked to validate."""


def check_out_of_sample(
    calibration: dict[str, Any], runs: Iterable[tuple[str, dict[str, Any]]], own: bool = False
) -> None:
    """Refuse a calibration that measured the cells it validates: its workload named as a validated cell's,
    or (unless ``own``: a run validated against the calibration it measured before its cells, on its own
    server) the very calibration a validated run carries."""
    workload = calibration.get("workload", "calibration")
    for name, result in runs:
        for run in result["runs"]:
            if run["workload"].split("[")[0] == workload:
                raise InSample(f"{name}: cell {run['workload']} is the calibration's own workload")
        if not own and result.get("calibration") is not None:
            theirs = result["calibration"]
            if theirs.get("fits") == calibration.get("fits"):
                raise InSample(
                    f"{name}: the calibration is the run's own (measured in the same run); "
                    "say so with --own, or give one measured apart (--calibration)"
                )


def calibration_outputs(calibration: dict[str, Any]) -> tuple[int, int] | None:
    span = calibration.get("outputs")
    return (int(span[0]), int(span[1])) if span else None


# ---- recomposing -------------------------------------------------------------------------------


def predict_from(result: dict[str, Any], calibration: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``result`` whose cells carry the fast model's prediction from ``calibration``, composed as
    the run ran them (its sessions, rollouts, tool times, seed, overrides, server flags)."""
    from proto.lab.analysis.repredict import repredict

    copy: dict[str, Any] = json.loads(json.dumps(result))
    repredict(copy, calibration)
    copy["calibration"] = calibration
    return copy


def validate(
    named: Sequence[tuple[str, dict[str, Any]]],
    calibration: dict[str, Any] | None,
    source: str,
    own: bool = False,
) -> Validation:
    """Each run's cells against the fast model: from ``calibration`` (recomposed), or with None from each
    run's own predictions (``own`` must then be said)."""
    if calibration is not None:
        check_out_of_sample(calibration, named, own)
        named = [(name, predict_from(result, calibration)) for name, result in named]
    elif not own:
        raise InSample("no calibration given: a run's own predictions are validated only with --own")
    checks = [c for name, result in named for c in check_cells(name, [run_of(r) for r in result["runs"]])]
    outputs = calibration_outputs(calibration) if calibration is not None else None
    if outputs is None and calibration is None:
        spans = {calibration_outputs(r["calibration"]) for _, r in named if r.get("calibration")}
        outputs = spans.pop() if len(spans) == 1 else None
    return Validation(source, checks, summarize(checks, outputs))


# ---- the table ---------------------------------------------------------------------------------


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or math.isnan(x) else f"{x * 100:+.{digits}f} %"


def _num(x: float | None, digits: int) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _pp(x: float | None, sign: str = "") -> str:
    return "–" if x is None else f"{x:{sign}.1f} pp"


def _interval(g: GainCheck) -> str:
    if g.measured is None:
        return "–"
    if g.low is None or g.high is None:
        return f"{g.measured * 100:+.1f} % (no interval)"
    return f"{g.measured * 100:+.1f} % [{g.low * 100:+.1f}, {g.high * 100:+.1f}]"


def markdown(v: Validation) -> list[str]:
    """The validation table: per cell the p50s measured and predicted, then per gain measured (interval)
    against predicted; the summary last. Every predicted figure is in a column named predicted."""
    s = v.summary
    out = [
        f"Predictions from the calibration `{v.calibration_from}` (out of sample: it replays its own "
        "workload on its own server, never a validated cell). Gain = mode ÷ baseline − 1, negative = faster; "
        "the measured gain is paired per rollout with its bootstrap 95 % interval.",
        "",
        f"| run | profile · workload · model | mode | E2E p50 s | E2E {PREDICTED} | error | TTFT p50 ms | "
        f"TTFT {PREDICTED} | error | output tok/round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in v.cells:
        out.append(
            f"| {c.run} | {c.profile} · {c.workload} · {c.model} | {c.mode} | {c.e2e_s_p50:.2f} | "
            f"{_num(c.predicted_e2e_s_p50, 2)} ({PREDICTED}) | {_pct(c.e2e_error)} | {c.ttft_ms_p50:.1f} | "
            f"{_num(c.predicted_ttft_ms_p50, 1)} ({PREDICTED}) | {_pct(c.ttft_error)} | "
            f"{_num(c.output_tokens_per_round, 0)} |"
        )
    out += [
        "",
        f"| run | profile · workload · model | mode | vs | metric | measured gain [95 % CI] | gain "
        f"{PREDICTED} | error pp | error rel | same sign | {PREDICTED} inside CI |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in v.cells:
        for g in c.gains:
            sign = (
                "–" if g.same_sign is None else ("**no**" if g.disagrees else "yes" if g.same_sign else "no")
            )
            inside = "–" if g.inside is None else ("yes" if g.inside else "no")
            out.append(
                f"| {c.run} | {c.profile} · {c.workload} · {c.model} | {c.mode} | {g.baseline} | "
                f"{g.metric} | {_interval(g)} | {_pct(g.predicted)} ({PREDICTED}) | {_pp(g.error_pp, '+')} | "
                f"{_pct(g.error_rel, 0)} | {sign} | {inside} |"
            )
    out += ["", *summary_lines(s)]
    return out


def summary_lines(s: Summary) -> list[str]:
    lines = [
        f"**Summary** ({s.cells} mode cells, {s.gains} gains checked): |{PREDICTED} − measured| gain, "
        f"largest / median: E2E {_pp(s.max_error_pp.get('e2e'))} / {_pp(s.median_error_pp.get('e2e'))}, TTFT "
        f"{_pp(s.max_error_pp.get('ttft'))} / {_pp(s.median_error_pp.get('ttft'))}; sign disagreements (the "
        f"measured interval excludes 0, the {PREDICTED} gain on its other side): **{s.sign_disagreements}**; "
        f"point gains of other signs: {s.sign_mismatches}; {PREDICTED} gain inside the measured interval: "
        f"{s.inside} of {s.with_interval}. Largest |{PREDICTED} ÷ measured − 1| of a p50: E2E "
        f"{_pct(s.max_cell_error.get('e2e'))}, TTFT {_pct(s.max_cell_error.get('ttft'))}.",
    ]
    if s.calibration_outputs is not None and s.max_output_tokens_per_round is not None:
        lo, hi = s.calibration_outputs
        lines += [
            "",
            f"Output lengths: the calibration's rounds {lo} → {hi} tokens; the validated cells' mean output "
            f"per round up to {s.max_output_tokens_per_round:.0f} tokens"
            + (" (within the calibrated range)." if s.max_output_tokens_per_round <= hi else " (beyond it)."),
        ]
    return lines


def write(v: Validation, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "validation.json", out / "validation.md"
    js.write_bytes(msgspec.json.format(msgspec.json.encode(v), indent=1) + b"\n")
    md.write_text("# The fast model's validation (generated)\n\n" + "\n".join(markdown(v)) + "\n", "utf-8")
    return [js, md]


# ---- the sample --------------------------------------------------------------------------------


class Stratum(msgspec.Struct, frozen=True):
    """One (profile, workload, model) group of the grid, measured in every mode."""

    name: str
    profile: str
    workload: str
    model: str
    turns: int | None = None  # the workload cut to its first N rounds (``--turns``); None: whole
    rollouts: int = (
        1  # a one-session trace needs 3 for a paired interval (proto/lab/analysis/stats.py, MIN_PAIRS)
    )


# The stratified sample: both profiles; five decode classes (the GPU-served frontier model, the two
# wafer-scale speeds, the 8B GPU profiles: llm-d's H100 and the step-calibrated H200); four workloads (the
# two synthetic ones, a multi-session trace, the rewrite-heavy trace); each group in every mode, ``http``
# and ``http-cached`` included, in the grid's configuration (4 lock-step sessions of a synthetic workload, a
# trace's own sessions; a one-session trace 3 rollouts). Tool times × 0.02 (as ``--quick``): at × 1 a
# coding-agent group alone is ~17 min, and the gains shrink into the tool times' noise. Sized by the fast
# model's walls (docs/lab.md, "The validation sample"): 6.3 min of measured rollouts.
SAMPLE: tuple[Stratum, ...] = (
    Stratum("local-coding-4000", "local", "coding-agent", "mock-4000tps"),
    Stratum("prod-coding-1000", "production-like", "coding-agent", "mock-1000tps"),
    Stratum("prod-longctx-65", "production-like", "long-context", "mock-65tps", turns=6),
    Stratum("local-multi-h100", "local", "tracelab-multi_session_example", "mock-h100-8b"),
    Stratum(
        "prod-rewrites-4000", "production-like", "tracelab-session_workload_example", "mock-4000tps", 4, 3
    ),
    Stratum("prod-multi-h200", "production-like", "tracelab-multi_session_example", "mock-h200-llama8b"),
)
SAMPLE_MODES = ("http", "http-cached", "http-prev", "ws", "longlived")
SAMPLE_FLAGS = ("--sessions", "4", "--tool-time-scale", "0.02", "--no-plots")


def stratum_argv(s: Stratum, out: Path) -> list[str]:
    argv = [
        "--no-predict", "--profile", s.profile, "--workload", s.workload, "--model", s.model,
        "--modes", ",".join(SAMPLE_MODES), "--rollouts", str(s.rollouts), *SAMPLE_FLAGS,
        "--out", str(out / s.name),
    ]  # fmt: skip
    return argv + (["--turns", str(s.turns)] if s.turns else [])


def run_sample(out: Path, calibration: Path | None, rounds: int, strata: Sequence[Stratum] = SAMPLE) -> Path:
    """Measure the calibration (unless given, or kept in ``out`` from before), then each stratum not kept
    yet in its own ``bench`` process; returns the calibration file."""
    out.mkdir(parents=True, exist_ok=True)
    if calibration is None and (out / "calibration.json").is_file():
        calibration = out / "calibration.json"
        print(f"{calibration}: kept from before", flush=True)
    if calibration is None:
        from proto.lab.analysis.predict import calibrate

        t0 = time.perf_counter()
        print(f"calibrating every mode ({rounds} rounds a mode, 3 passes) …", flush=True)
        cal = asyncio.run(calibrate(SAMPLE_MODES, rounds, 128_000))
        calibration = out / "calibration.json"
        calibration.write_text(json.dumps({"calibration": cal.to_json()}, indent=1) + "\n", "utf-8")
        print(f"calibrated in {time.perf_counter() - t0:.0f} s", flush=True)
    for s in strata:
        if (out / s.name / "results.json").exists():
            print(f"{s.name}: kept from before", flush=True)
            continue
        argv = [sys.executable, "-m", "proto", "bench", *stratum_argv(s, out)]
        print(" ".join(argv[2:]), flush=True)
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        print(f"{s.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return calibration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="responses-lab bench validate", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("runs", nargs="*", type=Path, help="kept runs (DIR or DIR/results.json)")
    what = parser.add_argument_group("what is judged")
    what.add_argument(
        "--calibration",
        type=Path,
        default=None,
        help="the fast model's calibration: a results.json, run.json or calibration.json holding one "
        "(default: none; with --run, the sample's own)",
    )
    what.add_argument(
        "--own", action="store_true", help="validate each run against the predictions it made itself"
    )
    sample = parser.add_argument_group("measuring the sample")
    sample.add_argument(
        "--run", type=Path, default=None, metavar="OUT", help="measure the sample into OUT (default: none)"
    )
    sample.add_argument("--rounds", type=int, default=240, help="--run's calibration rounds a mode")
    sample.add_argument(
        "--strata",
        default=",".join(s.name for s in SAMPLE),
        help="--run: the sample's strata to measure (comma-separated; default all: "
        + ", ".join(s.name for s in SAMPLE)
        + ")",
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where validation.json and .md go (default: none, the summary printed only; with --run, OUT)",
    )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    if args.run is not None:
        by_name = {s.name: s for s in SAMPLE}
        unknown = [n for n in args.strata.split(",") if n not in by_name]
        if unknown:
            parser.error(f"unknown strata {', '.join(unknown)}; the sample's: {', '.join(by_name)}")
        strata = [by_name[n] for n in args.strata.split(",")]
        args.calibration = run_sample(args.run, args.calibration, args.rounds, strata)
        args.runs = [args.run / s.name for s in strata]
        args.out = args.out or args.run
    if not args.runs:
        parser.error("runs to validate, or --run OUT")
    named = [
        (p.name if p.is_dir() else p.parent.name, load(p / "results.json" if p.is_dir() else p))
        for p in args.runs
    ]
    cal = None
    if args.calibration is not None:
        cal = load(args.calibration).get("calibration")
        if cal is None:
            raise SystemExit(f"{args.calibration}: no calibration in it")
    try:
        v = validate(named, cal, str(args.calibration) if args.calibration else "each run's own", args.own)
    except InSample as exc:
        print(f"responses-lab bench validate: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(v.summary)))
    if args.out is not None:
        written = write(v, args.out)
        print("wrote " + ", ".join(map(str, written)))
    print(f"wall {time.perf_counter() - t0:.0f} s")
    return 0
