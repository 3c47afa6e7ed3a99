"""The synthetic workloads' generator (``scripts/make_workloads.py`` writes the shipped JSON with it; the
fast model's turn sweep calls it for any length).

Sizes are drawn from ranges typical of coding agents (Codex/Claude-Code-style tool use: file reads of
0.5-3.5 k tokens, greps, test runs) — plausible, not measured. Tool times are drawn, per call, from a
seeded log-normal fitted to TraceLab's published per-call tool latency (p50 0.3 s, p90 13.6 s, 357 k steps
of Claude Code and Codex; sampler/workloads/tracelab/README.md): mu = ln 0.3, sigma = ln(13.6/0.3)/z(0.9)
= 2.976, clamped at 120 s (Claude Code's default Bash timeout, BASH_DEFAULT_TIMEOUT_MS = 120000). The
clamp moves no quantile below p97.8, so p50 and p90 stay exact; the mean is 6.9 s (the tail's). Parallel
calls overlap: a turn waits for its slowest call.
"""

from __future__ import annotations

import math
import random
from typing import Any

FILES = [
    "src/app/server.py",
    "src/app/routes.py",
    "src/app/models.py",
    "src/app/auth.py",
    "src/app/cache.py",
    "src/app/db.py",
    "tests/test_routes.py",
    "tests/test_auth.py",
    "tests/conftest.py",
    "pyproject.toml",
]

# name -> (tool output tokens, [unused: the old uniform tool-time range, still drawn so sizes stay as they
# were], model output tokens for the call)
TOOLS: dict[str, tuple[tuple[int, int], tuple[float, float], tuple[int, int]]] = {
    "list_dir": ((80, 400), (0.005, 0.02), (30, 60)),
    "grep": ((150, 1500), (0.05, 0.4), (40, 90)),
    "read_file": ((600, 3500), (0.003, 0.02), (30, 80)),
    "edit_file": ((40, 200), (0.01, 0.05), (150, 700)),  # the patch is in the arguments
    "run_tests": ((300, 3000), (1.0, 6.0), (40, 90)),
    "run_shell": ((50, 800), (0.2, 3.0), (40, 100)),
}

TOOL_P50_S = 0.3  # TraceLab, per call
TOOL_P90_S = 13.6
TOOL_CAP_S = 120.0  # Claude Code's default Bash timeout
_Z90 = 1.2815515655446004  # the standard normal's 0.9 quantile
TOOL_MU = math.log(TOOL_P50_S)
TOOL_SIGMA = math.log(TOOL_P90_S / TOOL_P50_S) / _Z90


def tool_time_s(rng: random.Random) -> float:
    """One call's tool time: the fitted log-normal, clamped at ``TOOL_CAP_S``."""
    return min(math.exp(rng.gauss(TOOL_MU, TOOL_SIGMA)), TOOL_CAP_S)


def call(rng: random.Random, tool: str, path: str) -> dict[str, Any]:
    args: dict[str, Any] = {
        "list_dir": {"path": path.rsplit("/", 1)[0]},
        "grep": {
            "pattern": rng.choice(["def handle_", "TODO", "cache_key", "session", "raise "]),
            "path": "src",
        },
        "read_file": {"path": path},
        "edit_file": {"path": path, "old": "return None", "new": "return self._cache.get(key)"},
        "run_tests": {
            "cmd": f"pytest -q {rng.choice(['tests', 'tests/test_routes.py', 'tests/test_auth.py'])}"
        },
        "run_shell": {"cmd": rng.choice(["git status", "git diff --stat", "ruff check src", "mypy src"])},
    }[tool]
    return {"name": tool, "arguments": args}


def tool_turn(
    rng: random.Random, times: random.Random, tool: str, parallel: int = 1, scale: float = 1.0
) -> dict[str, Any]:
    (o_lo, o_hi), (t_lo, t_hi), (m_lo, m_hi) = TOOLS[tool]
    turn = {
        "calls": [
            call(rng, tool, path) for path in rng.sample(FILES, parallel)
        ],  # parallel reads: distinct files
        "output_tokens": rng.randint(m_lo, m_hi) + 20 * (parallel - 1),
        "tool_output_tokens": round(rng.randint(o_lo, o_hi) * scale),
    }
    rng.uniform(t_lo, t_hi)  # the old uniform draw: kept so every size above and after stays as it was
    turn["client_tool_time_s"] = round(max(tool_time_s(times) for _ in range(parallel)), 3)
    return turn


# explore, read (some reads in parallel), edit/test cycles, check, summarise
CODING_PHASES = (
    "list_dir grep read_file read_file*3 grep read_file read_file*2 run_tests",
    "edit_file read_file edit_file run_tests grep read_file edit_file run_tests",
    "edit_file run_shell read_file edit_file run_tests run_shell grep edit_file",
    "read_file run_tests grep run_shell run_shell",
)
CODING_FINAL = (
    "Fixed the stale session cache: keys now include the tenant id, invalidation runs on "
    "logout, and a regression test covers both. All tests pass."
)


def coding_agent(turns: int = 30) -> dict[str, Any]:
    """The coding-agent workload with ``turns`` turns (the shipped one has 30: 29 tool turns and the final
    summary). Longer ones repeat the edit/test phases; every length shares the first turns' draws."""
    rng, times = random.Random(3), random.Random(1103)
    plan = [step for phase in CODING_PHASES for step in phase.split()]
    middle = [step for phase in CODING_PHASES[1:3] for step in phase.split()]
    while len(plan) < turns - 1:
        plan += middle
    steps = []
    for step in plan[: turns - 1]:
        tool, _, n = step.partition("*")
        steps.append(tool_turn(rng, times, tool, int(n or 1)))
    steps.append({"say": CODING_FINAL, "output_tokens": 420})
    name = "coding-agent" if turns == 30 else f"coding-agent-{turns}"
    return {
        "format": 1,
        "name": name,
        "description": f"A coding agent fixing a bug: {turns - 1} tool turns (reads, greps, edits, test "
        f"runs) and a "
        "final summary; history grows from 6 k to tens of thousands of tokens; tool times drawn from "
        "TraceLab's heavy-tailed fit (p50 0.3 s, p90 13.6 s).",
        "first_user_text": "Sessions leak between tenants after logout. Find the cause, fix it, add a test.",
        "first_user_tokens": 6000,  # system prompt + tool schemas + task, as agent harnesses send
        "tool_times": "tracelab",  # one draw of the fit: the lab draws again per rollout seed
        "turns": steps,
    }


def long_context() -> dict[str, Any]:
    rng, times = random.Random(7), random.Random(1107)
    tools = ["read_file", "read_file", "grep", "read_file", "run_shell"] * 3
    turns = [tool_turn(rng, times, t, scale=3.4) for t in tools]  # whole modules and long logs
    turns.append(
        {
            "say": "Summary of the codebase's request path, its caches and the three places where "
            "tenant isolation depends on call order.",
            "output_tokens": 900,
        }
    )
    return {
        "format": 1,
        "name": "long-context",
        "description": "Reading a large codebase: 15 turns of large tool outputs on a 12 k-token start; "
        "history reaches ~100 k tokens; tool times drawn from TraceLab's heavy-tailed fit.",
        "first_user_text": "Read the service and explain how a request flows through its caches.",
        "first_user_tokens": 12_000,
        "tool_times": "tracelab",
        "turns": turns,
    }


def small_context() -> dict[str, Any]:
    """A short-context tool loop: the same 15 tool turns as long-context's pattern, each output a few dozen
    tokens, on a 600-token start, so the history stays near 1 k tokens (the peers' small-context point)."""
    rng, times = random.Random(11), random.Random(1111)
    tools = ["grep", "read_file", "run_shell", "read_file", "run_tests"] * 3
    turns = [tool_turn(rng, times, t, scale=0.02) for t in tools]
    turns.append(
        {
            "say": "The flag is read in two places; both now honour the override. Tests pass.",
            "output_tokens": 40,
        }
    )
    return {
        "format": 1,
        "name": "small-context",
        "description": "A short tool loop: 15 turns of small tool outputs on a 600-token start; history "
        "stays under ~2 k tokens; tool times drawn from TraceLab's heavy-tailed fit.",
        "first_user_text": "Find where the feature flag is read and make both places honour the override.",
        "first_user_tokens": 600,
        "tool_times": "tracelab",
        "turns": turns,
    }
