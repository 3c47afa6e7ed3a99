"""Generate the shipped workloads (sampler/workloads/*.json), deterministically.

    .venv/bin/python scripts/make_workloads.py

Sizes and times are drawn from ranges typical of coding agents (Codex/Claude-Code-style tool use:
file reads of 0.5-3.5 k tokens, greps, test runs of seconds) — plausible, not measured; the
format is documented in NOTES.md ("Workload format").
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "sampler" / "workloads"

FILES = ["src/app/server.py", "src/app/routes.py", "src/app/models.py", "src/app/auth.py", "src/app/cache.py",
         "src/app/db.py", "tests/test_routes.py", "tests/test_auth.py", "tests/conftest.py", "pyproject.toml"]

# name -> (tool output tokens, client tool seconds, model output tokens for the call)
TOOLS: dict[str, tuple[tuple[int, int], tuple[float, float], tuple[int, int]]] = {
    "list_dir": ((80, 400), (0.005, 0.02), (30, 60)),
    "grep": ((150, 1500), (0.05, 0.4), (40, 90)),
    "read_file": ((600, 3500), (0.003, 0.02), (30, 80)),
    "edit_file": ((40, 200), (0.01, 0.05), (150, 700)),  # the patch is in the arguments
    "run_tests": ((300, 3000), (1.0, 6.0), (40, 90)),
    "run_shell": ((50, 800), (0.2, 3.0), (40, 100)),
}


def call(rng: random.Random, tool: str, path: str) -> dict[str, Any]:
    args: dict[str, Any] = {
        "list_dir": {"path": path.rsplit("/", 1)[0]},
        "grep": {"pattern": rng.choice(["def handle_", "TODO", "cache_key", "session", "raise "]), "path": "src"},
        "read_file": {"path": path},
        "edit_file": {"path": path, "old": "return None", "new": "return self._cache.get(key)"},
        "run_tests": {"cmd": f"pytest -q {rng.choice(['tests', 'tests/test_routes.py', 'tests/test_auth.py'])}"},
        "run_shell": {"cmd": rng.choice(["git status", "git diff --stat", "ruff check src", "mypy src"])},
    }[tool]
    return {"name": tool, "arguments": args}


def tool_turn(rng: random.Random, tool: str, parallel: int = 1, scale: float = 1.0) -> dict[str, Any]:
    (o_lo, o_hi), (t_lo, t_hi), (m_lo, m_hi) = TOOLS[tool]
    return {
        "calls": [call(rng, tool, path) for path in rng.sample(FILES, parallel)],  # parallel reads: distinct files
        "output_tokens": rng.randint(m_lo, m_hi) + 20 * (parallel - 1),
        "tool_output_tokens": round(rng.randint(o_lo, o_hi) * scale),
        "client_tool_time_s": round(rng.uniform(t_lo, t_hi), 3),
    }


def coding_agent() -> dict[str, Any]:
    rng = random.Random(3)
    # explore, read (some reads in parallel), edit/test cycles, check, summarise: 29 tool turns + 1 answer
    phases = ("list_dir grep read_file read_file*3 grep read_file read_file*2 run_tests",
              "edit_file read_file edit_file run_tests grep read_file edit_file run_tests",
              "edit_file run_shell read_file edit_file run_tests run_shell grep edit_file",
              "read_file run_tests grep run_shell run_shell")
    plan = [step for phase in phases for step in phase.split()]
    turns = []
    for step in plan:
        tool, _, n = step.partition("*")
        turns.append(tool_turn(rng, tool, int(n or 1)))
    turns.append({"say": "Fixed the stale session cache: keys now include the tenant id, invalidation runs on "
                         "logout, and a regression test covers both. All tests pass.", "output_tokens": 420})
    return {
        "format": 1,
        "name": "coding-agent",
        "description": "A coding agent fixing a bug: 29 tool turns (reads, greps, edits, test runs) and a "
                       "final summary; history grows from 6 k to tens of thousands of tokens.",
        "first_user_text": "Sessions leak between tenants after logout. Find the cause, fix it, add a test.",
        "first_user_tokens": 6000,  # system prompt + tool schemas + task, as agent harnesses send
        "turns": turns,
    }


def long_context() -> dict[str, Any]:
    rng = random.Random(7)
    tools = ["read_file", "read_file", "grep", "read_file", "run_shell"] * 3
    turns = [tool_turn(rng, t, scale=3.4) for t in tools]  # whole modules and long logs
    turns.append({"say": "Summary of the codebase's request path, its caches and the three places where "
                         "tenant isolation depends on call order.", "output_tokens": 900})
    return {
        "format": 1,
        "name": "long-context",
        "description": "Reading a large codebase: 15 turns of large tool outputs on a 12 k-token start; "
                       "history reaches ~100 k tokens.",
        "first_user_text": "Read the service and explain how a request flows through its caches.",
        "first_user_tokens": 12_000,
        "turns": turns,
    }


def render(w: dict[str, Any]) -> str:
    """Pretty JSON with one turn per line: diffs of a regenerated workload stay readable."""
    head = json.dumps({k: v for k, v in w.items() if k != "turns"}, indent=1)[:-2]
    turns = ",\n  ".join(json.dumps(t) for t in w["turns"])
    return f'{head},\n "turns": [\n  {turns}\n ]\n}}\n'


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for w in (coding_agent(), long_context()):
        path = OUT / f"{w['name']}.json"
        path.write_text(render(w), encoding="utf-8")
        history = w["first_user_tokens"] + sum(
            t["output_tokens"] + len(t.get("calls", [])) * t.get("tool_output_tokens", 0) for t in w["turns"])
        tool_s = sum(t.get("client_tool_time_s", 0.0) for t in w["turns"])
        print(f"{path}: {len(w['turns'])} turns, final history {history} tokens, client tool time {tool_s:.1f} s")


if __name__ == "__main__":
    main()
