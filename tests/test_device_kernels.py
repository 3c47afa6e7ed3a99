"""scripts/device_kernels.py: the real-chip timing script's comparison with the step tables, and the
script itself on tiny shapes on a CPU when PyTorch is installed (docs/mock-gpu.md, "On a real GPU")."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sampler.steptables import StepTables

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("device_kernels", ROOT / "scripts" / "device_kernels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_kernels"] = module
    spec.loader.exec_module(module)
    return module


def _fixture(dk: ModuleType, factor: float) -> dict[str, object]:
    """A measurement file as the script writes it, with every chip time ``factor`` x the table's (not a
    measurement: it pins the comparison's arithmetic)."""
    st = StepTables.load(dk.PROFILE)
    s = dk.LLAMA_8B
    head = {"1": 0.25, **{str(b): 0.25 + 0.001 * b for b in s.batches}}
    return {
        "device": "fixture",
        "torch": "none",
        "gemm_ms": {str(t): st.nonattn_ms(t) * factor - head["1"] for t in s.tokens},
        "lm_head_ms": head,
        "prefill_attention_ms": {
            f"{c},{p}": st.prefill_attention_ms(c, p) * factor for c in s.chunks for p in s.prefixes
        },
        "decode_attention_ms": {
            f"{b},{x}": st.decode_attention_ms(b, x) * factor - (head[str(b)] - head["1"])
            for b in s.batches
            for x in s.contexts
        },
    }


def test_compare_gives_the_chip_over_the_table_for_every_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dk = _script()
    measured = _fixture(dk, 1.1)
    rows = dk.compare(measured)
    s = dk.LLAMA_8B
    assert len(rows) == len(s.tokens) + len(s.chunks) * len(s.prefixes) + len(s.batches) * len(s.contexts)
    assert {r[0] for r in rows} == {"nonattn", "prefill attention", "decode attention"}
    for _part, _shape, table, chip, ratio in rows:
        assert table > 0
        assert ratio == pytest.approx(1.1, rel=1e-9)
        assert chip == pytest.approx(1.1 * table, rel=1e-9)
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(measured))
    assert dk.main(["--compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("| 1.10 |") == len(rows)
