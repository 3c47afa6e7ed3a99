"""The kept runs' document (docs/lab-results.md) against the runs it is generated from, and the validation
sample's bar (docs/lab.md, "The validation sample"). Reads the committed results only: no server, no run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proto.lab.writeup import lab, validation_section


def test_the_kept_validation_sample_meets_its_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/lab.md, "The validation sample": every kept ``validate-*`` cell within ±5 % of the fast model on
    E2E p50, and every curve point's measured gain of the fast model's sign, as the document says."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # the document names the directory as given
    kept = Path("docs/results")
    runs = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(kept.glob("validate-*/results.json"))]
    cells = [run for results in runs for run in results["runs"]]
    assert len(cells) == 32 + 3 + 3 + 9 + 6
    assert all(abs(run["prediction_error"]) <= 0.05 for run in cells)
    text = lab(kept)
    section = text.split("## The validation sample's curve points (tool times × 1)", 1)[1].split("\n## ", 1)[
        0
    ]
    assert section.count(" | yes |") == 18 and "**no**" not in section
    assert "Points whose measured E2E gain has the fast model's sign: **18 of 18**." in section
    # the predicted grid names the cells the sample measured: 32 longlived ones, http and ws beside them on
    # the speed curve (6), and the hops curve's local point (3)
    assert "**Predicted by the fast model**; 41 of its cells measured on the real clock" in text
    assert "| local: http, ws, longlived (0.1 %); production-like: http, ws, longlived (0.3 %) |" in text
    assert (kept.parent / "lab-results.md").read_text(encoding="utf-8") == text  # the document is current


def test_validation_section_flags_a_gain_of_the_other_sign() -> None:
    def cell(e2e: float, predicted: float) -> dict[str, float]:
        return {
            "e2e_s_p50": e2e,
            "predicted_e2e_s_p50": predicted,
            "ttft_ms_p50": 1.0,
            "predicted_ttft_ms_p50": 1.0,
        }

    modes = {"http": cell(10.0, 10.0), "ws": cell(10.1, 9.9), "longlived": cell(9.0, 9.5)}
    rows = validation_section([("p", modes, "ws"), ("p", modes, "longlived"), ("q", {}, "ws")], signs=True)
    assert rows[2] == "| p | ws | +1.0 % | -1.0 % | +0.0 % | +0.0 % | **no** |"
    assert rows[3].endswith("| -10.0 % | -5.0 % | +0.0 % | +0.0 % | yes |")
    assert rows[-1] == "Points whose measured E2E gain has the fast model's sign: **1 of 2**."
