"""The kept runs' document (docs/lab-results.md) and NOTES.md's findings against the runs they are generated
from (docs/lab.md, "Kept runs"). Reads the committed results only: no server, no run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from proto.lab.analysis.stats import Gain
from proto.lab.records import results_of
from proto.lab.report.writeup import (
    FINDINGS_BEGIN,
    FINDINGS_END,
    interval,
    lab,
    notes_block,
    scenario_answers,
    scenario_section,
)

KEPT = Path(__file__).resolve().parent.parent / "docs" / "results"
FORMAT2 = Path(__file__).resolve().parent / "lab_format2"  # a real `bench --quick --profile local` run


def _chdir_root(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(KEPT.parent.parent)
    return lab(Path("docs/results"))


def test_notes_findings_block_is_the_generated_findings(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTES.md's findings block is the generator's text, word for word, and the same text is the
    generated document's "Findings" section."""
    text = _chdir_root(monkeypatch)
    notes = Path("NOTES.md").read_text(encoding="utf-8")
    block = notes.split(FINDINGS_BEGIN + "\n", 1)[1].split(FINDINGS_END, 1)[0]
    assert block == notes_block(Path("docs/results"))
    assert "## Findings\n\n" + block in text


def test_the_committed_document_is_the_generators(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _chdir_root(monkeypatch)
    assert (KEPT.parent / "lab-results.md").read_text(encoding="utf-8") == text


def test_findings_hold_the_kept_files_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures the findings quote, recomputed by hand from the kept results.json files: each paired gain
    is the mean over rollout pairs (same index, same session) of mode ÷ baseline − 1."""
    monkeypatch.chdir(KEPT.parent.parent)
    block = notes_block(Path("docs/results"))
    runs = {p.parent.name: json.loads(p.read_text(encoding="utf-8")) for p in KEPT.glob("*/results.json")}

    def by_hand(run: str, model: str, mode: str, base: str, field: str = "e2e_s") -> float:
        rows = {r["mode"]: r for r in runs[run]["runs"] if r["model"] == model}
        theirs = {(x["index"], x["session"]): x[field] for x in rows[base]["rollout_records"]}
        ratios = [x[field] / theirs[(x["index"], x["session"])] - 1 for x in rows[mode]["rollout_records"]]
        return sum(ratios) / len(ratios)

    speed = [r for r in runs["speed"]["runs"] if r["mode"] == "http"]
    line = next(x for x in block.splitlines() if x.startswith("- *Decode speed"))
    for r in speed:
        label = r["model"].removeprefix("mock-")
        assert f"{label} {by_hand('speed', r['model'], 'longlived', 'http') * 100:+.1f} [" in line
    every = [
        (name, r)
        for name, results in runs.items()
        if results.get("format") == 2 and not results["design"]["quick"]
        for r in results["runs"]
        if r["mode"] in ("ws", "longlived") and "http" in (r.get("gains") or {})
    ]
    reached = sum(r["gains"]["http"]["e2e"]["gain"] <= -0.40 for _, r in every)
    assert f"is reached in {reached} of the {len(every)} measured" in block


def test_no_lab_figure_is_typed_outside_the_generated_text() -> None:
    """NOTES.md's findings quote no figure outside the generated block but the published claims
    (docs/lab.md, "Published claims"), and docs/lab.md types no gain (a signed percentage) that is not a
    published claim."""
    root = KEPT.parent.parent
    notes = (root / "NOTES.md").read_text(encoding="utf-8")
    lab_md = (root / "docs" / "lab.md").read_text(encoding="utf-8")
    claims = lab_md.split("## Published claims", 1)[1]
    published = set(re.findall(r"[−+-]?\d+(?:\.\d+)? ?%", claims))
    section = notes.split("## The lab's findings\n", 1)[1].split("\n## ", 1)[0]
    head, rest = section.split(FINDINGS_BEGIN, 1)
    typed = head + rest.split(FINDINGS_END, 1)[1]
    typed = re.sub(r"[−+-]?\d+(?:\.\d+)? ?%", lambda m: "" if m[0] in published else m[0], typed)
    assert re.findall(r"(?<![\w.])\d+(?:\.\d+)?", typed) == []  # a number, not a name (E2E, p50)
    gains = re.findall(r"[−+-]\d+(?:\.\d+)? ?%", lab_md.split("## Published claims", 1)[0])
    assert [x for x in gains if x not in published] == []


def test_scenario_gains_before_format_2_are_read_in_the_labs_sign() -> None:
    """A scenario written before the format field held the share saved; the document shows mode ÷ base − 1,
    negative = faster, as every other table. A format-2 file is already in that sign."""
    saved = 0.12
    entry = {"runs": [], "scenario": {"name": "seed", "authors": "a", "conditions": "c", "fast_model": {
        "tools x0": {"longlived_e2e_gain_1000tps": saved}}}}  # fmt: skip
    old = results_of(entry)
    assert scenario_answers(old)["tools x0"]["longlived_e2e_gain_1000tps"] == -saved
    new = results_of(dict(entry, format=2))
    assert scenario_answers(new)["tools x0"]["longlived_e2e_gain_1000tps"] == saved
    assert f"longlived_e2e_gain_1000tps: {-saved * 100:+.1f} %" in "\n".join(scenario_section(old))


def test_interval_says_no_difference_when_it_holds_zero() -> None:
    assert interval(Gain("http", "e2e", 12, -0.062, -0.08, -0.041, "faster")) == "-6.2 % [-8.0, -4.1]"
    assert (
        interval(Gain("http", "e2e", 12, -0.01, -0.03, 0.01, "no difference"))
        == "no difference (-1.0 % [-3.0, +1.0])"
    )
    assert interval(Gain("http", "e2e", 2, -0.01, None, None, "too few pairs")) == (
        "-1.0 % (too few pairs, 2 pairs)"
    )


def test_a_format_2_run_renders_percentiles_paired_gains_and_provenance() -> None:
    """The fixture is a real run's results.json (format 2): every mode's p50 / p90 / p99, its gains against
    both baselines with intervals or a verdict, the noisy column and the provenance line, all from the
    file."""
    results = json.loads((FORMAT2 / "quick" / "results.json").read_text(encoding="utf-8"))
    assert results["format"] == 2
    text = lab(FORMAT2)
    assert "## Run `quick`: paired gains" in text
    section = text.split("## Run `quick`: paired gains", 1)[1].split("\n## ", 1)[0]
    commit = results["provenance"]["commit"]
    assert f"Provenance: commit `{commit[:12]}`" in section and results["provenance"]["cpu_model"] in section
    assert "ws_ping p50" in section and "http_noop p50" in section
    for run, record in zip(results["runs"], results_of(results).runs, strict=True):
        e2e = run["e2e_s_pct"]
        row = next(x for x in section.splitlines() if x.startswith(f"| {run['mode']} | {e2e['p50']:.2f} / "))
        assert row.startswith(f"| {run['mode']} | {e2e['p50']:.2f} / {e2e['p90']:.2f} / {e2e['p99']:.2f} |")
        for base in ("http", "http-cached"):
            if base != run["mode"]:
                assert interval(record.gains[base]["e2e"]) in row  # type: ignore[index]
        assert row.endswith(f"| {'; '.join(run['noisy']) or 'no'} |")
    assert "predate the equal-rules method" not in text  # a format-2 run is under the current method


def test_one_format_2_runs_report_has_its_paired_gains(capsys: pytest.CaptureFixture[str]) -> None:
    from proto.lab.report.writeup import main

    assert main([str(FORMAT2 / "quick" / "results.json"), "--title", "Quick"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("### Quick\n") and "#### Paired gains" in text and "Provenance: commit `" in text


@pytest.mark.slow
def test_a_scenarios_fast_model_gain_is_negative_when_the_mode_is_faster() -> None:
    """workload/scenarios.py's gains in the lab's one sign: `longlived` against `http` with production-like
    hops and no tool time (the kept ``speed`` run's calibration) is faster, so negative; the seed's hop
    question still finds the hop that saves 40 %."""
    from proto.lab.analysis.predict import Calibration, Hops
    from proto.lab.analysis.sweep import coding
    from proto.lab.config import PROFILES
    from proto.lab.workload.scenarios import _seed_question, gain
    from sampler.models import MODELS

    kept = json.loads((KEPT / "speed" / "results.json").read_text(encoding="utf-8"))
    cal = Calibration.from_json(kept["calibration"])
    hops = Hops.of(PROFILES["production-like"])
    g = gain(cal, "longlived", "http", coding(30), MODELS["mock-1000tps"], hops, 0.0)
    assert g < 0
    answers = _seed_question(cal)
    assert answers["tools x0"]["longlived_e2e_gain_1000tps"] == pytest.approx(g)
    need = answers["safety_hop_ms_for_minus_40pct_tools_x0"]
    assert need is not None
    at = gain(cal, "longlived", "http", coding(30), MODELS["mock-1000tps"], Hops(need, need / 10), 0.0)
    assert at == pytest.approx(-0.40, abs=0.005)
