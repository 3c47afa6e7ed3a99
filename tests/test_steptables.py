"""The GPU profiles' step tables (sampler/steptables.py; docs/mock-gpu.md, "Step tables")."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from sampler.steptables import PROFILES_DIR, StepTables, profiles

ROOT = Path(__file__).resolve().parent.parent
H200_8B = "h200-llama3.1-8b-tp1-vllm"
H200_70B = "h200-llama3.1-70b-tp8-vllm"
KNOBS = (
    "step-overhead",
    "prefill-dispatch",
    "max-num-batched-tokens",
    "max-num-seqs",
    "gpu-memory-utilization",
    "block-size",
    "kv-cache-size",
    "spec-acceptance",
)


def test_the_committed_profiles_load_with_provenance_and_a_source_per_knob() -> None:
    names = profiles()
    assert {H200_8B, H200_70B, "h200-llama3.1-70b-tp4-vllm", "h100-llama3.1-70b-fp8-tp2-vllm"} <= set(names)
    for name in names:
        st = StepTables.load(name)
        assert st.name == name
        prov = st.provenance
        assert prov["package"] == "aiconfigurator-core 0.12.0"
        for key in ("system", "backend", "backend_version", "model", "quant", "tp", "grid"):
            assert prov[key], (name, key)
        assert set(KNOBS) <= set(st.knobs)
        for knob, entry in st.knobs.items():
            assert isinstance(entry["source"], str) and len(entry["source"]) > 20, (name, knob)
            st.knob(knob)  # a number
        assert st.knob("kv-cache-size") > 1000
    with pytest.raises(KeyError, match="known: "):
        StepTables.load("h999-nothing")


@pytest.mark.parametrize(
    ("batch", "context", "package_ms"),
    # aiconfigurator-core 0.12.0, EngineHandle.decode_step_latency(32, context, 2) on H200 8B TP1 vLLM.
    [(32, 4096, 9.1696), (32, 32768, 36.3236), (32, 131072, 130.3385)],
)
def test_decode_step_matches_the_package(batch: int, context: int, package_ms: float) -> None:
    st = StepTables.load(H200_8B)
    assert st.step_ms([], [context] * batch) == pytest.approx(package_ms, rel=0.015)


@pytest.mark.parametrize(
    ("prefix", "package_ms"),
    # predict_prefill_latency(1, prefix + 8192, prefix): 100 k is between knots (96 k and 128 k).
    [(0, 198.8718), (32768, 414.0), (100_000, 861.7825)],
)
def test_prefill_chunk_matches_the_package(prefix: int, package_ms: float) -> None:
    st = StepTables.load(H200_8B)
    assert st.step_ms([(8192, prefix)], []) == pytest.approx(package_ms, rel=0.015)


def test_a_step_is_the_sum_of_its_three_parts() -> None:
    st = StepTables.load(H200_70B)
    prefill = [(2048, 0), (1024, 30_000)]
    decodes = [1000, 3000, 5000]
    want = (
        st.nonattn_ms(2048 + 1024 + 3)
        + st.prefill_attention_ms(2048, 0)
        + st.prefill_attention_ms(1024, 30_000)
        + st.decode_attention_ms(3, 3000.0)
    )
    assert st.step_ms(prefill, decodes) == pytest.approx(want, rel=1e-12)
    assert st.step_ms([], []) == 0.0
    assert st.step_ms([(0, 500)], []) == 0.0


def test_the_step_grows_with_what_it_holds() -> None:
    st = StepTables.load(H200_8B)
    # ITL grows with context; a prefill beside the decodes slows them; a chunk after a long prefix costs more.
    itl = [st.step_ms([], [ctx] * 64) for ctx in (1024, 8192, 32768, 131072)]
    assert itl == sorted(itl) and itl[-1] > 5 * itl[0]
    assert st.step_ms([(2048, 0)], [8192] * 64) > st.step_ms([], [8192] * 64) + 20.0
    chunk = [st.step_ms([(2048, prefix)], []) for prefix in (0, 16384, 65536, 131072)]
    assert chunk == sorted(chunk)
    # More tokens in a step never cost less, on the whole range and past its end (extrapolated).
    costs = [st.nonattn_ms(t) for t in range(1, 40000, 97)]
    assert all(b >= a * 0.97 for a, b in pairwise(costs))


def test_a_hundred_3k_prefills_cost_what_the_token_budget_implies() -> None:
    """100 fresh 3 000-token prompts under vLLM's 8 192-token budget: 37 steps of packed chunks, 12.2 s on
    the 70B TP8 profile (the figure the step loop must reproduce), not 100 independent timers."""
    st = StepTables.load(H200_70B)
    budget = int(st.knob("max-num-batched-tokens"))
    left = [3000] * 100
    done = [0] * 100
    total = 0.0
    steps = 0
    while any(left):
        room, chunks = budget, []
        for i, n in enumerate(left):
            if n and room:
                take = min(n, room)
                chunks.append((i, take))
                room -= take
        total += st.step_ms([(take, done[i]) for i, take in chunks], []) + st.knob("step-overhead")
        for i, take in chunks:
            left[i] -= take
            done[i] += take
        steps += 1
    assert steps == 37
    assert 7_000 < total < 13_000  # 12.2 s with the committed tables


def test_profiles_are_small_json() -> None:
    for name in profiles():
        text = (PROFILES_DIR / f"{name}.json").read_text()
        assert len(text) < 40_000
        assert json.loads(text)["profile"] == name
