"""The timing formulas on exact numbers, jitter bounds and seeding, the model catalogue."""

import pytest

from sampler.models import MODELS, ModelSpec, resolve_model
from sampler.timing import Timing, load_factor


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


def test_prefill_per_uncached_token() -> None:
    t = Timing(spec())
    assert t.prefill_ms(1000, running=1) == 30.0 + 250.0
    assert t.prefill_ms(0, running=1) == 30.0
    assert t.prefill_ms(1000, running=3) == 280.0 * 1.5


def test_constant_prefill_uses_time_to_first_token() -> None:
    t = Timing(spec(prefill_overhead_ms=0.0, prefill_time_per_token_ms=0.0))
    assert t.prefill_ms(123_456, running=1) == 50.0


def test_itl_sub_millisecond_and_load() -> None:
    t = Timing(spec(tokens_per_s=4000))
    assert t.itl_s(1) == pytest.approx(0.00025, abs=1e-15)
    assert t.itl_s(5) == pytest.approx(0.0005, abs=1e-15)


def test_jitter_is_clamped_to_70_percent() -> None:
    t = Timing(spec(ttft_jitter_std=0.3, itl_jitter_std=0.3))
    prefills = [t.prefill_ms(0, 1) for _ in range(20_000)]
    itls = [t.itl_s(1) for _ in range(20_000)]
    assert min(prefills) == pytest.approx(30.0 * 0.3) and max(prefills) == pytest.approx(30.0 * 1.7)
    assert min(itls) == pytest.approx(0.001 * 0.3) and max(itls) == pytest.approx(0.001 * 1.7)
    assert sum(itls) / len(itls) == pytest.approx(0.001, rel=0.01)


def test_jitter_reproducible_by_seed() -> None:
    def draws(seed: int) -> list[float]:
        t = Timing(spec(itl_jitter_std=0.1, ttft_jitter_std=0.1, seed=seed))
        return [t.prefill_ms(10, 1) for _ in range(50)] + [t.itl_s(1) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_no_jitter_means_exact() -> None:
    t = Timing(spec())
    assert {t.itl_s(1) for _ in range(100)} == {0.001}


@pytest.mark.parametrize(
    "bad",
    [
        {"ttft_jitter_std": 0.31},
        {"itl_jitter_std": -0.1},
        {"inter_token_latency_ms": 0.0},
        {"max_num_seqs": 0},
        {"time_factor_under_load": 0.5},
        {"fail_rate": 1.5},
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
        } <= set(pub)
    with pytest.raises(KeyError, match="mock-65tps"):
        resolve_model("gpt-9")


def test_override_accepts_llm_d_names() -> None:
    m = resolve_model("mock-65tps").override(
        **{"max-num-seqs": 4, "tokens-per-second": 500, "pin_suspended": False}
    )
    assert m.max_num_seqs == 4 and m.inter_token_latency_ms == 2.0 and m.pin_suspended is False
    assert resolve_model("mock-65tps").max_num_seqs == 256  # the catalogue is untouched
