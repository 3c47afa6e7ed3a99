"""results.json (docs/lab.md, "results.json") and results.csv: what a bench run produced, shaped, written and
read back.

:func:`run_record` shapes one finished cell into its ``runs[]`` entry (a
:class:`~proto.lab.records.RunRecord`); :func:`floor_json`,
:func:`config_json` and :func:`profiles_json` the run's fields. A run with cells keeps each entry in a
record as the cell finishes and assembles results.json from the records (:mod:`proto.lab.run.store`);
``--predict`` alone shapes its :class:`~proto.lab.run.runner.BenchResult` with :func:`results_json`.
:func:`write_json` and :func:`write_csv` write it. Readers — ``tables.py``'s table and plots, ``writeup.py``
(``bench report``) — load it with :func:`load` and group it with :func:`cells`, so the format is described
here only.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import psutil

from proto.lab.analysis.metrics import (
    RolloutMetrics,
    Trace,
    percentile,
    rollout_metrics,
    store_vs_cached,
    summarize,
)
from proto.lab.analysis.stats import MIN_ROLLOUTS, SIGN, Gain, paired_gain, percentiles
from proto.lab.config import JITTER, PEER_MODES, BenchConfig, profile_named
from proto.lab.records import (
    FLOOR_SPREAD,
    LOAD_PER_CORE,
    WAIT_SHARE,
    GridRow,
    Results,
    RolloutRecord,
    RunRecord,
    Usage,
    floor,
    noise,
    provenance,
    results_of,
)
from proto.lab.run.runner import BenchResult, CellKey, CellResult
from proto.lab.workload.traces import Replay

BASELINE = "http"  # the mode every ratio ("vs http") is taken against
BASELINES = ("http", "http-cached")  # the paired gains' baselines: HTTP without and with a token cache
FORMAT = 2  # results.json's shape: 2 adds the design, the paired gains and the provenance (1: no field)

# ---- shaping ------------------------------------------------------------------------------------


def run_record(cell: CellResult) -> RunRecord:
    """One ``runs[]`` entry: docs/lab.md, "results.json"'s fields, then the lab's extras."""
    metrics = [rollout_metrics(t) for t in cell.traces]
    s = summarize(metrics)
    turns = max(s.turns, 1)
    usage = {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0}
    phases: dict[str, float] = {}
    prefill = decode = 0.0
    for trace in cell.traces:
        for key in usage:
            usage[key] += trace.usage[key]
        for name, ms in trace.phases_ms.items():
            phases[name] = phases.get(name, 0.0) + ms
        prefill += sum(float(r["prefill_ms"]) for r in trace.reports)
        decode += sum(float(r["decode_ms"]) for r in trace.reports)
    return RunRecord(
        mode=cell.mode,
        workload=cell.workload,
        model=cell.model,
        sessions=cell.sessions,
        e2e_s_p50=s.e2e_s_p50,
        ttft_ms_p50=s.ttft_ms_p50,
        tpot_ms_p50=s.tpot_ms_p50,
        itl_ms_p99=s.itl_ms_p99,
        turn_overhead_ms_p50=s.turn_overhead_ms_p50,
        turn_overhead_ms_by_turn=list(s.turn_overhead_ms_by_turn),
        server_cpu_ms_per_turn=None if cell.server_cpu_s is None else cell.server_cpu_s * 1e3 / turns,
        client_bytes_sent_per_turn=sum(t.bytes_sent for t in cell.traces) / turns,
        usage=Usage(**usage),
        phases_ms={name: ms / turns for name, ms in sorted(phases.items())},  # mean per turn
        # extras
        profile=cell.profile,
        rollouts=len(cell.traces),
        turns=s.turns,
        statuses=sorted({t.status for t in cell.traces}),
        e2e_s=sorted(m.e2e_s for m in metrics),
        ttft_ms_p90=percentile(s.ttft_ms, 90),
        turn_overhead_ms_mean=statistics.fmean(t.overhead_ms for m in metrics for t in m.turns)
        if s.turns
        else None,
        turn_overhead_ms_p90=percentile((t.overhead_ms for m in metrics for t in m.turns), 90),
        prefill_ms_per_turn=prefill / turns,
        decode_ms_per_turn=decode / turns,
        tool_wait_s_per_rollout=sum(t.tool_wait_s for t in cell.traces) / max(len(cell.traces), 1),
        wall_s=cell.wall_s,
        ttft_ms_all=[round(x, 3) for x in s.ttft_ms],
        # Per round of each session's first rollout, what the server counted: [input, cached, output] tokens
        # (a trace's input and output must be the file's own: tests/test_lab_traces.py).
        usage_by_round=usage_by_round(cell.traces),
        round_kinds=dict(sorted(Counter(k for t in cell.traces for k in t.kinds).items())),
        # --reconnect: the turns after a reconnect (the store path) against the cached ones; {} without.
        store_vs_cached=store_vs_cached(cell.traces),
        **design_fields(cell, metrics),
        # A peer's or a --url server's: who served the cell, how it was timed, the gateway/upstream split
        # (docs/lab.md, "Peers").
        peer=cell.peer if cell.peer else msgspec.UNSET,
    )


def design_fields(cell: CellResult, metrics: Sequence[RolloutMetrics]) -> dict[str, Any]:
    """A record's fields of the experiment's design (docs/lab.md, "Statistics"): E2E and TTFT p50/p90/p99,
    one record per rollout (its index, session, seed, position, E2E and median TTFT: the pairs of the
    gains), the order of every rollout index, the load around the group, its floors and whether it was
    noisy."""
    rollouts = [
        RolloutRecord(
            index=t.index,
            session=t.session_index,
            seed=t.seed,
            position=t.position,
            e2e_s=m.e2e_s,
            ttft_ms_p50=percentile((x.ttft_ms for x in m.turns), 50),
            turns=len(m.turns),
            tool_wait_s=t.tool_wait_s,
            status=t.status,
            turn_overhead_ms_p50=percentile((x.overhead_ms for x in m.turns), 50),
        )
        for t, m in zip(cell.traces, metrics, strict=True)
    ]
    group = cell.group
    floors = group.floors if group is not None else []
    link = group.link if group is not None else None
    return {
        "e2e_s_pct": percentiles([m.e2e_s for m in metrics]),
        "ttft_ms_pct": percentiles([t.ttft_ms for m in metrics for t in m.turns]),
        "rollout_records": rollouts,
        "orders": group.orders if group is not None else [],
        "blocks": group.blocks if group is not None else 1,
        "load": None if group is None else group.load,
        "floors": list(floors),
        # A shaped link's check beside the floors; its figures past tolerance flag the cell (docs/lab.md,
        # "Network").
        "link": msgspec.to_builtins(link) if link is not None else None,
        "noisy": noise(group.load if group is not None else None, floors) + (link.off if link else []),
    }


def add_gains(runs: Sequence[RunRecord], seed: int = 0) -> None:
    """Each run's ``gains`` (in place): against every baseline of ``BASELINES`` measured in its (profile,
    workload, model), its paired E2E and TTFT gains (analysis/stats.py) over the rollouts both ran (pairs
    matched by rollout index and session). Runs without ``rollout_records`` (format 1) get none."""
    for modes in cells(runs).values():
        for run in modes.values():
            if run.rollout_records is msgspec.UNSET:
                continue
            gains: dict[str, dict[str, Gain]] = {}
            for name in BASELINES:
                base = modes.get(name)
                if base is None or base is run or base.rollout_records is msgspec.UNSET:
                    continue
                theirs = {(r.index, r.session): r for r in base.rollout_records}
                pairs = [
                    (r, theirs[(r.index, r.session)])
                    for r in run.rollout_records
                    if (r.index, r.session) in theirs
                ]
                gains[name] = {
                    metric: paired_gain(
                        [_paired(a, metric) for a, _ in pairs],
                        [_paired(b, metric) for _, b in pairs],
                        baseline=name,
                        metric=metric,
                        seed=seed,
                    )
                    for metric in ("e2e", "ttft")
                }
            run.gains = gains


def _paired(r: RolloutRecord, metric: str) -> float:
    """A rollout's figure of ``metric`` (``e2e``: its E2E; ``ttft``: its median TTFT); NaN when unknown."""
    x = r.e2e_s if metric == "e2e" else r.ttft_ms_p50
    return math.nan if x is None else float(x)


def design_json(config: BenchConfig) -> dict[str, Any]:
    """results.json's ``design``: the sign convention, the noise rule, the seed and the jitter, once."""
    return {
        "sign": SIGN,
        "order": "Williams design per rollout index (proto/lab/run/design.py); runs[].orders holds each"
        " index's",
        "seed": config.seed,
        "tool_times": "drawn per rollout from its seed (synthetic); a trace's recorded times (traces)",
        "jitter": dict(JITTER, seed=config.seed) if config.jitter and not config.url else None,
        "fresh_server": config.fresh_server,
        # a synthetic cell's rollouts per mode (a trace's: its sessions x rollouts), against a default cell's
        "rollouts_per_mode": config.sessions * config.rollouts,
        "default_rollouts_per_mode_at_least": MIN_ROLLOUTS,
        "quick": config.quick,
        "noisy_when": {
            "lab_wait_share_above": WAIT_SHARE,
            "load_per_core_above": LOAD_PER_CORE,  # only where the kernel has no schedstat
            "floor_spread_above": FLOOR_SPREAD,
        },
    }


def floors_json(runs: Sequence[RunRecord]) -> dict[str, Any]:
    """results.json's ``floors``: each floor over the groups' own p50s (a group's floors are measured once,
    on its server, and carried by each of its cells): n groups, their p10 / p50 / p90 and spread."""
    groups = [next(iter(modes.values())) for modes in cells(runs).values()]
    out: dict[str, Any] = {}
    for name in ("ws_ping", "http_noop"):
        p50s = [
            f.p50
            for r in groups
            for f in (r.floors if r.floors is not msgspec.UNSET else [])
            if f.name == name and f.p50
        ]
        out[name] = msgspec.to_builtins(floor(name, p50s))
    return out


def usage_by_round(traces: Sequence[Trace]) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {}
    for trace in traces:
        if trace.session not in out:
            out[trace.session] = [
                [int(r["prompt_tokens"]), int(r["cached_tokens"]), int(r["output_tokens"])]
                for r in trace.reports
            ]
    return out


def cell_prediction(calibration: Any, replay: Replay, run: dict[str, Any], config: BenchConfig) -> Any:
    """The fast model's :class:`~proto.lab.analysis.predict.Prediction` for ``run``'s cell (its mode, model,
    profile) as ``config`` runs it; None for a model the mock GPU does not know (``--url``'s) and for a
    peer (the fast model knows this server's modes only)."""
    from sampler.models import MODELS

    if run["model"] not in MODELS or run["mode"] in PEER_MODES:
        return None
    c = config
    return compose(
        run, calibration, replay, c.model_overrides, c, c.sessions, c.rollouts, c.tool_time_scale, c.seed
    )


def predict_run(
    run: dict[str, Any],
    calibration: Any,
    replay: Replay,
    model_overrides: Sequence[str],
    config: Any,
    sessions: int,
    rollouts: int,
    tool_time_scale: float,
    seed: int | None = None,
) -> Any:
    """Compose ``run``'s cell with the fast model (:func:`compose`) and write its prediction fields (in
    place): what every real-clock run reports, and what ``bench repredict`` rewrites. Returns the
    :class:`~proto.lab.analysis.predict.Prediction`."""
    p = compose(run, calibration, replay, model_overrides, config, sessions, rollouts, tool_time_scale, seed)
    apply_prediction(run, p)
    return p


def compose(
    run: dict[str, Any],
    calibration: Any,
    replay: Replay,
    model_overrides: Sequence[str],
    config: Any,
    sessions: int,
    rollouts: int,
    tool_time_scale: float,
    seed: int | None = None,
) -> Any:
    """The fast model's :class:`~proto.lab.analysis.predict.Prediction` for ``run``'s cell (its mode,
    model and profile), ``run`` left as it is. ``seed``: the run's (format 2: tool times drawn per rollout);
    None for a run that replayed the workload file's times."""
    from proto.lab.analysis.predict import predict_cell, profile_hops
    from sampler.models import MODELS
    from sampler.overrides import apply_knobs

    spec = MODELS[run["model"]]
    for text in model_overrides:
        name, _, knobs = text.partition(":")
        if name == run["model"]:
            spec = apply_knobs(spec, knobs)
    return predict_cell(
        calibration,
        run["mode"],
        replay,
        spec,
        profile_hops(run.get("profile", "local"), config),
        sessions=sessions,
        rollouts=rollouts,
        tool_time_scale=tool_time_scale,
        seed=seed,
    )


def predicted_wall(p: Any, replay: Replay, config: BenchConfig) -> float:
    """A cell's measured part as the fast model sees it: per rollout, its slowest session (a trace's from
    its last arrival). Warm-up, connections and server start are not in it."""
    n = len(replay.sessions) if replay.trace else config.sessions
    arrival = max((s.arrival_s for s in replay.sessions), default=0.0) if replay.trace else 0.0
    per = [max(p.e2e_s[i : i + n]) for i in range(0, len(p.e2e_s), max(n, 1))]
    return float(sum(per) + arrival * len(per))


def predict_cells(
    calibration: Any, keys: Iterable[CellKey], replays: dict[str, Replay], config: BenchConfig
) -> dict[CellKey, tuple[Any, float]]:
    """Each cell's :class:`~proto.lab.analysis.predict.Prediction` and its real-clock wall
    (:func:`predicted_wall`), by key; a model the mock GPU does not know has none."""
    out: dict[CellKey, tuple[Any, float]] = {}
    for key in keys:
        profile, workload, model, mode = key
        replay = replays[workload]
        p = cell_prediction(calibration, replay, {"profile": profile, "model": model, "mode": mode}, config)
        if p is not None:
            out[key] = (p, predicted_wall(p, replay, config))
    return out


def grid_predictions(
    calibration: Any, keys: Sequence[CellKey], replays: dict[str, Replay], config: BenchConfig
) -> list[GridRow]:
    """``bench --predict``'s ``grid``: every cell of the run's grid predicted by the fast model, none run
    (docs/lab.md, "The fast model's grid"). Each row: the cell, its E2E and TTFT p50, both against ``http``'s
    in the same (profile, workload, model), its parts per rollout, and its real-clock wall (the measured
    part, :func:`predicted_wall`)."""
    rows: list[GridRow] = []
    predicted = predict_cells(calibration, keys, replays, config)
    for (profile, workload, model, mode), (p, wall) in predicted.items():
        replay = replays[workload]
        fields = prediction_fields(p, None)
        del fields["prediction_error"]  # nothing measured
        rows.append(
            GridRow(
                profile=profile,
                workload=workload,
                model=model,
                mode=mode,
                sessions=len(replay.sessions) if replay.trace else config.sessions,
                rollouts=config.rollouts,
                rounds=replay.rounds,
                tool_time_scale=config.tool_time_scale,
                **fields,
                predicted_wall_s=wall,
            )
        )
    for modes in cells(rows).values():
        base = modes.get(BASELINE)
        for row in modes.values():
            e2e, ttft = ratio(row, base, "predicted_e2e_s_p50"), ratio(row, base, "predicted_ttft_ms_p50")
            row.predicted_e2e_vs_http = None if e2e is None else e2e - 1
            row.predicted_ttft_vs_http = None if ttft is None else ttft - 1
    return rows


def prediction_fields(p: Any, measured: float | None) -> dict[str, Any]:
    """A :class:`~proto.lab.analysis.predict.Prediction`'s fields of a record: its E2E and TTFT p50, its
    parts per rollout and its error against the ``measured`` E2E p50 (None: nothing measured)."""
    return {
        "predicted_e2e_s_p50": p.e2e_s_p50,
        "predicted_ttft_ms_p50": p.ttft_ms_p50,
        "predicted_parts_s": {k: v / max(len(p.e2e_s), 1) for k, v in p.parts_s.items()},  # per rollout
        "prediction_error": (p.e2e_s_p50 / measured - 1) if measured else None,
    }


def apply_prediction(run: dict[str, Any] | RunRecord, p: Any) -> None:
    """Write a :class:`~proto.lab.analysis.predict.Prediction`'s fields into ``run`` (in place): a
    :class:`~proto.lab.records.RunRecord`, or a kept file's entry as it was read."""
    fields = prediction_fields(p, run.get("e2e_s_p50") if isinstance(run, dict) else run.e2e_s_p50)
    if isinstance(run, dict):
        run.update(fields)
    else:
        for name, value in fields.items():
            setattr(run, name, value)


def results_json(
    result: BenchResult, command: str, sweep_rows: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    config = result.config
    return {
        "format": FORMAT,
        "floor": floor_json(result.pings_ms),
        "runs": [],  # the fast model alone (``--predict``); a real-clock run's come from its cell records
        "calibration": result.calibration.to_json() if result.calibration is not None else None,
        "sweep": sweep_rows or [],
        "profiles": profiles_json(config),
        "config": config_json(config),
        "command": command,
        "machine": machine(),
        "provenance": msgspec.to_builtins(provenance()),
        "design": design_json(config),
        "started_utc": utc(result.started),
        "wall_s": result.wall_s,
    }


def floor_json(pings_ms: dict[str, list[float]]) -> dict[str, Any]:
    """results.json's ``floor`` from the ping round trips of each profile."""
    every = [x for pings in pings_ms.values() for x in pings]
    return {
        "ws_ping_rtt_ms_p50": percentile(every, 50),
        "ws_ping_rtt_ms_p90": percentile(every, 90),
        "pings": len(every),
        "by_profile": {p: percentile(xs, 50) for p, xs in pings_ms.items()},
    }


def profiles_json(config: BenchConfig) -> dict[str, Any]:
    """Every rule each profile's cells ran under (docs/lab.md, "Equal rules")."""
    return {name: profile_named(name).factors() for name in config.profiles if not config.url}


def config_json(config: BenchConfig) -> dict[str, Any]:
    """results.json's ``config``."""
    return {
        "modes": list(config.modes),
        "workloads": list(config.workloads),
        "models": list(config.models),
        "sessions": config.sessions,
        "rollouts_per_session": config.rollouts,
        "warmup_per_session": config.warmup,
        "warmup_turns": config.warmup_turns,
        "turns": config.turns,
        "tool_time_scale": config.tool_time_scale,
        "quick": config.quick,
        "url": config.url,
        "model_overrides": list(config.model_overrides),
        "server_flags": list(config.server_flags),
        "calibration_rounds": config.calibration_rounds,
        "seed": config.seed,
        "jitter": config.jitter,
        "fresh_server": config.fresh_server,
    }


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def machine() -> dict[str, Any]:
    import platform

    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "processor": platform.processor() or platform.machine(),
    }


# ---- writing ------------------------------------------------------------------------------------


def clean(value: Any) -> Any:
    """NaN/inf → null, so results.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def write_json(results: dict[str, Any], out: Path) -> Path:
    path = out / "results.json"
    atomic_write(path, dumps(results))
    return path


def dumps(value: Any) -> str:
    """results.json's JSON: strict (NaN and infinity as null), one key a line."""
    return json.dumps(clean(value), indent=1, allow_nan=False) + "\n"


def atomic_write(path: Path, text: str) -> None:
    """``text`` to ``path`` whole or not at all: a temporary file beside it, flushed to the disk, then
    renamed over it (a crash leaves the old file or the new one, never half of one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself
    finally:
        os.close(directory)


CSV_FIELDS = (
    "profile",
    "workload",
    "model",
    "mode",
    "sessions",
    "rollouts",
    "turns",
    "e2e_s_p50",
    "predicted_e2e_s_p50",
    "prediction_error",
    "ttft_ms_p50",
    "predicted_ttft_ms_p50",
    "ttft_ms_p90",
    "tpot_ms_p50",
    "itl_ms_p99",
    "turn_overhead_ms_p50",
    "turn_overhead_ms_p90",
    "prefill_ms_per_turn",
    "server_cpu_ms_per_turn",
    "client_bytes_sent_per_turn",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "e2e_vs_http",
    "ttft_vs_http",
    "overhead_first_turn_ms",
    "overhead_last_turn_ms",
    # format 2 ("Statistics" in docs/lab.md): the spread, the noise flag and the paired gains
    "e2e_s_p90",
    "e2e_s_p99",
    "ttft_ms_p99",
    "noisy",
    *(
        f"{m}_gain_vs_{b}{end}"
        for b in ("http", "http_cached")
        for m in ("e2e", "ttft")
        for end in ("", "_low", "_high")
    ),
)


def write_csv(results: dict[str, Any], out: Path) -> Path:
    runs = results["runs"]
    by_cell = cells(runs)
    rows = []
    for run in runs:
        base = by_cell[cell_key(run)].get(BASELINE)
        by_turn = run["turn_overhead_ms_by_turn"]
        rows.append(
            dict(
                run,
                **run["usage"],
                e2e_vs_http=ratio(run, base, "e2e_s_p50"),
                ttft_vs_http=ratio(run, base, "ttft_ms_p50"),
                overhead_first_turn_ms=by_turn[0] if by_turn else None,
                overhead_last_turn_ms=by_turn[-1] if by_turn else None,
                **_statistics_columns(run),
            )
        )
    return write_table(out / "results.csv", CSV_FIELDS, rows, "phases_ms", "phase_{}_ms_per_turn")


def _statistics_columns(run: dict[str, Any]) -> dict[str, Any]:
    """A format-2 run's spread, noise flag and gains as flat CSV columns (empty for an older run)."""
    e, t = run.get("e2e_s_pct") or {}, run.get("ttft_ms_pct") or {}
    out: dict[str, Any] = {
        "e2e_s_p90": e.get("p90"),
        "e2e_s_p99": e.get("p99"),
        "ttft_ms_p99": t.get("p99"),
        "noisy": "; ".join(run.get("noisy") or []),
    }
    for baseline, gains in (run.get("gains") or {}).items():
        for metric, g in gains.items():
            name = f"{metric}_gain_vs_{baseline.replace('-', '_')}"
            out[name], out[name + "_low"], out[name + "_high"] = g["gain"], g["low"], g["high"]
    return out


def write_table(
    path: Path, fields: Sequence[str], rows: Sequence[dict[str, Any]], nested: str, column: str
) -> Path:
    """A CSV: ``fields`` of each row, then one column per name in the rows' ``nested`` dicts (``column``
    formats its header)."""
    names = sorted({name for row in rows for name in row[nested]})
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*fields, *(column.format(n) for n in names)])
        for row in rows:
            writer.writerow(
                [_fmt(row.get(k)) for k in fields] + [_fmt(row[nested].get(n, 0.0)) for n in names]
            )
    return path


GRID_FIELDS = (
    *CSV_FIELDS[:6],  # the cell: profile, workload, model, mode, sessions, rollouts
    "rounds",
    "tool_time_scale",
    "predicted_e2e_s_p50",
    "predicted_e2e_vs_http",
    "predicted_ttft_ms_p50",
    "predicted_ttft_vs_http",
    "predicted_wall_s",
)


def write_grid_csv(results: dict[str, Any], out: Path) -> Path:
    """``grid.csv``: results.json's ``grid``, a row a cell, its parts per rollout as ``part_<name>_s``."""
    return write_table(
        out / "grid.csv", GRID_FIELDS, results.get("grid") or [], "predicted_parts_s", "part_{}_s"
    )


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    return "" if value is None else value


# ---- reading ------------------------------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    """A results.json as JSON (for the code that rewrites one: ``bench repredict``, the calibration's reuse);
    readers take :func:`load_results`'s typed record."""
    return dict(json.loads(path.read_text(encoding="utf-8")))


def load_results(path: Path) -> Results:
    """A results.json (format 1 or 2) as a :class:`~proto.lab.records.Results`."""
    return results_of(json.loads(path.read_text(encoding="utf-8")))


def cell_key(run: dict[str, Any] | RunRecord | GridRow) -> tuple[str, str, str]:
    """(profile, workload, model): the cell a run belongs to (``profile`` is "" in files that lack it)."""
    if isinstance(run, dict):
        return (run.get("profile", ""), run["workload"], run["model"])
    return (run.profile, run.workload, run.model)


Row = TypeVar("Row", dict[str, Any], RunRecord, GridRow)


def cells(runs: Sequence[Row]) -> dict[tuple[str, str, str], dict[str, Row]]:
    """(profile, workload, model) → mode → run (a ``runs[]`` record, a ``grid`` row), in first-seen
    order."""
    out: dict[tuple[str, str, str], dict[str, Row]] = {}
    for run in runs:
        out.setdefault(cell_key(run), {})[run["mode"] if isinstance(run, dict) else run.mode] = run
    return out


def ratio(run: Row, base: Row | None, key: str) -> float | None:
    """``run[key] / base[key]``; None when either is missing or the base is zero."""
    mine, theirs = figure(run, key), None if base is None else figure(base, key)
    if not theirs or mine is None:
        return None
    return float(mine) / float(theirs)


def figure(run: dict[str, Any] | RunRecord | GridRow, key: str) -> Any:
    """``run``'s field ``key``: a record's attribute or an entry's key; None when it has none."""
    value = run.get(key) if isinstance(run, dict) else getattr(run, key, None)
    return None if value is msgspec.UNSET else value
