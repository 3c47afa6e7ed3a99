"""The model's side of the demo: the directive script (docs/protocol.md, "The directive script") the scripted
model follows, sent as the
first user message, and the request that declares the tools it calls."""

from __future__ import annotations

import json
from typing import Any

from proto.client import messages
from proto.demo.fixture import FIX_PATCH


def _line(*calls: tuple[str, dict[str, Any]], tokens: int | None = None) -> str:
    prefix = f"!tokens {tokens} " if tokens is not None else ""
    return prefix + " | ".join(f"!call {name} {json.dumps(args)}" for name, args in calls)


SUMMARY = (
    "Fixed the failing test. stats.mean skipped the last value: its loop ran over range(len(values) - 1), "
    "an off-by-one. The loop now covers every value, and both tests pass (pytest exit code 0)."
)

# One directive line per model turn (docs/protocol.md, "The directive script"). Turn 3 is hosted: the server
# runs web_search itself and
# samples turn 4 without a round-trip, so the client sees 4 suspensions for 6 turns.
SCRIPT_LINES = (
    _line(("grep", {"pattern": r"def mean|mean\("}), ("read_file", {"path": "test_stats.py"}), tokens=40),
    _line(("read_file", {"path": "stats.py"}), ("run_tests", {})),
    _line(("web_search", {"query": "python off-by-one range last element of a list"}), tokens=30),
    _line(("apply_patch", {"path": "stats.py", "patch": FIX_PATCH})),
    _line(("run_tests", {})),
    f"!say {SUMMARY}",
)

TASK = "The tests of this repository fail. Find the bug, fix it, and show that the tests pass."
SCRIPT = "\n".join([TASK, "", *SCRIPT_LINES])

INSTRUCTIONS = (
    "You are a coding agent working in a small Python repository. Use grep and read_file to look around, "
    "web_search when you need documentation, apply_patch to edit files, and run_tests to check your work."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "grep",
        "description": "Search the repository's text files with a Python regular expression.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Python regular expression"},
                "path": {
                    "type": "string",
                    "description": "file or directory to search, relative to the repository root",
                },
            },
            "required": ["pattern"],
        },
    },
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a text file of the repository, with line numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            "required": ["path"],
        },
    },
    {
        "type": "function",
        "name": "apply_patch",
        "description": "Edit files: a unified diff in `patch`, or replace the unique `search` text of `path` "
        "with `replace`.",
        "parameters": {
            "type": "object",
            "properties": {
                "patch": {"type": "string", "description": "unified diff (--- a/FILE, +++ b/FILE, @@ hunks)"},
                "path": {"type": "string"},
                "search": {"type": "string"},
                "replace": {"type": "string"},
            },
        },
    },
    {
        "type": "function",
        "name": "run_tests",
        "description": "Run the repository's tests; returns the exit code and the end of the output.",
        "parameters": {"type": "object", "properties": {}},
    },
    {"type": "web_search"},
]


def demo_request(model: str) -> dict[str, Any]:
    return messages.body(model, [messages.user_message(SCRIPT)], tools=TOOLS, instructions=INSTRUCTIONS)
