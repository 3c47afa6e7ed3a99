"""What one engine step costs: the kernel time of a batch, host overhead excluded.

The scheduler (``sampler.batch.Scheduler``) builds each step's batch and asks a ``StepCost`` for its time.
Two kinds implement it:

* a measured profile (``ModelSpec.step_profile``): ``sampler.steptables.StepTables``, read from
  ``sampler/profiles/<name>.json`` (kernel tables from NVIDIA's aiconfigurator). It is imported only when a
  model names a profile;
* ``AnalyticStepCost``: the catalogue's cited classes (docs/mock-gpu.md, "Models"), a linear model with the
  class's own figures — prefill compute per token, a decode step per batch size (llm-d's load factor) and a
  KV read per token of context.

Speculative decoding's tokens per step are drawn here too (``spec_tokens_drawn``): how many a step emits is
the scheduler's concern, what it costs the ``StepCost``'s.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Sequence
from typing import Protocol, cast

from sampler.models import ModelSpec

__all__ = ["AnalyticStepCost", "StepCost", "spec_tokens_drawn", "step_cost"]


class StepCost(Protocol):
    def step_ms(self, prefill: Sequence[tuple[int, int]], decode_ctx: Sequence[int]) -> float:
        """Kernel ms of one step, host overhead excluded. ``prefill``: (chunk tokens, tokens already in the
        KV cache) per prefilling sequence; ``decode_ctx``: the context length of each decoding sequence."""
        ...


def load_factor(spec: ModelSpec, running: int) -> float:
    """llm-d-inference-sim's ``1 + (f − 1)(n − 1)/(max-num-seqs − 1)``, n clamped to max-num-seqs: a decode
    step of n sequences against one of a single sequence, for the analytic classes."""
    if spec.max_num_seqs <= 1 or running <= 1:
        return 1.0
    running = min(running, spec.max_num_seqs)
    return 1.0 + (spec.time_factor_under_load - 1.0) * (running - 1) / (spec.max_num_seqs - 1)


class AnalyticStepCost:
    """``prefill-time-per-token`` × the step's prefill tokens (compute: linear, the context a chunk attends to
    is not costed), plus, when the step decodes, ``inter-token-latency`` × L(decodes) + ``kv-read-time-per-
    token`` × the decodes' total context (memory-bound: each step reads every decoding sequence's KV)."""

    __slots__ = ("_factors", "_itl", "_kv_read", "_per_token")

    def __init__(self, spec: ModelSpec) -> None:
        self._per_token = spec.prefill_time_per_token_ms
        self._itl = spec.inter_token_latency_ms
        self._kv_read = spec.kv_read_time_per_token_ms
        # The load factor by decode count, computed once (it is asked for every step).
        self._factors = [load_factor(spec, n) for n in range(spec.max_num_seqs + 1)]

    def step_ms(self, prefill: Sequence[tuple[int, int]], decode_ctx: Sequence[int]) -> float:
        ms = 0.0
        if prefill:
            ms = self._per_token * sum(chunk for chunk, _ in prefill)
        n = len(decode_ctx)
        if n:
            factors = self._factors
            ms += self._itl * factors[min(n, len(factors) - 1)]
            if self._kv_read:
                ms += self._kv_read * sum(decode_ctx)
        return ms


def step_cost(spec: ModelSpec) -> StepCost:
    """The model's step cost: its measured profile when it names one (``sampler.steptables``, imported here
    and only then), else the analytic model of its cited figures."""
    if spec.step_profile is None:
        return AnalyticStepCost(spec)
    tables = importlib.import_module("sampler.steptables")
    return cast(StepCost, tables.StepTables.load(spec.step_profile))


def spec_tokens_drawn(k: int, acceptance: float, rng: random.Random) -> int:
    """One step's tokens for one sequence: 1 + the draft tokens accepted before the first rejection."""
    m = 1
    while m <= k and rng.random() < acceptance:
        m += 1
    return m
