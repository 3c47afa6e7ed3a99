"""The lab's statistics (docs/lab.md, "Statistics"): percentiles of a mode, and the paired gain of a mode
against a baseline with a bootstrap 95 % interval (scipy.stats.bootstrap). Pure: no clock, no I/O.

**The gain** of a mode against a baseline is the mean, over rollout pairs, of ``mode / baseline − 1``: a pair
is the same rollout (same plan, same seed, same tool times) run in both modes. **Negative = faster than the
baseline.** The interval resamples rollout indices (``paired=True``: a pair stays a pair), BCa, 9 999
resamples, from a fixed seed so a file recomputes to the same interval. A gain whose interval holds 0 is
"no difference"; fewer than ``MIN_PAIRS`` pairs get no interval ("too few pairs").
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import msgspec
import numpy as np
from scipy.stats import bootstrap

CONFIDENCE = 0.95
RESAMPLES = 9_999
MIN_ROLLOUTS = 10  # a default cell's measured rollouts per mode, at least (--quick has fewer, and says so)
MIN_PAIRS = 3  # below it a bootstrap interval says nothing: two pairs resample to at most three means
SIGN = "gain = mean over rollout pairs of (mode / baseline - 1); negative = faster than the baseline"

FASTER, SLOWER, SAME, FEW = "faster", "slower", "no difference", "too few pairs"


class Percentiles(msgspec.Struct, frozen=True):
    """p50 / p90 / p99 of one figure over a mode's rollouts (E2E) or turns (TTFT); linear interpolation
    (numpy's default); None for no values."""

    p50: float | None
    p90: float | None
    p99: float | None
    n: int


def percentiles(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles(None, None, None, 0)
    p50, p90, p99 = (float(x) for x in np.percentile(np.asarray(values, dtype=float), (50, 90, 99)))
    return Percentiles(p50, p90, p99, len(values))


class Gain(msgspec.Struct, frozen=True):
    """A mode's paired gain against one baseline on one figure (``e2e``: the rollout's E2E; ``ttft``: the
    rollout's median TTFT). ``low``/``high``: the bootstrap interval at ``confidence``."""

    baseline: str
    metric: str
    pairs: int
    gain: float | None
    low: float | None
    high: float | None
    verdict: str  # faster | slower | no difference | too few pairs
    confidence: float = CONFIDENCE
    method: str = "BCa"


def verdict(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return FEW
    if high < 0:
        return FASTER
    if low > 0:
        return SLOWER
    return SAME


def paired_gain(
    mode: Sequence[float], base: Sequence[float], *, baseline: str, metric: str, seed: int = 0
) -> Gain:
    """The paired gain of ``mode`` against ``base`` (``mode[i]`` and ``base[i]`` are one rollout pair),
    with its bootstrap interval (module docstring)."""
    if len(mode) != len(base):
        raise ValueError(f"paired samples of different lengths: {len(mode)} and {len(base)}")
    x, b = np.asarray(mode, dtype=float), np.asarray(base, dtype=float)
    keep = np.isfinite(x) & np.isfinite(b) & (b > 0)
    x, b = x[keep], b[keep]
    n = len(x)
    if n == 0:
        return Gain(baseline, metric, 0, None, None, None, FEW)
    d = x / b - 1.0
    point = float(d.mean())
    if n < MIN_PAIRS:
        return Gain(baseline, metric, n, point, None, None, FEW)
    if float(np.ptp(d)) <= 1e-12:  # every pair the same gain (to rounding): the interval is that point
        return Gain(baseline, metric, n, point, point, point, verdict(point, point), method="degenerate")
    method = "BCa"
    low, high = _interval(x, b, seed, method)
    if not (math.isfinite(low) and math.isfinite(high)):  # BCa's acceleration undefined for this sample
        method = "percentile"
        low, high = _interval(x, b, seed, method)
    return Gain(baseline, metric, n, point, low, high, verdict(low, high), method=method)


def _ratio_gain(x: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x / b, axis=axis) - 1.0  # type: ignore[no-any-return]


def _interval(x: np.ndarray, b: np.ndarray, seed: int, method: str) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's DegenerateDataWarning: handled by the caller's fallback
        res = bootstrap(
            (x, b),
            _ratio_gain,
            paired=True,
            vectorized=True,
            n_resamples=RESAMPLES,
            confidence_level=CONFIDENCE,
            method=method,
            rng=np.random.default_rng(seed),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
