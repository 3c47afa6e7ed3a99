"""The step cost and the draws on exact numbers, jitter bounds and seeding, the model catalogue."""

import pytest

from sampler.models import MODELS, ModelSpec, resolve_model, spec_tokens_mean
from sampler.steps import AnalyticStepCost, load_factor, step_cost
from sampler.timing import Timing


def spec(**kw: object) -> ModelSpec:
    base = ModelSpec(
        name="t",
        time_to_first_token_ms=50.0,
        prefill_overhead_ms=30.0,
        prefill_time_per_token_ms=0.25,
        inter_token_latency_ms=1.0,
        max_num_seqs=5,
        time_factor_under_load=2.0,
        kv_cache_size=100,
    )
    return base.override(**kw)


@pytest.mark.parametrize(
    ("running", "expected"), [(0, 1.0), (1, 1.0), (2, 1.25), (3, 1.5), (5, 2.0), (9, 2.0)]
)
def test_load_factor_is_llm_d_formula(running: int, expected: float) -> None:
    assert load_factor(spec(), running) == expected


def test_load_factor_single_slot_model() -> None:
    assert load_factor(spec(max_num_seqs=1), 1) == 1.0


def test_analytic_step_cost() -> None:
    """Prefill tokens × per-token, plus (when the step decodes) ITL × L(decodes) + KV read × total context.
    The context a chunk attends to is not costed by the analytic model."""
    cost = AnalyticStepCost(spec(kv_read_time_per_token_ms=0.001))
    assert cost.step_ms([(1000, 0)], []) == 250.0
    assert cost.step_ms([(1000, 50_000)], []) == 250.0
    assert cost.step_ms([], [4000]) == pytest.approx(1.0 + 4.0)
    assert cost.step_ms([], [4000, 4000, 2000]) == pytest.approx(1.5 + 10.0)  # L(3) = 1.5
    assert cost.step_ms([(400, 0), (600, 100)], [4000, 4000, 2000]) == pytest.approx(250.0 + 11.5)
    assert cost.step_ms([], [0] * 50) == pytest.approx(2.0)  # L clamps at max-num-seqs
    assert isinstance(step_cost(spec()), AnalyticStepCost)  # no profile: steptables is not imported


def test_step_and_dispatch_times() -> None:
    t = Timing(spec(step_overhead_ms=2.0))
    assert t.step_ms([(1000, 0)], []) == 2.0 + 250.0
    assert t.step_ms([], [10, 10]) == 2.0 + 1.25
    assert t.dispatch_ms() == 30.0
    assert Timing(spec(prefill_overhead_ms=0.0, prefill_time_per_token_ms=0.0)).dispatch_ms() == 50.0


def test_jitter_is_clamped_to_70_percent() -> None:
    """Decode-only steps draw with itl-jitter-std; prefill steps and the dispatch with ttft-jitter-std."""
    t = Timing(spec(ttft_jitter_std=0.3, itl_jitter_std=0.3))
    dispatches = [t.dispatch_ms() for _ in range(20_000)]
    steps = [t.step_ms([], [1]) for _ in range(20_000)]
    assert min(dispatches) == pytest.approx(30.0 * 0.3) and max(dispatches) == pytest.approx(30.0 * 1.7)
    assert min(steps) == pytest.approx(1.0 * 0.3) and max(steps) == pytest.approx(1.0 * 1.7)
    assert sum(steps) / len(steps) == pytest.approx(1.0, rel=0.01)
    quiet = Timing(spec(itl_jitter_std=0.3))  # ttft-jitter-std 0: prefill steps are exact
    assert {quiet.step_ms([(4, 0)], [1]) for _ in range(100)} == {2.0}


def test_jitter_reproducible_by_seed() -> None:
    def draws(seed: int) -> list[float]:
        t = Timing(spec(itl_jitter_std=0.1, ttft_jitter_std=0.1, seed=seed))
        return [t.dispatch_ms() for _ in range(50)] + [t.step_ms([], [1]) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_no_jitter_means_exact() -> None:
    t = Timing(spec())
    assert {t.step_ms([], [1]) for _ in range(100)} == {1.0}


def test_speculative_tokens_per_step() -> None:
    t = Timing(spec(spec_tokens=4, spec_acceptance=0.8))
    draws = [t.decode_tokens() for _ in range(50_000)]
    assert set(draws) == {1, 2, 3, 4, 5}
    # (1 − α^(k+1)) / (1 − α) = 3.3616; the draws' standard error is ~0.006
    assert sum(draws) / len(draws) == pytest.approx(spec_tokens_mean(4, 0.8), abs=0.03)
    assert spec_tokens_mean(4, 0.8) == pytest.approx(3.3616)
    assert {Timing(spec()).decode_tokens() for _ in range(10)} == {1}


@pytest.mark.parametrize(
    "bad",
    [
        {"ttft_jitter_std": 0.31},
        {"itl_jitter_std": -0.1},
        {"inter_token_latency_ms": 0.0},
        {"max_num_seqs": 0},
        {"time_factor_under_load": 0.5},
        {"fail_rate": 1.5},
        {"max_num_batched_tokens": 0},
        {"spec_acceptance": 1.0},
        {"spec_tokens": -1},
        {"step_overhead_ms": -1.0},
        {"kv_idle_ttl_s": 0.0},
    ],
)
def test_invalid_knobs_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        spec(**bad)


def test_catalogue_and_public_knobs() -> None:
    assert {"mock-65tps", "mock-1000tps", "mock-4000tps"} <= set(MODELS)
    for name, tps in [("mock-65tps", 65), ("mock-1000tps", 1000), ("mock-4000tps", 4000)]:
        m = resolve_model(name)
        assert m.tokens_per_s == pytest.approx(tps)
        pub = m.public()
        # Each model's class prefill (sampler/models.py: GPU-served 80 ms + 8.5 us/token, wafer-scale 1 ms +
        # 39 us).
        assert (pub["prefill-overhead"], pub["prefill-time-per-token"]) == (
            (80.0, 0.0085) if tps == 65 else (1.0, 0.039)
        )
        assert pub["tokens-per-second"] == pytest.approx(tps)
        assert {
            "time-to-first-token",
            "inter-token-latency",
            "max-num-seqs",
            "time-factor-under-load",
            "kv-cache-size",
            "block-size",
            "ttft-jitter-std",
            "itl-jitter-std",
            "seed",
            "max-num-batched-tokens",
            "step-overhead",
            "kv-read-time-per-token",
            "spec-tokens",
            "spec-acceptance",
            "kv-idle-ttl",
        } <= set(pub)
        assert m.calibration is not None and set(pub) - {"tokens-per-second"} >= set(m.calibration.sources)
    # The 4 000 tok/s class is the wafer's 1 ms step with speculative bursts of 1–5 tokens, 4 on average.
    burst = resolve_model("mock-4000tps")
    assert burst.inter_token_latency_ms == pytest.approx(1.0) and burst.spec_tokens == 4
    with pytest.raises(KeyError, match="mock-65tps"):
        resolve_model("gpt-9")


def test_override_accepts_llm_d_names() -> None:
    m = resolve_model("mock-65tps").override(
        **{"max-num-seqs": 4, "tokens-per-second": 500, "pin_suspended": False}
    )
    assert m.max_num_seqs == 4 and m.inter_token_latency_ms == 2.0 and m.pin_suspended is False
    assert resolve_model("mock-65tps").max_num_seqs == 256  # the catalogue is untouched
    # A speed is a step at the model's tokens per step: the speculative class keeps its acceptance.
    fast = resolve_model("mock-4000tps").override(**{"tokens-per-second": 8000})
    assert fast.inter_token_latency_ms == pytest.approx(0.5) and fast.tokens_per_s == pytest.approx(8000)
