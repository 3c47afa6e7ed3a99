"""The timing model: llm-d-inference-sim's formulas without its whole-millisecond rounding.

    prefill = prefill-overhead + uncached × prefill-time-per-token     (or time-to-first-token)
    token i due at t_first + Σ ITL × L(running)                        (deadlines, no drift)
    L = 1 + (f − 1)(running − 1)/(max-num-seqs − 1)

Both prefill and each inter-token interval are multiplied by the load factor and by a clamped
Gaussian jitter draw, as llm-d does.
"""

from __future__ import annotations

import random

from sampler.models import ModelSpec

JITTER_CLAMP = 0.7  # a draw never moves a duration by more than ±70 % of its mean (llm-d)


def load_factor(spec: ModelSpec, running: int) -> float:
    if spec.max_num_seqs <= 1 or running <= 1:
        return 1.0
    running = min(running, spec.max_num_seqs)
    return 1.0 + (spec.time_factor_under_load - 1.0) * (running - 1) / (spec.max_num_seqs - 1)


def jittered(mean: float, std_fraction: float, rng: random.Random) -> float:
    if std_fraction == 0 or mean == 0:
        return mean  # no draw: turning jitter on/off elsewhere must not shift this stream
    z = rng.gauss(0.0, std_fraction)
    return mean * (1.0 + max(-JITTER_CLAMP, min(JITTER_CLAMP, z)))


class Timing:
    """Draws durations for one engine; one seeded RNG so a run is reproducible by seed."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        # Without jitter an interval depends only on how many sequences run: drawn once per count (it is
        # asked for every token).
        self._itl: dict[int, float] | None = {} if spec.itl_jitter_std == 0 else None

    def prefill_ms(self, uncached_tokens: int, running: int) -> float:
        s = self.spec
        if s.constant_prefill:
            mean = s.time_to_first_token_ms
        else:
            mean = s.prefill_overhead_ms + uncached_tokens * s.prefill_time_per_token_ms
        return jittered(mean * load_factor(s, running), s.ttft_jitter_std, self.rng)

    def itl_mean_s(self, running: int) -> float:
        """The interval's mean at this batch size (no draw)."""
        return self.spec.inter_token_latency_ms * load_factor(self.spec, running) / 1000.0

    def itl_s(self, running: int) -> float:
        """The interval to the next token, drawn when the previous one is released."""
        memo = self._itl
        if memo is not None:
            itl = memo.get(running)
            if itl is None:
                itl = memo[running] = (
                    self.spec.inter_token_latency_ms * load_factor(self.spec, running) / 1000.0
                )
            return itl
        s = self.spec
        mean = s.inter_token_latency_ms * load_factor(s, running) / 1000.0
        return jittered(mean, s.itl_jitter_std, self.rng)
