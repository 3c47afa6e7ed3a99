"""Intervals over a fleet's repeated draws (docs/lab.md, "Fleets"): each (agents, KV budget, pinning,
replicas, routing, mode) cell run ``--repeats R`` times, repeat r on arrivals and tool times from seed + r.

Per cell, over its R draws:

* **TTFT p50 and E2E p50** — the median over the pooled rollouts of the rollout's median TTFT, and of its
  E2E, with a bootstrap 95 % interval that resamples rollouts (scipy's ``bootstrap``, percentile method,
  ``stats.RESAMPLES``, a fixed seed so a file recomputes to the same interval).
* **Goodput** — the mean over the draws of the rollouts meeting the SLO per second, its interval resampling
  draws (none below ``stats.MIN_PAIRS`` draws).
* **Paired gains** (``stats.paired_gain``: mean of ``x / base − 1``, BCa): every mode against the group's
  first mode, and every routing against the first routing for the same mode, since all of them replay the
  same rollouts — on E2E and on the rollout's median TTFT (a pair: one agent of one draw), and on goodput
  (a pair: one draw).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Protocol

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
    replica_prefix_queries: list[float]
    replica_prefix_hits: list[float]
    rollout_e2e_s: list[float]
    rollout_ttft_ms_p50: list[float]


class Interval(msgspec.Struct, frozen=True):
    value: float | None
    low: float | None
    high: float | None
    n: int  # what was resampled: rollouts, or draws for goodput


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


def _median_interval(values: Sequence[float], seed: int = 0) -> Interval:
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return Interval(None, None, None, 0)
    point = float(np.median(x))
    if len(x) < MIN_PAIRS:
        return Interval(point, None, None, len(x))
    if float(np.ptp(x)) == 0.0:
        return Interval(point, point, point, len(x))
    return Interval(point, *_boot(x, np.median, seed), len(x))


def _mean_interval(values: Sequence[float], seed: int = 0) -> Interval:
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return Interval(None, None, None, 0)
    point = float(np.mean(x))
    if len(x) < MIN_PAIRS:
        return Interval(point, None, None, len(x))
    if float(np.ptp(x)) == 0.0:
        return Interval(point, point, point, len(x))
    return Interval(point, *_boot(x, np.mean, seed), len(x))


def _boot(x: np.ndarray, statistic: object, seed: int) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's DegenerateDataWarning on near-constant samples
        res = bootstrap(
            (x,),
            statistic,
            vectorized=True,
            n_resamples=RESAMPLES,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _key(c: FleetCell) -> tuple[int, float, bool, int, str, str]:
    return (c.agents, c.kv_blocks, c.pin_suspended, c.replicas, c.routing, c.mode)


def _paired(cells: Sequence[FleetCell], base: Sequence[FleetCell], baseline: str) -> list[Gain]:
    """Gains of ``cells`` against ``base``, draw by draw (both sorted by repeat, the same draws)."""
    if [c.repeat for c in cells] != [b.repeat for b in base]:
        return []
    e2e = [v for c in cells for v in c.rollout_e2e_s]
    ttft = [v for c in cells for v in c.rollout_ttft_ms_p50]
    base_e2e = [v for b in base for v in b.rollout_e2e_s]
    base_ttft = [v for b in base for v in b.rollout_ttft_ms_p50]
    if len(e2e) != len(base_e2e):
        return []
    return [
        paired_gain(e2e, base_e2e, baseline=baseline, metric="e2e"),
        paired_gain(ttft, base_ttft, baseline=baseline, metric="ttft"),
        paired_gain(
            [c.goodput_rps for c in cells], [b.goodput_rps for b in base], baseline=baseline, metric="goodput"
        ),
    ]


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
        queries = sum(q for c in runs for q in c.replica_prefix_queries)
        hits = sum(h for c in runs for h in c.replica_prefix_hits)
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
                goodput_rps=_mean_interval([c.goodput_rps for c in runs]),
                engine_prefix_hit_rate=hits / queries if queries else 0.0,
                vs_mode=[]
                if mode == base_mode
                else _paired(runs, by[(agents, kv, pin, m, routing, base_mode)], base_mode),
                vs_routing=[]
                if routing == base_routing
                else _paired(runs, by[(agents, kv, pin, m, base_routing, mode)], base_routing),
            )
        )
    return out
