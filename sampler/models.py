"""The mock models: llm-d-inference-sim's timing knobs, in milliseconds as floats (never rounded).

Each model stands for a hardware class, and its knobs come from published measurements of that class
(``Calibration``: the class, and one source per knob, shown by ``GET /v1/models`` and argued in
docs/mock-gpu.md, "Models"). The decode speeds are the seed's story (65 tokens/s on GPUs; 1 000 sustained and
4 000
in bursts on wafer-scale hardware); the prefill is the class's own, never one profile for every speed.
``mock-h100-8b`` keeps llm-d's 8B-on-H100 profile, which every model used before, under its own name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sampler.steptables import StepTables

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
    # The step loop's (docs/mock-gpu.md, "The step clock"): vLLM's engine-argument names where vLLM has one.
    "max-num-batched-tokens": "max_num_batched_tokens",
    "step-overhead": "step_overhead_ms",
    "kv-read-time-per-token": "kv_read_time_per_token_ms",
    "spec-tokens": "spec_tokens",
    "spec-acceptance": "spec_acceptance",
    "kv-idle-ttl": "kv_idle_ttl_s",
}

MAX_JITTER_STD = 0.3  # llm-d's bound: a std-dev above 30 % of the mean is rejected


def spec_tokens_mean(k: int, acceptance: float) -> float:
    """Expected tokens per step with ``k`` draft tokens, each accepted with probability α until the first
    rejection: (1 − α^(k+1)) / (1 − α), the target model's own token included (Leviathan et al., "Fast
    Inference from Transformers via Speculative Decoding", 2023, eq. 1)."""
    if k <= 0 or acceptance <= 0:
        return 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class Calibration:
    """Where a model's knobs come from: the hardware class it stands for and a source per knob."""

    hardware: str
    sources: dict[str, str]  # knob (llm-d name) -> the measurement or published profile it follows

    def public(self) -> dict[str, object]:
        return {"hardware": self.hardware, "sources": dict(self.sources)}


@dataclass(frozen=True)
class ModelLimits:
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


def context_message(exc: ContextLengthExceeded) -> str:
    """The refusal's message on every transport (OpenAI's words, then the counts)."""
    return f"Your input exceeds the context window of this model ({exc}). Adjust your input and try again."


def check_input(limits: ModelLimits, tokens_so_far: int) -> None:
    """While an input is tokenized: refused as soon as its tokens so far pass the window (the prompt will
    hold at least these), before the rest is paid for."""
    if tokens_so_far > limits.context_window:
        raise ContextLengthExceeded(
            f"more than {limits.context_window} prompt tokens (at least {tokens_so_far}); the context window "
            f"is {limits.context_window} tokens ({limits.bound_by})"
        )


def check_prompt(limits: ModelLimits, prompt_tokens: int) -> None:
    if prompt_tokens > limits.context_window:
        raise ContextLengthExceeded(
            f"{prompt_tokens} prompt tokens; the context window is {limits.context_window} tokens "
            f"({limits.bound_by})"
        )


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
    max_model_len: int = ModelLimits.context_window
    # The most tokens one model call may generate (OpenAI's "max output tokens" of a model; same table).
    # It bounds every script-driven size (`!tokens N`) too: the directive script is user input.
    max_output_tokens: int = ModelLimits.max_output_tokens
    # The step loop (docs/mock-gpu.md, "The step clock"). vLLM's `max-num-batched-tokens`: the token budget
    # of one step (decodes first, then prefill chunks); 8 192 is vLLM's default for its OpenAI server on a
    # GPU of >= 70 GiB (vllm/engine/arg_utils.py).
    max_num_batched_tokens: int = 8192
    step_overhead_ms: float = 0.0  # host time per step on top of the kernels (scheduling, sampling, launch)
    # Decode is memory-bound: each step reads every decoding sequence's KV (KV bytes/token ÷ HBM bandwidth).
    kv_read_time_per_token_ms: float = 0.0
    # Speculative decoding: k draft tokens, each accepted with probability α until the first rejection.
    spec_tokens: int = 0
    spec_acceptance: float = 0.0
    # A suspended sequence's pinned blocks become evictable once idle this long (the providers' prompt-cache
    # lifetime: OpenAI "5 to 10 minutes of inactivity", Anthropic 5 minutes by default).
    kv_idle_ttl_s: float = 300.0
    # A measured step profile (``sampler/profiles/<name>.json``, read by ``sampler.steptables``); None: the
    # analytic step cost of the knobs above (``sampler.steps``).
    step_profile: str | None = None
    # Provenance, not a knob: overrides keep it (``GET /v1/models`` shows which knobs were overridden).
    calibration: Calibration | None = dataclasses.field(default=None, compare=False)

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
        if self.max_num_batched_tokens < 1:
            problems.append("max-num-batched-tokens must be >= 1")
        if min(self.step_overhead_ms, self.kv_read_time_per_token_ms) < 0:
            problems.append("step-overhead and kv-read-time-per-token must be >= 0")
        if self.spec_tokens < 0 or not 0 <= self.spec_acceptance < 1:
            problems.append("spec-tokens must be >= 0 and spec-acceptance within [0, 1)")
        if self.kv_idle_ttl_s <= 0:
            problems.append("kv-idle-ttl must be > 0")
        if problems:
            raise ValueError(f"model {self.name!r}: " + "; ".join(problems))

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a decode step emits per sequence (1 without speculative decoding)."""
        return spec_tokens_mean(self.spec_tokens, self.spec_acceptance)

    @property
    def tokens_per_s(self) -> float:
        """A lone sequence's mean decode speed: tokens per step over the inter-token latency (a step)."""
        return self.tokens_per_step * 1000.0 / self.inter_token_latency_ms

    @property
    def dispatch_ms(self) -> float:
        """The per-request cost before a turn's first prefill chunk (it holds its batch slot meanwhile, but
        no GPU time): ``prefill-overhead``, or ``time-to-first-token`` when prefill is constant."""
        return self.time_to_first_token_ms if self.constant_prefill else self.prefill_overhead_ms

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
    def limits(self) -> ModelLimits:
        bound_by = (
            "max-model-len"
            if self.max_model_len <= self.kv_tokens
            else "the KV cache: kv-cache-size x block-size"
        )
        return ModelLimits(self.context_window, self.max_output_tokens, bound_by)

    @property
    def constant_prefill(self) -> bool:
        return self.prefill_overhead_ms == 0 and self.prefill_time_per_token_ms == 0

    def public(self) -> dict[str, object]:
        out: dict[str, object] = {key: getattr(self, field) for key, field in _PUBLIC_NAMES.items()}
        out["tokens-per-second"] = self.tokens_per_s
        if self.step_profile is not None:
            out["step-profile"] = self.step_profile
        return out

    def provenance(self) -> dict[str, object]:
        """For the model object (``GET /v1/models``): the hardware class and a source per knob, and which
        knobs
        a ``--model-override`` changed from the catalogue's (their sources no longer apply)."""
        base = MODELS.get(self.name)
        settings = self.public()
        overridden = sorted(k for k, v in settings.items() if base is not None and base.public().get(k) != v)
        return {
            "calibration": self.calibration.public() if self.calibration is not None else None,
            "overridden": overridden,
        }

    def override(self, **changes: Any) -> ModelSpec:
        """A copy with some knobs changed. Accepts field names, llm-d's hyphenated names, and
        ``tokens_per_s`` / ``tokens-per-second`` (converted to the inter-token latency)."""
        fields: dict[str, Any] = {}
        speed: float | None = None
        for key, value in changes.items():
            if key in ("tokens_per_s", "tokens-per-second"):
                speed = float(value)
            else:
                fields[_PUBLIC_NAMES.get(key, key.replace("-", "_"))] = value
        spec = dataclasses.replace(self, **fields)
        if speed is None:
            return spec
        # A speed is a step: the inter-token latency at which a lone sequence gets it (tokens per step
        # included, so a speculative model keeps its acceptance).
        return dataclasses.replace(spec, inter_token_latency_ms=1000.0 * spec.tokens_per_step / speed)


# Not calibrated for any class (the lab's sessions are far from either bound; documented once here):
# vLLM's default batch bound, a full batch decoding 2x slower than a lone sequence (a single session
# always gets exactly the named speed), and ~60 GB of KV on an 80 GB GPU at 128 KiB/token (Llama-3-8B:
# 32 layers x 8 KV heads x 128 x 2 x fp16) = 480 k tokens = 30 000 blocks of 16.
_BATCH_SOURCE = {
    "max-num-seqs": "vLLM's default max_num_seqs (256); not calibrated",
    "time-factor-under-load": "llm-d's formula with f = 2 (a decode step of a full batch costs twice a lone "
    "sequence's); plausible, not measured",
    "kv-cache-size": "~60 GB of KV at 128 KiB/token (Llama-3-8B shape) = 30 000 blocks of 16; not calibrated",
    "max-model-len": "128 k, Llama-3.1-8B's window served whole (its model card; Scaleway's generative-APIs "
    "table); not calibrated per class",
    "max-output-tokens": "16 384 (Scaleway's generative-APIs table, llama-3.1-8b-instruct); not calibrated "
    "per class",
    "max-num-batched-tokens": "vLLM's default for its OpenAI server on a GPU of >= 70 GiB: 8 192 "
    "(vllm/engine/arg_utils.py)",
    "step-overhead": "0: the class's cited decode figure is a whole step as a client sees it, host time "
    "included",
    "kv-idle-ttl": "300 s: OpenAI's prompt-caching guide ('cached prefixes generally remain active for 5 to "
    "10 minutes of inactivity'), Anthropic's prompt caching (5-minute lifetime by default)",
    "spec-tokens": "0: no speculative decoding",
}
_LLMD = (
    "llm-d-inference-sim latency profiles, 8B on H100: 30 ms + 250 us per uncached prompt token, "
    "12 ms per output token"
)
_CEREBRAS = (
    "Cerebras Llama-3.3-70B, third-party benchmark README (run 2025-03-01, concurrency 1): server "
    "prompt_time "
    "2-4 ms for 40-66 input tokens, 0.07-0.12 s for 1.7-3.1 k; the least-squares line through both groups "
    "is ~1 ms + ~39 us/token"
)
_SEED = (
    "OpenAI, 'Speeding up agentic workflows with WebSockets in the Responses API' (2026-04-22): "
    "65 -> 1 000 tokens/s, bursts to 4 000"
)
# Decode reads each sequence's KV once a step: KV bytes per token ÷ HBM bandwidth.
_KV_70B_H200_TP8 = (
    "Llama-3-70B's KV shape (80 layers x 8 KV heads x 128 x 2 x fp16 = 320 KiB/token) read at 8 x 4.8 TB/s "
    "(H200 HBM3e, NVIDIA's datasheet, TP8) = 8.5 ns/token; a lower bound for a frontier model, not measured"
)
_KV_8B_H100 = (
    "Llama-3-8B's KV shape (128 KiB/token) read at 3.35 TB/s (H100 SXM HBM3, NVIDIA's datasheet) = "
    "39 ns/token; aiconfigurator-core 0.12.0's H200 8B TP1 decode at batch 32 (9.2 ms at 4 k, 130 ms at "
    "128 k context) implies 30 ns/token at 4.8 TB/s, the same bandwidth bound"
)
_KV_WAFER = (
    "Cerebras CS-3's on-wafer SRAM (21 PB/s, Cerebras' product page) at Llama-3-70B's 320 KiB/token = "
    "0.016 ns/token: negligible; not measured"
)
# The seed's 4 000 tok/s bursts as speculative decoding on the wafer's 1 ms step: k = 4 draft tokens and
# the acceptance for which (1 - a^5)/(1 - a) = 4 tokens a step.
_SPEC_K = 4
_SPEC_ACCEPTANCE = 0.8881796676


def _model(
    name: str,
    tokens_per_s: float,
    overhead_ms: float,
    per_token_ms: float,
    kv_read_ms: float,
    calibration: Calibration,
    spec: tuple[int, float] = (0, 0.0),
) -> ModelSpec:
    return ModelSpec(
        name=name,
        time_to_first_token_ms=overhead_ms,
        prefill_overhead_ms=overhead_ms,
        prefill_time_per_token_ms=per_token_ms,
        inter_token_latency_ms=spec_tokens_mean(*spec) * 1000.0 / tokens_per_s,
        max_num_seqs=256,
        time_factor_under_load=2.0,
        kv_cache_size=30_000,
        kv_read_time_per_token_ms=kv_read_ms,
        spec_tokens=spec[0],
        spec_acceptance=spec[1],
        calibration=calibration,
    )


_WAFER = Calibration(
    hardware="wafer-scale (Cerebras CS-3 class): the seed's 1 000 tokens/s model",
    sources={
        **_BATCH_SOURCE,
        "prefill-overhead": _CEREBRAS + " -> 1 ms (per request, before its first chunk)",
        "prefill-time-per-token": _CEREBRAS + " -> 0.039 ms of step per prefill token (25 600 tokens/s "
        "of prefill compute, shared by every prefilling sequence)",
        "inter-token-latency": _SEED
        + " -> 1 ms (the sustained speed; the benchmark's own decode was 1 723-2 535 tokens/s)",
        "kv-read-time-per-token": _KV_WAFER,
    },
)
_WAFER_BURST = Calibration(
    hardware="wafer-scale (Cerebras CS-3 class), speculative decoding: the seed's 4 000 tokens/s bursts",
    sources={
        **_WAFER.sources,
        "inter-token-latency": _SEED + " -> 1 ms: the wafer's step, as mock-1000tps (same hardware, same "
        "prefill)",
        "spec-tokens": "4 draft tokens (a common EAGLE/draft-model setting, vLLM's num_speculative_tokens); "
        "chosen, not measured",
        "spec-acceptance": _SEED + " -> 0.888: the acceptance at which 4 draft tokens give 4 tokens a step "
        "on average ((1 - a^5)/(1 - a) = 4), so a step emits 1 to 5 tokens and the mean is the seed's "
        "4 000 tokens/s; chosen to match, not measured",
    },
)
_GPU_FRONTIER = Calibration(
    hardware="GPU-served frontier model (H100/H200 class, tensor-parallel): the seed's 65 tokens/s starting "
    "point",
    sources={
        **_BATCH_SOURCE,
        "prefill-overhead": "llm-d-inference-sim latency profiles, 70B TP8 on H100: 80 ms fixed prefill cost "
        "-> 80 ms (per request, before its first chunk)",
        "prefill-time-per-token": (
            "0xmmo, 'Small Model Forensics' (2026-05-13): OpenAI gpt-5.4-mini TTFT 233 / 349 / 779 / "
            "1 376 ms at < 1 KB / 16 k / 64 k / 150 k input tokens = 7.3-8.5 us per marginal token "
            "on OpenAI's GPU fleet -> 0.0085 ms of step per prefill token (the upper end: a frontier model "
            "is not faster per token than its mini sibling; a client-side slope, so it includes the API's "
            "own per-token work)"
        ),
        "inter-token-latency": _SEED + " -> 15.385 ms (65 tokens/s)",
        "kv-read-time-per-token": _KV_70B_H200_TP8,
    },
)
_H100_8B = Calibration(
    hardware="llm-d's 8B-on-H100 profile (the lab's first profile for every model)",
    sources={
        **_BATCH_SOURCE,
        "prefill-overhead": _LLMD,
        "prefill-time-per-token": _LLMD + " (a per-request latency slope, taken as step time per token: "
        "4 000 tokens/s of prefill, pessimistic for an H100)",
        "inter-token-latency": _LLMD,
        "kv-read-time-per-token": _KV_8B_H100,
    },
)


# The calibrated classes: a measured step profile each (``sampler/profiles/<profile>.json``, docs/mock-gpu.md,
# "Step tables"). Their knobs are the profile's ``knobs`` section, read here when the catalogue is built;
# the step loop times every step from the profile's tables, so the per-sequence figures below (a lone
# decode's step, a full chunk's per-token time) are the tables' summary for ``GET /v1/models``, the lab's
# sweeps and its predictor, not what the mock runs on.
_CALIBRATED_KNOBS = {  # llm-d name -> the profile's knob
    "step-overhead": "step-overhead",
    "prefill-overhead": "prefill-dispatch",
    "max-num-batched-tokens": "max-num-batched-tokens",
    "max-num-seqs": "max-num-seqs",
    "kv-cache-size": "kv-cache-size",
    "block-size": "block-size",
}
_SUMMARY_CONTEXT = 1024  # the context of the lone decode whose step is the class's inter-token latency
_SUMMARY_CHUNK = 8192  # the chunk whose per-token time is the class's prefill-time-per-token


def _calibrated(name: str, profile: str) -> ModelSpec:
    tables = StepTables.load(profile)
    p = tables.provenance
    where = f"sampler/profiles/{profile}.json"
    measured = (
        f"{p['package']} (system {p['system']}, backend {p['backend']} {p['backend_version']}, model "
        f"{p['model']} {p['quant']}, TP{p['tp']}): measured kernel step tables, {where}"
    )
    overhead = tables.knob("step-overhead")
    lone = overhead + tables.step_ms([], [_SUMMARY_CONTEXT])
    seqs = int(tables.knob("max-num-seqs"))
    # llm-d's load factor (the analytic predictor's), f so that 256 decodes step as the tables say.
    full = overhead + tables.step_ms([], [_SUMMARY_CONTEXT] * 256)
    factor = 1.0 + (full / lone - 1.0) * (seqs - 1) / 255.0
    sources = {
        **_BATCH_SOURCE,
        **{
            ours: f"{where} knobs: {tables.knobs[theirs]['source']}"
            for ours, theirs in _CALIBRATED_KNOBS.items()
        },
        "step-profile": measured,
        "inter-token-latency": f"{measured} -> a lone decode's step at {_SUMMARY_CONTEXT} tokens of context, "
        "step-overhead included (a summary: every step is timed from the tables)",
        "prefill-time-per-token": f"{measured} -> one {_SUMMARY_CHUNK}-token chunk's step over its tokens "
        "(a summary: every chunk is timed from the tables, with the context it attends to)",
        "time-factor-under-load": f"{measured} -> 256 decodes' step over a lone decode's (a summary for the "
        "analytic predictor)",
        "kv-read-time-per-token": "0: decode attention, KV reads included, is in the profile's decode table",
        "spec-acceptance": f"{where} knobs: {tables.knobs['spec-acceptance']['source']}",
    }
    dispatch = tables.knob("prefill-dispatch")
    return ModelSpec(
        name=name,
        time_to_first_token_ms=dispatch,
        prefill_overhead_ms=dispatch,
        prefill_time_per_token_ms=tables.step_ms([(_SUMMARY_CHUNK, 0)], []) / _SUMMARY_CHUNK,
        inter_token_latency_ms=lone,
        max_num_seqs=seqs,
        time_factor_under_load=factor,
        kv_cache_size=int(tables.knob("kv-cache-size")),
        block_size=int(tables.knob("block-size")),
        max_num_batched_tokens=int(tables.knob("max-num-batched-tokens")),
        step_overhead_ms=overhead,
        step_profile=profile,
        calibration=Calibration(hardware=str(p["hardware"]), sources=sources),
    )


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _model("mock-65tps", 65.0, 80.0, 0.0085, 8.5e-6, _GPU_FRONTIER),
        _model("mock-1000tps", 1000.0, 1.0, 0.039, 1.6e-8, _WAFER),
        _model("mock-4000tps", 4000.0, 1.0, 0.039, 1.6e-8, _WAFER_BURST, (_SPEC_K, _SPEC_ACCEPTANCE)),
        _model("mock-h100-8b", 1000.0 / 12.0, 30.0, 0.25, 3.9e-5, _H100_8B),
        _calibrated("mock-h200-llama8b", "h200-llama3.1-8b-tp1-vllm"),
        _calibrated("mock-h200-llama70b", "h200-llama3.1-70b-tp8-vllm"),
        _calibrated("mock-h200-llama70b-tp4", "h200-llama3.1-70b-tp4-vllm"),
        _calibrated("mock-h100-llama70b-fp8", "h100-llama3.1-70b-fp8-tp2-vllm"),
    )
}


def resolve_model(name: str) -> ModelSpec:
    """The model called ``name``; KeyError (naming the known ones) when there is none."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
