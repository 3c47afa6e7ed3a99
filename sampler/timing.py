"""The step loop's draws: jitter (llm-d's clamped Gaussian, kept as floats) and speculative tokens.

    step    = (step-overhead + StepCost.step_ms(batch)) × jitter     (ttft-jitter-std when the step
                                                                        prefills, itl-jitter-std otherwise)
    dispatch = prefill-overhead × jitter(ttft-jitter-std)            (per request, before its first chunk)

One seeded RNG for the jitter, another for the speculative draws, so turning one on does not shift the
other's stream; no draw when a std is 0.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from sampler.models import ModelSpec
from sampler.steps import StepCost, spec_tokens_drawn, step_cost

JITTER_CLAMP = 0.7  # a draw never moves a duration by more than ±70 % of its mean (llm-d)


def jittered(mean: float, std_fraction: float, rng: random.Random) -> float:
    if std_fraction == 0 or mean == 0:
        return mean  # no draw: turning jitter on/off elsewhere must not shift this stream
    z = rng.gauss(0.0, std_fraction)
    return mean * (1.0 + max(-JITTER_CLAMP, min(JITTER_CLAMP, z)))


class Timing:
    """Draws durations for one engine; seeded RNGs so a run is reproducible by seed."""

    def __init__(self, spec: ModelSpec, cost: StepCost | None = None) -> None:
        self.spec = spec
        self.cost = cost if cost is not None else step_cost(spec)
        self.rng = random.Random(spec.seed)
        self.spec_rng = random.Random(f"spec:{spec.seed}")
        self._overhead = spec.step_overhead_ms
        self._spec_k = spec.spec_tokens if spec.spec_acceptance > 0 else 0
        self.speculative = self._spec_k > 0

    def dispatch_ms(self) -> float:
        """A request's cost before its first chunk (holding its slot, not the GPU)."""
        return jittered(self.spec.dispatch_ms, self.spec.ttft_jitter_std, self.rng)

    def step_mean_ms(self, prefill: Sequence[tuple[int, int]], decode_ctx: Sequence[int]) -> float:
        return self._overhead + self.cost.step_ms(prefill, decode_ctx)

    def step_ms(self, prefill: Sequence[tuple[int, int]], decode_ctx: Sequence[int]) -> float:
        """One step's duration, drawn when the scheduler forms the step."""
        s = self.spec
        mean = self._overhead + self.cost.step_ms(prefill, decode_ctx)
        return jittered(mean, s.ttft_jitter_std if prefill else s.itl_jitter_std, self.rng)

    def decode_tokens(self) -> int:
        """Tokens one decoding sequence gets from a step: 1, or 1 + accepted drafts."""
        k = self._spec_k
        return spec_tokens_drawn(k, self.spec.spec_acceptance, self.spec_rng) if k else 1
