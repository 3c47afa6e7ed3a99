"""Intervals over a fleet's repeated draws (docs/lab.md, "Fleets"): each (agents, KV budget, pinning,
replicas, routing, mode) cell run ``--repeats R`` times, repeat r on arrivals and tool times from seed + r.

Per cell, over its R draws:

* **TTFT p50 and E2E p50** — the median over the pooled rollouts of the rollout's median TTFT, and of its
  E2E, with a bootstrap 95 % interval that resamples rollouts (scipy's ``bootstrap``, percentile method,
  ``stats.RESAMPLES``, a fixed seed so a file recomputes to the same interval).
* **Goodput** — the mean over the draws of the rollouts meeting the SLO per second. From
  ``stats.MIN_PAIRS`` draws its interval resamples draws; below that (a sweep of one draw per cell) it
  resamples the cell's rollouts, each draw's wall time held fixed (:func:`goodput_interval`), so it says
  how much the SLO's outcome varies across agents, not across schedules.
* **The engine's prefix hit rate** — its hits over its queries, summed over the draws (and replicas); the
  interval resamples draws (none below ``stats.MIN_PAIRS`` draws).
* **Paired gains** (``stats.paired_gain``: mean of ``x / base − 1``, BCa): every mode against the group's
  first mode, and every routing against the first routing for the same mode, since all of them replay the
  same rollouts — on E2E and on the rollout's median TTFT (a pair: one agent of one draw), and on goodput
  (a pair: one draw).
* **Pinning** — the same paired gains of ``pin-suspended`` on against off (``vs_pin_off``, on the pin-on
  cell), same mode, load, KV budget, replicas, routing and draws: the two groups run on fresh engines with
  the same arrivals and tool times, so agent k of draw r is one pair. Negative: pinning is faster.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
import numpy as np
from scipy.stats import bootstrap

from proto.lab.analysis.stats import CONFIDENCE, MIN_PAIRS, RESAMPLES, Gain, paired_gain


class FleetCell(Protocol):
    """What a summary reads of a cell (``proto.lab.run.fleet.FleetCell``)."""

    agents: int
    kv_blocks: float
    pin_suspended: bool
    replicas: int
    routing: str
    mode: str
    repeat: int
    goodput_rps: float
    wall_s: float
    rollout_slo_met: list[bool]
    replica_prefix_queries: list[float]
    replica_prefix_hits: list[float]
    rollout_e2e_s: list[float | None]  # None: a rollout that failed (paired gains leave its pair out)
    rollout_ttft_ms_p50: list[float | None]
    rollout_prompt_tokens: list[int]
    rollout_cached_tokens: list[int]


class Interval(msgspec.Struct, frozen=True):
    value: float | None
    low: float | None
    high: float | None
    n: int  # how many were resampled
    resampled: str = "rollouts"  # rollouts | draws | rollouts, wall fixed (goodput of < 3 draws)


class CellSummary(msgspec.Struct, frozen=True):
    agents: int
    kv_blocks: float
    pin_suspended: bool
    replicas: int
    routing: str
    mode: str
    repeats: int
    ttft_ms_p50: Interval
    e2e_s_p50: Interval
    goodput_rps: Interval
    engine_prefix_hit_rate: float  # over the draws: the engines' hits / queries, summed
    vs_mode: list[Gain]  # against the group's first mode (empty for that mode)
    vs_routing: list[Gain]  # against the first routing, same mode (empty for it and for one replica)
    confidence: float = CONFIDENCE
    # Added with the pinning factor; a summary written before them lacks them (``bench fleet --summarize``).
    hit_rate: Interval | None = None  # engine_prefix_hit_rate with its interval over draws
    vs_pin_off: list[Gain] = []  # pin on against pin off (on the pin-on cell; empty otherwise)
    # The clients' hit rate (cached ÷ prompt tokens the server reported), its interval resampling rollouts
    # pooled over the draws; None for cells written before the lab kept it per rollout.
    client_hit_rate: Interval | None = None


def _median_interval(values: Sequence[float | None], seed: int = 0) -> Interval:
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    return _interval(x, np.median, "rollouts", seed)


def mean_interval(values: Sequence[float], resampled: str = "draws", seed: int = 0) -> Interval:
    """The mean of ``values`` with a percentile-bootstrap interval resampling them (none below
    ``MIN_PAIRS``; the point itself when they are all equal)."""
    return _interval(np.asarray(values, dtype=float), np.mean, resampled, seed)


def _interval(x: np.ndarray, statistic: Any, resampled: str, seed: int) -> Interval:
    if len(x) == 0:
        return Interval(None, None, None, 0, resampled)
    point = float(statistic(x))
    if len(x) < MIN_PAIRS:
        return Interval(point, None, None, len(x), resampled)
    if float(np.ptp(x)) == 0.0:
        return Interval(point, point, point, len(x), resampled)
    return Interval(point, *_boot((x,), statistic, seed), len(x), resampled)


def _boot(samples: tuple[np.ndarray, ...], statistic: Any, seed: int) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's DegenerateDataWarning on near-constant samples
        res = bootstrap(
            samples,
            statistic,
            paired=len(samples) > 1,
            vectorized=True,
            n_resamples=RESAMPLES,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def goodput_interval(runs: Sequence[FleetCell], seed: int = 0) -> Interval:
    """Goodput over a cell's draws (the mean of each draw's rollouts meeting the SLO ÷ its wall time). From
    ``MIN_PAIRS`` draws the interval resamples draws. Below, it resamples the rollouts, each draw's wall
    held fixed: rollout i of draw r counts ``met_i · N / (R · wall_r)`` (N rollouts over R draws), whose
    mean is exactly the goodput, so a resample is the goodput those agents' outcomes would have given."""
    if len(runs) >= MIN_PAIRS:
        return mean_interval([c.goodput_rps for c in runs], "draws", seed)
    n = sum(len(c.rollout_slo_met) for c in runs)
    per_rollout = [
        float(met) * n / (len(runs) * c.wall_s) if c.wall_s > 0 else 0.0
        for c in runs
        for met in c.rollout_slo_met
    ]
    return mean_interval(per_rollout, "rollouts, wall fixed", seed)


def _ratio_of_sums(hits: np.ndarray, queries: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(hits, axis=axis) / np.sum(queries, axis=axis)  # type: ignore[no-any-return]


def _rate_interval(hits: np.ndarray, queries: np.ndarray, unit: str, seed: int) -> Interval:
    """hits ÷ queries summed, its interval resampling the units (a unit's hits and queries stay together)."""
    point = float(hits.sum() / queries.sum())
    if len(queries) < MIN_PAIRS:
        return Interval(point, None, None, len(queries), unit)
    rates = np.divide(hits, queries, out=np.zeros_like(hits), where=queries > 0)
    if float(np.ptp(rates)) == 0.0:
        return Interval(point, point, point, len(queries), unit)
    return Interval(point, *_boot((hits, queries), _ratio_of_sums, seed), len(queries), unit)


def hit_rate_interval(runs: Sequence[FleetCell], seed: int = 0) -> Interval:
    """The engines' prefix hit rate over a cell's draws: hits ÷ queries summed over draws and replicas, its
    interval resampling draws."""
    hits = np.asarray([sum(c.replica_prefix_hits) for c in runs], dtype=float)
    queries = np.asarray([sum(c.replica_prefix_queries) for c in runs], dtype=float)
    if len(runs) == 0 or queries.sum() <= 0:
        return Interval(None, None, None, len(runs), "draws")
    if len(runs) >= MIN_PAIRS and np.any(queries <= 0):  # a draw with no lookups: no interval
        point = float(hits.sum() / queries.sum())
        return Interval(point, point, point, len(runs), "draws")
    return _rate_interval(hits, queries, "draws", seed)


def client_hit_rate_interval(runs: Sequence[FleetCell], seed: int = 0) -> Interval | None:
    """The clients' prefix hit rate over a cell's rollouts, pooled over its draws: cached ÷ prompt tokens
    summed, its interval resampling rollouts. It stands beside the engines' rate where the draws are too few
    to give that one an interval; the two differ only where a preempted request's recompute is looked up
    again. None for cells without the per-rollout figures."""
    cached = np.asarray([float(v) for c in runs for v in c.rollout_cached_tokens])
    prompt = np.asarray([float(v) for c in runs for v in c.rollout_prompt_tokens])
    if len(prompt) == 0 or len(prompt) != len(cached) or prompt.sum() <= 0:
        return None
    return _rate_interval(cached, prompt, "rollouts", seed)


def _key(c: FleetCell) -> tuple[int, float, bool, int, str, str]:
    return (c.agents, c.kv_blocks, c.pin_suspended, c.replicas, c.routing, c.mode)


def _paired(cells: Sequence[FleetCell], base: Sequence[FleetCell], baseline: str) -> list[Gain]:
    """Gains of ``cells`` against ``base``, draw by draw (both sorted by repeat, the same draws)."""
    if [c.repeat for c in cells] != [b.repeat for b in base]:
        return []
    e2e = [math.nan if v is None else v for c in cells for v in c.rollout_e2e_s]  # a failed pair: left out
    ttft = [math.nan if v is None else v for c in cells for v in c.rollout_ttft_ms_p50]
    base_e2e = [math.nan if v is None else v for b in base for v in b.rollout_e2e_s]
    base_ttft = [math.nan if v is None else v for b in base for v in b.rollout_ttft_ms_p50]
    if len(e2e) != len(base_e2e):
        return []
    return [
        paired_gain(e2e, base_e2e, baseline=baseline, metric="e2e"),
        paired_gain(ttft, base_ttft, baseline=baseline, metric="ttft"),
        paired_gain(
            [c.goodput_rps for c in cells], [b.goodput_rps for b in base], baseline=baseline, metric="goodput"
        ),
    ]


PIN_OFF = "pin off"  # the baseline's name in a pinning gain
_ROLLOUT_FIELD = {"e2e": "rollout_e2e_s", "ttft": "rollout_ttft_ms_p50"}


def pin_gain_net(
    on: Sequence[FleetCell],
    off: Sequence[FleetCell],
    controls: Sequence[tuple[Sequence[FleetCell], Sequence[FleetCell]]],
    metric: str,
) -> Gain | None:
    """Pinning's gain for a design that pins, net of what else separates the pin-on and pin-off groups (their
    engines, the time each ran on a shared machine): the control designs' own on ÷ off of the same agent and
    draw. A pair is one agent of one draw: x = on ÷ off of the design, its baseline the mean over the
    controls of on ÷ off; the gain is the mean of x ÷ baseline − 1 (``stats.paired_gain``). None when the
    draws or the agents do not line up."""
    field = _ROLLOUT_FIELD[metric]

    def ratios(a: Sequence[FleetCell], b: Sequence[FleetCell]) -> np.ndarray | None:
        if [c.repeat for c in a] != [c.repeat for c in b] or [c.repeat for c in a] != [c.repeat for c in on]:
            return None
        x = np.asarray([np.nan if v is None else v for c in a for v in getattr(c, field)], dtype=float)
        y = np.asarray([np.nan if v is None else v for c in b for v in getattr(c, field)], dtype=float)
        if len(x) != len(y):
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            return x / y  # type: ignore[no-any-return]

    mine = ratios(on, off)
    theirs = [ratios(a, b) for a, b in controls]
    if mine is None or not theirs or any(t is None or len(t) != len(mine) for t in theirs):
        return None
    base = np.mean([t for t in theirs if t is not None], axis=0)
    return paired_gain(list(mine), list(base), baseline=f"{PIN_OFF}, net of the control", metric=metric)


def summarize(cells: Sequence[FleetCell]) -> list[CellSummary]:
    """One summary per cell over its repeats, in the order the cells first ran."""
    by: dict[tuple[int, float, bool, int, str, str], list[FleetCell]] = {}
    for c in cells:
        by.setdefault(_key(c), []).append(c)
    for runs in by.values():
        runs.sort(key=lambda c: c.repeat)
    first_mode: dict[tuple[int, float, bool, int, str], str] = {}
    first_routing: dict[tuple[int, float, bool, int, str], str] = {}
    for agents, kv, pin, m, routing, mode in by:
        first_mode.setdefault((agents, kv, pin, m, routing), mode)
        first_routing.setdefault((agents, kv, pin, m, mode), routing)
    out = []
    for (agents, kv, pin, m, routing, mode), runs in by.items():
        base_mode = first_mode[(agents, kv, pin, m, routing)]
        base_routing = first_routing[(agents, kv, pin, m, mode)]
        unpinned = by.get((agents, kv, False, m, routing, mode)) if pin else None
        hit_rate = hit_rate_interval(runs)
        out.append(
            CellSummary(
                agents=agents,
                kv_blocks=kv,
                pin_suspended=pin,
                replicas=m,
                routing=routing,
                mode=mode,
                repeats=len(runs),
                ttft_ms_p50=_median_interval([v for c in runs for v in c.rollout_ttft_ms_p50]),
                e2e_s_p50=_median_interval([v for c in runs for v in c.rollout_e2e_s]),
                goodput_rps=goodput_interval(runs),
                engine_prefix_hit_rate=hit_rate.value or 0.0,
                vs_mode=[]
                if mode == base_mode
                else _paired(runs, by[(agents, kv, pin, m, routing, base_mode)], base_mode),
                vs_routing=[]
                if routing == base_routing
                else _paired(runs, by[(agents, kv, pin, m, base_routing, mode)], base_routing),
                hit_rate=hit_rate,
                vs_pin_off=[] if unpinned is None else _paired(runs, unpinned, PIN_OFF),
                client_hit_rate=client_hit_rate_interval(runs),
            )
        )
    return out
