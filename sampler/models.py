"""The mock models: llm-d-inference-sim's timing knobs, in milliseconds as floats (never rounded).

Prefill defaults follow llm-d's published 8B-on-H100 profile: 30 ms overhead + 250 µs per
*uncached* prompt token. Only the decode speed differs between the models (65 tokens/s: a hosted
frontier model; 1 000 and 4 000 tokens/s: speculative/wafer-scale decoders), so the lab can ask
how API overhead matters as decoding gets faster.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The knob names of llm-d-inference-sim (hyphenated) mapped to our fields.
_PUBLIC_NAMES: dict[str, str] = {
    "time-to-first-token": "time_to_first_token_ms",
    "prefill-overhead": "prefill_overhead_ms",
    "prefill-time-per-token": "prefill_time_per_token_ms",
    "inter-token-latency": "inter_token_latency_ms",
    "max-num-seqs": "max_num_seqs",
    "time-factor-under-load": "time_factor_under_load",
    "kv-cache-size": "kv_cache_size",
    "block-size": "block_size",
    "ttft-jitter-std": "ttft_jitter_std",
    "itl-jitter-std": "itl_jitter_std",
    "seed": "seed",
    "max-waiting": "max_waiting",
    "pin-suspended": "pin_suspended",
    "fail-rate": "fail_rate",
    "max-model-len": "max_model_len",
    "max-output-tokens": "max_output_tokens",
}

MAX_JITTER_STD = 0.3  # llm-d's bound: a std-dev above 30 % of the mean is rejected


@dataclass(frozen=True)
class Limits:
    """What one model call may hold, as the sampling loop bounds it: the longest prompt + output, and the
    most tokens one call may generate. ``ModelSpec.limits`` for an engine in this process; an engine in
    another process reports its own (``proto.engine.client``)."""

    context_window: int = 131_072
    max_output_tokens: int = 16_384
    bound_by: str = "max-model-len"  # what sets the window, for the refusal's message


class ContextLengthExceeded(Exception):
    """The prompt cannot run on this model: longer than its context window (the model's, or the whole KV
    cache when that is smaller). Raised before the turn reaches the engine (vLLM refuses such a prompt at
    admission, "longer than the maximum model length")."""


def check_prompt(limits: Limits, prompt_tokens: int) -> None:
    if prompt_tokens > limits.context_window:
        raise ContextLengthExceeded(f"{prompt_tokens} prompt tokens; the context window is {limits.context_window} tokens ({limits.bound_by})")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    time_to_first_token_ms: float  # used only when prefill is constant (both prefill knobs 0)
    prefill_overhead_ms: float
    prefill_time_per_token_ms: float  # per *uncached* prompt token
    inter_token_latency_ms: float
    max_num_seqs: int
    time_factor_under_load: float  # L = 1 + (f-1)(running-1)/(max_num_seqs-1)
    kv_cache_size: int  # blocks
    block_size: int = 16
    ttft_jitter_std: float = 0.0  # fraction of the mean; draws clamped to ±70 %
    itl_jitter_std: float = 0.0
    seed: int = 0
    max_waiting: int = 1024
    pin_suspended: bool = True
    fail_rate: float = 0.0
    # The context window (vLLM's and llm-d-inference-sim's `max-model-len`): prompt + output tokens of one
    # model call. Llama-3.1-8B, the class these models stand for, has a 128 k window (its model card), served
    # whole (Scaleway's generative-APIs table: llama-3.1-8b-instruct, 128k context, 16 384 max output).
    max_model_len: int = Limits.context_window
    # The most tokens one model call may generate (OpenAI's "max output tokens" of a model; same table).
    # It bounds every script-driven size (`!tokens N`) too: the directive script is user input.
    max_output_tokens: int = Limits.max_output_tokens

    def __post_init__(self) -> None:
        problems = []
        if self.inter_token_latency_ms <= 0:
            problems.append("inter-token-latency must be > 0")
        if min(self.time_to_first_token_ms, self.prefill_overhead_ms, self.prefill_time_per_token_ms) < 0:
            problems.append("prefill times must be >= 0")
        if self.max_num_seqs < 1 or self.max_waiting < 0:
            problems.append("max-num-seqs must be >= 1 and max-waiting >= 0")
        if self.time_factor_under_load < 1:
            problems.append("time-factor-under-load must be >= 1")
        if self.kv_cache_size < 0 or self.block_size < 1:
            problems.append("kv-cache-size must be >= 0 and block-size >= 1")
        if not (0 <= self.ttft_jitter_std <= MAX_JITTER_STD and 0 <= self.itl_jitter_std <= MAX_JITTER_STD):
            problems.append(f"jitter std-dev must be within [0, {MAX_JITTER_STD}]")
        if not 0 <= self.fail_rate <= 1:
            problems.append("fail-rate must be within [0, 1]")
        if self.max_model_len < 1 or self.max_output_tokens < 1:
            problems.append("max-model-len and max-output-tokens must be >= 1")
        if problems:
            raise ValueError(f"model {self.name!r}: " + "; ".join(problems))

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.inter_token_latency_ms

    @property
    def kv_tokens(self) -> int:
        """How many tokens the whole KV cache holds: a prompt longer than this can never be prefilled."""
        return self.kv_cache_size * self.block_size

    @property
    def context_window(self) -> int:
        """The longest sequence (prompt + output) this engine can run: the model's window, or less when the
        KV cache is smaller (vLLM refuses to start in that case; the mock lets a study shrink the cache)."""
        return min(self.max_model_len, self.kv_tokens)

    @property
    def limits(self) -> Limits:
        bound_by = "max-model-len" if self.max_model_len <= self.kv_tokens else "the KV cache: kv-cache-size x block-size"
        return Limits(self.context_window, self.max_output_tokens, bound_by)

    @property
    def constant_prefill(self) -> bool:
        return self.prefill_overhead_ms == 0 and self.prefill_time_per_token_ms == 0

    def public(self) -> dict[str, object]:
        out: dict[str, object] = {key: getattr(self, field) for key, field in _PUBLIC_NAMES.items()}
        out["tokens-per-second"] = self.tokens_per_s
        return out

    def override(self, **changes: Any) -> ModelSpec:
        """A copy with some knobs changed. Accepts field names, llm-d's hyphenated names, and
        ``tokens_per_s`` / ``tokens-per-second`` (converted to the inter-token latency)."""
        fields: dict[str, Any] = {}
        for key, value in changes.items():
            if key in ("tokens_per_s", "tokens-per-second"):
                fields["inter_token_latency_ms"] = 1000.0 / float(value)
            else:
                fields[_PUBLIC_NAMES.get(key, key.replace("-", "_"))] = value
        return dataclasses.replace(self, **fields)


def _h100(name: str, tokens_per_s: float) -> ModelSpec:
    return ModelSpec(
        name=name,
        time_to_first_token_ms=30.0,
        prefill_overhead_ms=30.0,
        prefill_time_per_token_ms=0.25,
        inter_token_latency_ms=1000.0 / tokens_per_s,
        # vLLM's default batch bound; a full batch decodes 2x slower than a lone sequence.
        max_num_seqs=256,
        time_factor_under_load=2.0,
        # ~60 GB of KV on an 80 GB H100 at 128 KiB/token (Llama-3-8B: 32 layers x 8 KV heads x 128 x 2 x fp16)
        # ≈ 480 k tokens = 30 000 blocks of 16.
        kv_cache_size=30_000,
    )


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (_h100("mock-65tps", 65.0), _h100("mock-1000tps", 1000.0), _h100("mock-4000tps", 4000.0))
}


def resolve_model(name: str) -> ModelSpec:
    """The model called ``name``; KeyError (naming the known ones) when there is none."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
