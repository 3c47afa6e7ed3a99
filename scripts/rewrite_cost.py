"""What a history rewrite costs each design: TraceLab's Codex session as it is (rounds 5 and 7 open a user
turn with a prompt below the last context) against the same session made a strict extension (those two
rounds' prompts raised to the last context plus a 20-token user message, later rounds shifted as much).

    .venv/bin/python scripts/rewrite_cost.py --out DIR [--rollouts 5] [bench flags...]

Runs ``responses-lab bench --quick --no-predict`` on both files (written to DIR) and prints, per mode, the
median turn overhead and TTFT at the two rewrite rounds and E2E p50, each as rewrite / extension
(docs/lab.md, "History rewrites").
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from proto.lab.bench import main as bench_main
from proto.lab.report.results import load
from proto.lab.workload.traces import TRACELAB

SOURCE = TRACELAB / "tracelab-codex-session.jsonl"
REWRITES = (5, 7)  # the rounds whose prompt is below the last context
USER_MESSAGE = 20  # tokens the counterfactual's user turns append


def extended(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The session with every round a strict extension: a round below the last context is raised to it plus
    a user message, and every later round by as much."""
    out: list[dict[str, Any]] = []
    shift = 0
    for row in rows:
        row = dict(row, input_tokens_total=row["input_tokens_total"] + shift)
        if out:
            context = out[-1]["input_tokens_total"] + out[-1]["output_tokens"]
            if row["input_tokens_total"] < context + USER_MESSAGE:
                shift += context + USER_MESSAGE - row["input_tokens_total"]
                row["input_tokens_total"] = context + USER_MESSAGE
        row["prefix_tokens"] = min(row["prefix_tokens"], row["input_tokens_total"])
        row["newly_append_tokens"] = row["input_tokens_total"] - row["prefix_tokens"]
        out.append(row)
    return out


def run(path: Path, out: Path, rollouts: int, extra: list[str]) -> dict[str, dict[str, Any]]:
    flags = ["--quick", "--no-predict", "--no-plots", "--workload", str(path), "--rollouts", str(rollouts)]
    assert bench_main([*flags, "--out", str(out), *extra]) == 0
    results = load(out / "results.json")
    return {f"{r['profile']} {r['mode']}": r for r in results["runs"]}


def at_rewrites(run: dict[str, Any]) -> tuple[float, float]:
    """Median turn overhead and TTFT (ms) over the rewrite rounds of every rollout."""
    turns = len(run["turn_overhead_ms_by_turn"])
    ttft = run["ttft_ms_all"]
    per_rollout = [ttft[i : i + turns] for i in range(0, len(ttft), turns)]
    overhead = statistics.median(run["turn_overhead_ms_by_turn"][k] for k in REWRITES)
    return overhead, statistics.median(r[k] for r in per_rollout for k in REWRITES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rollouts", type=int, default=5)
    args, extra = parser.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in SOURCE.read_text(encoding="utf-8").splitlines()]
    counterfactual = args.out / "tracelab-codex-session-extended.jsonl"
    counterfactual.write_text("".join(json.dumps(r) + "\n" for r in extended(rows)), encoding="utf-8")
    real = run(SOURCE, args.out / "rewrites", args.rollouts, extra)
    base = run(counterfactual, args.out / "extended", args.rollouts, extra)
    print(f"{'cell':<28} {'overhead ms at 5,7':>22} {'TTFT ms at 5,7':>22} {'E2E s p50':>18}")
    for cell, r in real.items():
        b = base[cell]
        (ro, rt), (bo, bt) = at_rewrites(r), at_rewrites(b)
        print(
            f"{cell:<28} {ro:>9.2f} vs {bo:>7.2f} ms {rt:>9.2f} vs {bt:>7.2f} ms "
            f"{r['e2e_s_p50']:>7.3f} vs {b['e2e_s_p50']:.3f}"
        )


if __name__ == "__main__":
    main()
