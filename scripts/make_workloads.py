"""Generate the shipped workloads (sampler/workloads/*.json), deterministically.

    .venv/bin/python scripts/make_workloads.py

The generator is ``proto/lab/workload/synthetic.py`` (sizes plausible, tool times drawn from TraceLab's
heavy-tailed fit); the format is documented in docs/lab.md, "Workloads".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proto.lab.workload.synthetic import coding_agent, long_context, small_context

OUT = Path(__file__).resolve().parent.parent / "sampler" / "workloads"


def render(w: dict[str, Any]) -> str:
    """Pretty JSON with one turn per line: diffs of a regenerated workload stay readable."""
    head = json.dumps({k: v for k, v in w.items() if k != "turns"}, indent=1)[:-2]
    turns = ",\n  ".join(json.dumps(t) for t in w["turns"])
    return f'{head},\n "turns": [\n  {turns}\n ]\n}}\n'


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for w in (coding_agent(), long_context(), small_context()):
        path = OUT / f"{w['name']}.json"
        path.write_text(render(w), encoding="utf-8")
        history = w["first_user_tokens"] + sum(
            t["output_tokens"] + len(t.get("calls", [])) * t.get("tool_output_tokens", 0) for t in w["turns"]
        )
        tool_s = sum(t.get("client_tool_time_s", 0.0) for t in w["turns"])
        print(
            f"{path}: {len(w['turns'])} turns, final history {history} tokens, client tool time {tool_s:.1f} "
            f"s"
        )


if __name__ == "__main__":
    main()
