"""``responses-lab bench repredict``: a kept run's real-clock cells predicted again with today's fast model,
from the run's own calibration.

    responses-lab bench repredict docs/results/*/results.json [--check]

Every real-clock run carries its cell's prediction (``predicted_e2e_s_p50``, ``predicted_ttft_ms_p50``,
``predicted_parts_s``, ``prediction_error``), composed when the run ended by the fast model of that day
(``proto/lab/analysis/predict.py``) from the calibration the run measured. When the composing changes (not the
measuring), this rewrites those fields from the same calibration and cell config, and records it under
``predictions_recomputed`` (commit, time); nothing measured is touched. ``--check`` writes nothing and
prints each cell's error before and after.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from proto.helpfmt import HelpFormatter
from proto.lab.analysis.predict import Calibration
from proto.lab.report.results import predict_run
from proto.lab.workload.traces import load_replay
from sampler.models import MODELS

Row = tuple[dict[str, Any], float | None, float | None]  # (run, error before, error after)


def repredict(result: dict[str, Any], calibration: dict[str, Any] | None = None) -> list[Row]:
    """(run, error before, error after) for every run that has a prediction; the runs are updated in place.
    With ``calibration`` (another run's fits: ``bench validate``), every cell of a model the mock GPU knows
    is predicted from it, a ``--no-predict`` run's too."""
    if calibration is None and not result.get("calibration"):
        return []
    cal = Calibration.from_json(calibration or result["calibration"])
    cfg = result["config"]
    config = SimpleNamespace(server_flags=cfg.get("server_flags", []))
    try:
        replays = {
            replay.name: replay for replay in map(load_replay, cfg["workloads"])
        }  # by name: a file's too
    except (
        KeyError
    ) as exc:  # a scenario's own workload (built by proto/lab/workload/scenarios.py, not a file)
        print(f"  left as it is: {exc}")
        return []
    out = []
    for run in result["runs"]:
        if (
            (calibration is None and run.get("predicted_e2e_s_p50") is None)
            or run["model"] not in MODELS
            or run["mode"] not in cal.fits
        ):
            continue
        # A shortened workload is named NAME[:TURNS] in the runs.
        replay = replays[run["workload"].split("[")[0]].shortened(cfg.get("turns"))
        before = run.get("prediction_error")
        predict_run(
            run,
            cal,
            replay,
            cfg.get("model_overrides", []),
            config,
            sessions=cfg["sessions"],
            rollouts=cfg["rollouts_per_session"],
            tool_time_scale=cfg["tool_time_scale"],
            seed=cfg.get("seed"),  # format 2: tool times drawn per rollout from it; format 1: the file's
        )
        out.append((run, before, run["prediction_error"]))
    return out


def print_rows(path: Path, rows: list[Row]) -> None:
    worst = max((abs(after) for _, _, after in rows if after is not None), default=0.0)
    print(f"{path}: {len(rows)} cells, largest |error| {worst * 100:.1f} %")
    for run, before, after in rows:
        b = "–" if before is None else f"{before * 100:+.1f} %"
        a = "–" if after is None else f"{after * 100:+.1f} %"
        print(
            f"  {run.get('profile', ''):<16}{run['workload'][:30]:<32}{run['model']:<14}{run['mode']:<12}"
            f"{b:>9} → {a}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="responses-lab bench repredict",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="kept runs' results.json")
    output = parser.add_argument_group("output")
    output.add_argument("--check", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    for path in args.files:
        result = json.loads(path.read_text(encoding="utf-8"))
        rows = repredict(result)
        if (
            rows and not args.check
        ):  # written before anything is printed: a closed pipe (`| head`) cannot cut it short
            result["predictions_recomputed"] = {
                "commit": commit,
                "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print_rows(path, rows)
    return 0
