"""The long chaos run: every scenario of ``proto/load/chaos.py``, round after round with a new seed each,
until ``--minutes`` have passed, each round on a fresh ``responses-lab serve``; prints the table of faults
and violations (the figures of NOTES.md, "Issue 13") and exits 1 if any invariant broke.

    .venv/bin/python scripts/chaos.py --minutes 10 [--seed 1] [--short] [--json OUT]

``--short`` runs the sizes of ``tests/test_chaos.py`` (one round takes ~30 s on 2 cores); the default sizes
are ``Sizes.long()`` (300 concurrent-ish rollouts under injected engine failures, 200 fuzzed frames per
transport, five rounds of disconnects in every state).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict

from proto.load.chaos import Outcome, Sizes, round_of_chaos, table


async def main(minutes: float, seed: int, short: bool) -> list[Outcome]:
    sizes = Sizes() if short else Sizes.long()
    deadline = time.monotonic() + minutes * 60
    outcomes: list[Outcome] = []
    round_seed = seed
    while True:
        outcomes += await round_of_chaos(round_seed, sizes)
        print(table(outcomes[-5:]), flush=True)
        round_seed += 1
        if time.monotonic() >= deadline:
            return outcomes


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--short", action="store_true")
    parser.add_argument("--json", default=None, help="write every outcome here")
    args = parser.parse_args()
    started = time.monotonic()
    results = asyncio.run(main(args.minutes, args.seed, args.short))
    totals: dict[str, list[int]] = {}
    for o in results:
        total = totals.setdefault(o.scenario, [0, 0, 0, 0])
        total[0] += 1
        total[1] += o.cases
        total[2] += o.responses
        total[3] += len(o.violations)
    print(f"\n{len(results) // 5} rounds in {time.monotonic() - started:.0f} s")
    print("| scenario | rounds | faults | responses seen | violations |\n|---|---|---|---|---|")
    for name, (rounds, cases, responses, violations) in totals.items():
        print(f"| {name} | {rounds} | {cases} | {responses} | {violations} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(o) for o in results], out, indent=1)
    sys.exit(1 if any(o.violations for o in results) else 0)
