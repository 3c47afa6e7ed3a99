"""Generate ``sampler/profiles/<profile>.json``: one GPU profile's step tables, from the measured kernels of
NVIDIA's AIConfigurator (``aiconfigurator-core`` 0.12.0, Apache-2.0, on PyPI).

    make step-tables                                   # its own venv (.venv-aic), then this script
    .venv-aic/bin/python scripts/gen_step_tables.py            # rewrite every profile
    .venv-aic/bin/python scripts/gen_step_tables.py --check    # exit 1 when a committed profile differs
    .venv-aic/bin/python scripts/gen_step_tables.py --validate # the evaluator against direct package calls

The package is not a dependency of the lab (it brings pandas, pyarrow and scipy, ~600 MB): the tables are
committed and ``sampler/steptables.py`` reads them with the standard library. docs/mock-gpu.md, "Step
tables", says what each table is and how far the evaluator is from the package.

Each profile holds three tables, evaluated on the package's ``EngineHandle`` at its own measured grid
points (the knots), so that interpolating between knots reproduces the package's own interpolation:

* ``nonattn``: the step's cost outside attention (GEMMs, norms, all-reduce, logits) by the tokens in the
  step. Knots: the GEMM table's ``m`` values (its tile steps: 32/33, 48/49, …) and, for TP > 1, the token
  counts where the all-reduce message hits one of its measured sizes.
* ``prefill``: the attention of one prefill chunk, by the chunk's tokens × the tokens already in KV.
  Knots: the context-attention table's sequence lengths on both axes, then prefixes up to 128 k (the
  package measured up to 16 k and extrapolates past it).
* ``decode``: the attention of a decode step, by batch size × context. Knots: the generation-attention
  table's batch sizes and its context steps (2^k).

``knobs``: what the package does not give, each with its source (docs/mock-gpu.md, "Step tables").
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "sampler" / "profiles"
PACKAGE = "aiconfigurator-core"
PACKAGE_VERSION = "0.12.0"

# vLLM's engine arguments for an OpenAI API server on a >= 70 GiB GPU that is not an A100 (H100, H200):
# vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults; gpu_memory_utilization and block_size are
# vLLM's CacheConfig defaults.
VLLM_DEFAULTS_SOURCE = (
    "vLLM EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py): on a GPU with >= 70 GiB that is not an "
    "A100, an OpenAI API server defaults to max_num_batched_tokens 8192 and max_num_seqs 1024"
)
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 1024
GPU_MEMORY_UTILIZATION = 0.9
BLOCK_SIZE = 16

# vLLM's H200 CI latency runs (buildkite vllm/performance-benchmark, build 9513): batch 8, 32 input and 128
# output tokens, end-to-end 834.059 ms on Llama-3.1-8B TP1 and 2075.08 ms on Llama-3-70B TP4
# (sampler/profiles/published/vllm_ci_latency.json). The host overhead per step is what is left once the
# kernels (these tables) are taken out: (latency - prefill - sum of decode steps) / 128.
CI_SOURCE = (
    "vLLM CI latency runs on H200 (buildkite.com/vllm/performance-benchmark/builds/9513: batch 8, 32 in, "
    "128 out; 834.059 ms 8B TP1, 2075.08 ms 70B TP4) minus this profile's kernel sum, per step"
)


@dataclass(frozen=True)
class Profile:
    name: str
    model: str  # the package's bundled model config (HF id)
    system: str  # the package's system name
    backend: str
    tp: int
    hardware: str  # in words, for /v1/models
    # The vLLM CI latency run (ms) this profile's host overhead is fitted to, or the name of the profile
    # whose fitted overhead it carries (no published run of its own).
    overhead_from: float | str
    ci_note: str


PROFILES = (
    Profile(
        "h200-llama3.1-8b-tp1-vllm",
        "meta-llama/Meta-Llama-3.1-8B",
        "h200_sxm",
        "vllm",
        1,
        "1 x H200 SXM 141 GB, Llama-3.1-8B BF16, TP1, vLLM",
        834.059,
        "8B TP1",
    ),
    Profile(
        "h200-llama3.1-70b-tp8-vllm",
        "meta-llama/Meta-Llama-3.1-70B",
        "h200_sxm",
        "vllm",
        8,
        "8 x H200 SXM 141 GB, Llama-3.1-70B BF16, TP8, vLLM",
        "h200-llama3.1-70b-tp4-vllm",
        "70B TP4, carried over (the CI runs 70B on TP4 only)",
    ),
    Profile(
        "h200-llama3.1-70b-tp4-vllm",
        "meta-llama/Meta-Llama-3.1-70B",
        "h200_sxm",
        "vllm",
        4,
        "4 x H200 SXM 141 GB, Llama-3.1-70B BF16, TP4, vLLM",
        2075.08,
        "70B TP4",
    ),
    Profile(
        "h100-llama3.1-70b-fp8-tp2-vllm",
        "nvidia/Llama-3.1-70B-Instruct-FP8",
        "h100_sxm",
        "vllm",
        2,
        "2 x H100 SXM 80 GB, Llama-3.1-70B FP8, TP2, vLLM",
        "h200-llama3.1-70b-tp4-vllm",
        "70B TP4 on H200, carried over (no published H100 FP8 TP2 CI run)",
    ),
)

# Knot grids beyond the package's measured ones: decode and prefix contexts up to Llama-3.1's 128 k window.
MAX_TOKENS = 16384  # the non-attention table's range (twice vLLM's default token budget)
MAX_BATCH = 2048  # the decode table's range in batch size (twice vLLM's default max-num-seqs)
CONTEXT_KNOTS = [1 << k for k in range(18)]  # 1 … 131 072: the generation table's steps are 2^k - 1
PREFIX_EXTRA = list(range(16384 + 8192, 131072 + 1, 8192))  # past the measured 16 k, every 8 k
ROUND = 6  # decimals of a millisecond kept (1 ns): far below the interpolation error


def _engine(p: Profile) -> Any:
    from aiconfigurator_core.sdk.engine import EngineHandle

    logging.disable(logging.WARNING)  # the package logs each low-fidelity fallback table it loads
    return EngineHandle.compile(p.model, p.system, p.backend, tp_size=p.tp)


def _data_dir(p: Profile) -> Path:
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "data" / p.system


def _version_dir(root: Path) -> Path:
    """The newest collected version under ``root`` (the package's ``current`` for vLLM is 0.24.0)."""
    from packaging.version import Version

    return max((d for d in root.iterdir() if d.is_dir()), key=lambda d: Version(d.name))


def _grids(p: Profile) -> dict[str, list[int]]:
    """The package's measured grid points for this profile's kernels."""
    import pandas as pd

    data = _data_dir(p)
    gemm = pd.read_parquet(_version_dir(data / "gemm" / p.backend) / "gemm_perf.parquet", columns=["m"])
    ctx = pd.read_parquet(
        _version_dir(data / "attention" / p.backend) / "context_attention_perf.parquet", columns=["isl"]
    )
    gen = pd.read_parquet(
        _version_dir(data / "attention" / p.backend) / "generation_attention_perf.parquet",
        columns=["batch_size"],
    )
    tokens = {int(m) for m in gemm["m"].unique() if m <= MAX_TOKENS}
    if p.tp > 1:
        hidden = _hf_config(p)["hidden_size"]
        ar = pd.read_parquet(
            _version_dir(data / "comm" / p.backend) / "custom_allreduce_perf.parquet",
            columns=["message_size"],
        )
        for size in ar["message_size"].unique():
            t = int(size) // (hidden * 2)  # BF16 activations: 2 bytes per element
            if 1 <= t <= MAX_TOKENS:
                tokens.add(t)
    tokens.add(MAX_TOKENS)
    seq = sorted(int(s) for s in ctx["isl"].unique())
    return {
        "tokens": sorted(tokens),
        "chunk": seq,
        "prefix": sorted({0, *seq, *PREFIX_EXTRA}),
        # the generation table's batch sizes, and the GEMM tile steps below its largest (a decode step's
        # GEMMs run at m = batch)
        "batch": sorted({int(b) for b in gen["batch_size"].unique()} | {t for t in tokens if t <= MAX_BATCH}),
        "context": CONTEXT_KNOTS,
    }


def _hf_config(p: Profile) -> dict[str, Any]:
    """The package's bundled config.json, with its ModelOpt quantisation (``hf_quant_config.json``) under
    ``"quantization"`` when the checkpoint has one."""
    import aiconfigurator_core

    base = Path(aiconfigurator_core.__file__).parent / "model_configs" / p.model.replace("/", "--")
    config = dict(json.loads(Path(f"{base}_config.json").read_text()))
    quant = Path(f"{base}_hf_quant_config.json")
    if quant.exists():
        config["quantization"] = json.loads(quant.read_text())["quantization"]
    return config


def _quant(hf: dict[str, Any]) -> tuple[str, int, int]:
    """(name, bytes per weight outside the embedding and LM head, bytes per KV element)."""
    q = hf.get("quantization", {})
    weights = str(q.get("quant_algo", hf.get("torch_dtype", "bfloat16")))
    kv = q.get("kv_cache_quant_algo")
    name = weights if kv is None else f"{weights} weights, {kv} KV cache"
    return name, 1 if weights == "FP8" else 2, 1 if kv == "FP8" else 2


def _decode_attention(h: Any, batch: int, ctx: int) -> float:
    """The decode step less the non-attention table at its token count: the attention, plus what the
    decodes cost beyond a prefill of as many tokens (each decode's logits row: up to 1.4 ms at batch 1024)."""
    return float(h.decode_step_latency(batch, ctx, 2)) - _nonattn(h, batch)


def _nonattn(h: Any, tokens: int) -> float:
    return float(h.mixed_step_breakdown(tokens, 0, tokens, 1, 0)[1])


def _prefill_attention(h: Any, chunk: int, prefix: int, nonattn: float) -> float:
    return float(h.predict_prefill_latency(1, prefix + chunk, prefix)) - nonattn


def _weights_bytes_per_gpu(p: Profile, hf: dict[str, Any]) -> float:
    """Llama's parameters from its config.json, at the checkpoint's width (FP8 checkpoints keep the
    embedding and the LM head in BF16), split over TP."""
    h, inter, vocab, layers = (
        hf["hidden_size"],
        hf["intermediate_size"],
        hf["vocab_size"],
        hf["num_hidden_layers"],
    )
    head_dim = hf.get("head_dim") or h // hf["num_attention_heads"]
    kv = hf["num_key_value_heads"] * head_dim
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter
    body_bytes = _quant(hf)[1]
    return (layers * per_layer * body_bytes + 2 * vocab * h * 2) / p.tp


def _kv(p: Profile, hf: dict[str, Any]) -> tuple[int, str]:
    """KV blocks of 16 per GPU with vLLM's defaults: GPU memory x gpu-memory-utilization, less the weights
    and the package's own reserve for activations and runtime (its system file's ``other_mem``)."""
    import aiconfigurator_core
    import yaml

    spec = yaml.safe_load(
        (Path(aiconfigurator_core.__file__).parent / "systems" / f"{p.system}.yaml").read_text()
    )
    capacity = float(spec["gpu"]["mem_capacity"])
    reserve = float(spec["misc"]["other_mem"]) if "misc" in spec else 3.5 * 2**30
    weights = _weights_bytes_per_gpu(p, hf)
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    kv_heads = max(1, hf["num_key_value_heads"] // p.tp)
    kv_bytes = _quant(hf)[2]
    per_token = 2 * hf["num_hidden_layers"] * kv_heads * head_dim * kv_bytes  # K and V
    budget = capacity * GPU_MEMORY_UTILIZATION - weights - reserve
    blocks = int(budget // (per_token * BLOCK_SIZE))
    gib = 2**30
    source = (
        f"vLLM's budget: {capacity / gib:.1f} GiB ({p.system}, aiconfigurator-core's system file) x "
        f"gpu-memory-utilization {GPU_MEMORY_UTILIZATION} - {weights / gib:.1f} GiB of weights per GPU "
        f"(config.json's shapes, /TP{p.tp}) - {reserve / gib:.1f} GiB for activations and runtime (the "
        f"package's other_mem) = {budget / gib:.1f} GiB, over {per_token} bytes per token per GPU "
        f"(K and V x {hf['num_hidden_layers']} layers x {kv_heads} KV heads x {head_dim} x {kv_bytes} bytes) "
        f"-> {blocks} blocks of {BLOCK_SIZE} ({blocks * BLOCK_SIZE} tokens)"
    )
    return blocks, source


def _ci_overhead(p: Profile, tables: dict[str, Any]) -> float:
    """Host overhead per step implied by the vLLM CI latency run (batch 8, 32 in, 128 out)."""
    sys.path.insert(0, str(ROOT))
    from sampler.steptables import StepTables

    st = StepTables.from_dict(tables)
    kernels = st.step_ms([(32, 0)] * 8, [])  # the prefill step (its first token)
    kernels += sum(st.step_ms([], [32 + i] * 8) for i in range(1, 128))
    assert isinstance(p.overhead_from, float)
    return (p.overhead_from - kernels) / 128.0


_OVERHEADS: dict[
    str, float
] = {}  # profile -> fitted host overhead (ms per step), for the profiles that carry it


def build(p: Profile) -> dict[str, Any]:
    """The profile's tables and knobs, as committed."""
    tables = build_tables(p)
    tables["knobs"] = _knobs(p, tables)
    return tables


def build_tables(p: Profile) -> dict[str, Any]:
    h = _engine(p)
    hf = _hf_config(p)
    g = _grids(p)
    nonattn = [round(_nonattn(h, t), ROUND) for t in g["tokens"]]
    na = dict(zip(g["tokens"], nonattn, strict=True))
    pre = []
    for c in g["chunk"]:
        base = na[c] if c in na else _nonattn(h, c)
        pre.append([round(_prefill_attention(h, c, q, base), ROUND) for q in g["prefix"]])
    dec = [[round(_decode_attention(h, b, x), ROUND) for x in g["context"]] for b in g["batch"]]
    backend_version = _version_dir(_data_dir(p) / "gemm" / p.backend).name
    quant = _quant(hf)[0]
    tables: dict[str, Any] = {
        "profile": p.name,
        "provenance": {
            "package": f"{PACKAGE} {PACKAGE_VERSION}",
            "system": p.system,
            "hardware": p.hardware,
            "backend": p.backend,
            "backend_version": backend_version,
            "model": p.model,
            "quant": str(quant),
            "tp": p.tp,
            "grid": {k: f"{len(v)} knots, {v[0]}..{v[-1]}" for k, v in g.items()},
            "calls": "nonattn: EngineHandle.mixed_step_breakdown(T, 0, T, 1)[shared non-attention]; "
            "prefill: predict_prefill_latency(1, prefix + chunk, prefix) - nonattn(chunk); "
            "decode: decode_step_latency(batch, context, 2) - nonattn(batch)",
        },
        "nonattn": {"tokens": g["tokens"], "ms": nonattn},
        "prefill": {"chunk": g["chunk"], "prefix": g["prefix"], "ms": pre},
        "decode": {"batch": g["batch"], "context": g["context"], "ms": dec},
    }
    return tables


def _knobs(p: Profile, tables: dict[str, Any]) -> dict[str, dict[str, object]]:
    hf = _hf_config(p)
    blocks, kv_source = _kv(p, hf)
    if isinstance(p.overhead_from, str):
        overhead = _OVERHEADS.get(p.overhead_from)
        if overhead is None:
            donor = next(q for q in PROFILES if q.name == p.overhead_from)
            overhead = _OVERHEADS[donor.name] = round(_ci_overhead(donor, build_tables(donor)), 3)
    else:
        overhead = _OVERHEADS[p.name] = round(_ci_overhead(p, tables), 3)
    knobs: dict[str, dict[str, object]] = {
        "step-overhead": {
            "value": overhead,
            "unit": "ms per engine step",
            "source": f"{CI_SOURCE}: fitted on {p.ci_note}",
        },
        "prefill-dispatch": {
            "value": 0.0,
            "unit": "ms per request entering prefill",
            "source": "not separable in the published runs (the CI latency run's one prefill step is inside "
            "the per-step fit); 0 until a run with many short prefills is replayed",
        },
        "max-num-batched-tokens": {
            "value": MAX_NUM_BATCHED_TOKENS,
            "unit": "tokens",
            "source": VLLM_DEFAULTS_SOURCE,
        },
        "max-num-seqs": {"value": MAX_NUM_SEQS, "unit": "sequences", "source": VLLM_DEFAULTS_SOURCE},
        "gpu-memory-utilization": {
            "value": GPU_MEMORY_UTILIZATION,
            "unit": "fraction",
            "source": "vLLM CacheConfig default gpu_memory_utilization 0.9",
        },
        "block-size": {
            "value": BLOCK_SIZE,
            "unit": "tokens",
            "source": "vLLM CacheConfig default block_size 16",
        },
        "kv-cache-size": {"value": blocks, "unit": "blocks", "source": kv_source},
        "spec-acceptance": {
            "value": 0.0,
            "unit": "mean accepted draft tokens per step",
            "source": "off: vLLM serves without speculative decoding unless asked (--speculative-config)",
        },
    }
    return knobs


def render(tables: dict[str, Any]) -> str:
    return json.dumps(tables, indent=1, sort_keys=False) + "\n"


def validate(p: Profile, samples: int = 300, seed: int = 0) -> dict[str, float]:
    """Max relative error of ``StepTables.step_ms`` against direct package calls, off the knots."""
    sys.path.insert(0, str(ROOT))
    from sampler.steptables import StepTables

    st = StepTables.load(p.name)
    h = _engine(p)
    rng = random.Random(seed)
    errs: dict[str, float] = {"prefill": 0.0, "decode": 0.0, "mixed": 0.0}
    for _ in range(samples):
        c = rng.randint(16, MAX_NUM_BATCHED_TOKENS)
        q = rng.choice([0, rng.randint(1, 16384), rng.randint(16384, 120000)])
        want = h.predict_prefill_latency(1, q + c, q)
        errs["prefill"] = max(errs["prefill"], abs(st.step_ms([(c, q)], []) / want - 1))
        b = rng.randint(1, MAX_NUM_SEQS)
        x = rng.randint(64, 120000)
        want = h.decode_step_latency(b, x, 2)
        errs["decode"] = max(errs["decode"], abs(st.step_ms([], [x] * b) / want - 1))
        c = rng.randint(16, 4096)
        b = rng.randint(1, 256)
        # The package's mixed step: a fresh c-token prompt prefilled whole beside b decodes, whose context
        # it takes to be the same c.
        want = h.mixed_step_latency(c, b, c, 2, 0)
        got = st.step_ms([(c, 0)], [c] * b)
        errs["mixed"] = max(errs["mixed"], abs(got / want - 1))
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed profile differs")
    ap.add_argument("--validate", action="store_true", help="max error of the evaluator vs the package")
    ap.add_argument("--profile", action="append", help="only these profiles")
    args = ap.parse_args()
    chosen = [p for p in PROFILES if not args.profile or p.name in args.profile]
    if args.validate:
        for p in chosen:
            errs = validate(p)
            print(p.name, " ".join(f"{k} {v * 100:.2f} %" for k, v in errs.items()))
        return 0
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for p in chosen:
        text = render(build(p))
        path = OUT / f"{p.name}.json"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)} ({len(text)} bytes)")
    if stale:
        print("stale: " + ", ".join(stale) + " (run scripts/gen_step_tables.py and review)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
