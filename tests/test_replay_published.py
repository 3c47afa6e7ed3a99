"""scripts/replay_published.py: the published runs are data with their sources, and the replay drives the
mock GPU as the publisher ran them (docs/mock-gpu.md, "Against published runs")."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sampler.models import MODELS
from sampler.steptables import PROFILES_DIR, profiles

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "replay_published", ROOT / "scripts" / "replay_published.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["replay_published"] = module
    spec.loader.exec_module(module)
    return module


def test_published_figures_name_their_source_and_a_committed_profile() -> None:
    files = sorted((PROFILES_DIR / "published").glob("*.json"))
    assert [f.name for f in files] == [
        "nim_llama33_70b.json",
        "trtllm_perf_overview.json",
        "vllm_ci_latency.json",
    ]
    known = set(profiles())
    for f in files:
        data = json.loads(f.read_text())
        assert data["source"].count("https://") >= 1 and data["method"] and data["retrieved"]
        for row in data["rows"]:
            assert len(row) == len(data["columns"])
        named = {row[-1] for row in data["rows"] if isinstance(row[-1], str)} | {data.get("profile")}
        assert named - {None} <= known


def test_a_lone_request_replays_as_the_spec_says() -> None:
    rp = _script()
    # 30 ms + 0.25 ms per uncached token; a decode step 12 ms + 39 ns per token of context (400 + i)
    spec = MODELS["mock-h100-8b"]
    run = asyncio.run(rp.replay(spec, 400, 50, 1, 1))
    assert run.ttft_ms == [pytest.approx(30.0 + 400 * 0.25)]
    decode = sum(12.0 + 3.9e-5 * (400 + i) for i in range(49))
    assert run.itl_ms == [pytest.approx(decode / 49)]
    assert run.output_tokens == 50
    assert run.makespan_s == pytest.approx((130.0 + decode) / 1000)


def test_closed_loop_clients_send_their_next_request_when_the_last_ends() -> None:
    rp = _script()
    spec = MODELS["mock-h100-8b"].override(max_num_seqs=2)
    run = asyncio.run(rp.replay(spec, 400, 50, 3, 2))
    assert len(run.ttft_ms) == 6 and run.output_tokens == 300
    # two slots, three clients: a third of the requests wait for a slot
    assert sum(t > 131.0 for t in run.ttft_ms) >= 2


def test_the_vllm_ci_suite_prints_a_ratio_per_profiled_run(capsys: pytest.CaptureFixture[str]) -> None:
    rp = _script()
    assert rp.main(["--only", "vllm"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| vLLM CI")]
    assert len(lines) == 2
    for ln in lines:
        ratio = float(ln.rstrip(" |").rsplit("|", 1)[1])
        assert 0.5 < ratio < 2.0  # the runs the step-overhead knob is fitted to


def test_each_profile_replays_on_its_calibrated_catalogue_class() -> None:
    rp = _script()
    for profile in profiles():
        spec = rp.spec_for(profile)
        assert spec.step_profile == profile and MODELS[spec.name] is spec
    with pytest.raises(KeyError, match="no catalogue model"):
        rp.spec_for("h999-nothing")
