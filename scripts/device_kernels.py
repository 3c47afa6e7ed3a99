"""Time a GPU profile's own shapes on a real chip with PyTorch, and compare them with the committed step
tables (docs/mock-gpu.md, "On a real GPU").

    python scripts/device_kernels.py --out kernels.json             # on the GPU: ~5 min on an H200
    python scripts/device_kernels.py --compare kernels.json         # anywhere: the table vs the chip
    python scripts/device_kernels.py --tiny --device cpu --out x.json   # the test's shapes, on a CPU

Random weights, no network, no vLLM. For the profile's model (Llama-3.1-8B by default: 32 layers, hidden
4096, 32 query / 8 KV heads of 128, MLP 14336, vocab 128256), one layer's GEMMs (QKV, O, gate+up, down)
are timed at each step token count and scaled by the layer count, plus the LM head at one row per
sequence; attention is ``scaled_dot_product_attention`` (grouped-query) for a prefill chunk after a prefix
(the chunk's queries over the prefix's keys, then causal over its own) and for a decode batch (one query
per sequence over its context, dense KV, not vLLM's paged kernel), scaled by the layer count. Norms,
activations, rotary and sampling are not timed (the tables' non-attention part includes them: expect the
chip's GEMM sum a few per cent under the table).

torch is imported only when timing; the comparison needs the standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sampler.steptables import StepTables  # noqa: E402

PROFILE = "h200-llama3.1-8b-tp1-vllm"


@dataclass(frozen=True)
class Shapes:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    tokens: tuple[int, ...]  # step token counts for the GEMMs
    chunks: tuple[int, ...]  # prefill chunk sizes
    prefixes: tuple[int, ...]  # tokens already in KV before a chunk
    batches: tuple[int, ...]  # decode batch sizes
    contexts: tuple[int, ...]  # decode contexts


LLAMA_8B = Shapes(
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    mlp=14336,
    vocab=128256,
    tokens=(1, 8, 32, 33, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
    chunks=(512, 2048, 8192),
    prefixes=(0, 4096, 16384, 65536),
    batches=(1, 8, 32, 128, 256),
    contexts=(1024, 8192, 32768),
)
TINY = Shapes(
    layers=2,
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    mlp=128,
    vocab=256,
    tokens=(1, 16),
    chunks=(8,),
    prefixes=(0, 16),
    batches=(1, 2),
    contexts=(16,),
)


def _timer(torch: Any, device: str, repeats: int) -> Any:
    """ms per call of ``fn``, median of ``repeats`` after a warm-up, with CUDA events on a GPU."""

    def run(fn: Any) -> float:
        fn()
        samples = []
        for _ in range(repeats):
            if device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(float(start.elapsed_time(end)))
            else:
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1000.0)
        samples.sort()
        return samples[len(samples) // 2]

    return run


def measure(s: Shapes, device: str, repeats: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    ms = _timer(torch, device, repeats)
    qkv = rand((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden)
    o = rand(s.hidden, s.heads * s.head_dim)
    up = rand(2 * s.mlp, s.hidden)
    down = rand(s.hidden, s.mlp)
    head = rand(s.vocab, s.hidden)
    gemm: dict[str, float] = {}
    for t in s.tokens:
        x = rand(t, s.hidden)
        a = rand(t, s.heads * s.head_dim)
        m = rand(t, s.mlp)
        layer = ms(
            lambda x=x, a=a, m=m: (F.linear(x, qkv), F.linear(a, o), F.linear(x, up), F.linear(m, down))
        )
        gemm[str(t)] = layer * s.layers
    lm_head: dict[str, float] = {}
    for b in sorted({1, *s.batches}):
        rows = rand(b, s.hidden)
        lm_head[str(b)] = ms(lambda rows=rows: F.linear(rows, head))
    group = s.heads // s.kv_heads

    def kv(batch: int, length: int) -> tuple[Any, Any]:
        return rand(batch, s.kv_heads, length, s.head_dim), rand(batch, s.kv_heads, length, s.head_dim)

    def sdpa(q: Any, k: Any, v: Any, causal: bool) -> Any:
        """Grouped-query attention: the KV heads shared by ``group`` query heads each, unexpanded when this
        torch takes ``enable_gqa`` (2.5+), expanded otherwise."""
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    prefill: dict[str, float] = {}
    for c in s.chunks:
        q = rand(1, s.heads, c, s.head_dim)
        k_new, v_new = kv(1, c)
        for p in s.prefixes:
            # A chunk after a prefix: all prefix keys visible, causal within the chunk. Timed as the two
            # flash-attention calls an engine's kernel amounts to (their log-sum-exp merge is negligible).
            k_old, v_old = kv(1, p) if p else (None, None)

            def chunk(
                q: Any = q, k_old: Any = k_old, v_old: Any = v_old, k_new: Any = k_new, v_new: Any = v_new
            ) -> None:
                if k_old is not None:
                    sdpa(q, k_old, v_old, False)
                sdpa(q, k_new, v_new, True)

            prefill[f"{c},{p}"] = ms(chunk) * s.layers
            del k_old, v_old
        del q, k_new, v_new
    decode: dict[str, float] = {}
    for b in s.batches:
        q = rand(b, s.heads, 1, s.head_dim)
        for x in s.contexts:
            k, v = kv(b, x)
            decode[f"{b},{x}"] = ms(lambda q=q, k=k, v=v: sdpa(q, k, v, False)) * s.layers
            del k, v
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    return {
        "device": name,
        "torch": torch.__version__,
        "dtype": str(dtype),
        "shapes": s.__dict__,
        "gemm_ms": gemm,
        "lm_head_ms": lm_head,
        "prefill_attention_ms": prefill,
        "decode_attention_ms": decode,
    }


def compare(measured: dict[str, Any], profile: str = PROFILE) -> list[tuple[str, str, float, float, float]]:
    """(part, shape, table ms, chip ms, chip / table) for every measured shape. The table's non-attention
    part is compared with the GEMMs plus one LM-head row (a prefill step's logits)."""
    st = StepTables.load(profile)
    rows: list[tuple[str, str, float, float, float]] = []
    head_one = float(measured["lm_head_ms"].get("1", 0.0))
    for t, chip in measured["gemm_ms"].items():
        table = st.nonattn_ms(int(t))
        chip_ms = float(chip) + head_one
        rows.append(("nonattn", f"T={t}", table, chip_ms, chip_ms / table))
    for key, chip in measured["prefill_attention_ms"].items():
        c, p = (int(v) for v in key.split(","))
        table = st.prefill_attention_ms(c, p)
        rows.append(("prefill attention", f"chunk={c} prefix={p}", table, float(chip), float(chip) / table))
    for key, chip in measured["decode_attention_ms"].items():
        b, x = (int(v) for v in key.split(","))
        # the table's decode part holds the decodes' logits beyond one row: the chip's attention plus those
        extra = float(measured["lm_head_ms"].get(str(b), head_one)) - head_one
        table = st.decode_attention_ms(b, float(x))
        chip_ms = float(chip) + extra
        rows.append(("decode attention", f"batch={b} context={x}", table, chip_ms, chip_ms / table))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="time the shapes and write this JSON")
    ap.add_argument("--compare", type=Path, help="print a measured JSON against the profile's tables")
    ap.add_argument("--profile", default=PROFILE)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (tests)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    if args.out:
        t0 = time.perf_counter()
        result = measure(TINY if args.tiny else LLAMA_8B, args.device, args.repeats)
        result["profile"] = args.profile
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out} in {result['wall_s']} s on {result['device']}")
    if args.compare:
        measured = json.loads(args.compare.read_text())
        print(f"{measured['device']} (torch {measured['torch']}) vs sampler/profiles/{args.profile}.json")
        print("| part | shape | table ms | chip ms | chip / table |")
        print("|---|---|---|---|---|")
        for part, shape, table, chip, ratio in compare(measured, args.profile):
            print(f"| {part} | {shape} | {table:.3f} | {chip:.3f} | {ratio:.2f} |")
    if not (args.out or args.compare):
        ap.error("give --out, --compare or both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
