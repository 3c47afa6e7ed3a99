"""The demo: a coding-agent rollout over the long-lived protocol, against the mock GPU.

A tiny buggy repository is written to a temp dir; the scripted model (the directive script of SPEC §5,
sent as the first user message) searches it, reads files, asks the hosted ``web_search``, patches the bug
and runs the tests. The client runs the local tools for real (files, regexes, a pytest subprocess), and
the terminal shows a timeline a person can follow: condensed events, each suspension and resumption,
tool times, tokens/s per item, and the terminal response's usage and per-turn report.

``responses-lab demo [--url URL]`` and ``scripts/demo.py`` call ``main``; without a URL it starts its
own server on a free loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from websockets.exceptions import WebSocketException

from proto.client.longlived import ClientEvent, LongLivedClient, ProtocolFailure, Rollout, ToolFn

# ---- the tiny buggy repository ------------------------------------------------------------------

BUGGY_STATS = '''\
"""Tiny statistics helpers."""


def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    total = 0.0
    for i in range(len(values) - 1):
        total += values[i]
    return total / len(values)
'''

FIXED_STATS = BUGGY_STATS.replace("range(len(values) - 1)", "range(len(values))")

TEST_STATS = '''\
from stats import mean


def test_mean_of_four() -> None:
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_of_one() -> None:
    assert mean([7]) == 7


if __name__ == "__main__":  # also runs without pytest: `python test_stats.py`
    test_mean_of_four()
    test_mean_of_one()
    print("2 passed")
'''

# The model's fix, as a unified diff (what `git diff` would print), derived from the two versions so the
# script and the fixture cannot drift apart.
FIX_PATCH = "".join(
    difflib.unified_diff(
        BUGGY_STATS.splitlines(keepends=True), FIXED_STATS.splitlines(keepends=True), "a/stats.py", "b/stats.py", n=2
    )
)


def make_repo(root: Path) -> Path:
    """Write the buggy repository into ``root`` (created if missing); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stats.py").write_text(BUGGY_STATS, encoding="utf-8")
    (root / "test_stats.py").write_text(TEST_STATS, encoding="utf-8")
    return root


# ---- local tools: what the client runs for the model --------------------------------------------


class ToolError(Exception):
    """A tool refused its arguments; the model gets the message as the call's output."""


@dataclass(frozen=True)
class SuiteRun:
    exit_code: int
    output: str

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


_SKIP_DIRS = frozenset({"__pycache__", ".git", ".pytest_cache", ".venv"})
_MAX_GREP_MATCHES = 100
_MAX_READ_LINES = 400


class Workspace:
    """The local tools over one repository directory. Each tool takes the call's JSON arguments and
    returns text for the model; bad arguments give an ``error: ...`` text, never an exception."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def tool_fns(self, on_output: Callable[[str, str], None] | None = None) -> dict[str, ToolFn]:
        """The tools as the client's registry: blocking work runs in a thread, off the event loop."""

        def wrap(name: str, tool: Callable[[dict[str, Any]], str]) -> ToolFn:
            async def fn(args: dict[str, Any]) -> str:
                output = await asyncio.to_thread(tool, args)
                if on_output is not None:
                    on_output(name, output)
                return output

            return fn

        tools = {"grep": self.grep, "read_file": self.read_file, "apply_patch": self.apply_patch, "run_tests": self.run_tests}
        return {name: wrap(name, tool) for name, tool in tools.items()}

    # ------------------------------------------------------------------------------ tools
    def grep(self, args: dict[str, Any]) -> str:
        """``{"pattern": REGEX, "path"?: DIR_OR_FILE}`` → ``path:line: text`` per matching line."""
        try:
            pattern = re.compile(_str_arg(args, "pattern"))
        except re.error as e:
            return f"error: bad regular expression: {e}"
        except ToolError as e:
            return f"error: {e}"
        try:
            start = self._resolve(str(args.get("path", ".")))
        except ToolError as e:
            return f"error: {e}"
        matches: list[str] = []
        for file in self._files(start):
            try:
                lines = file.read_text(encoding="utf-8").splitlines()
            except (UnicodeDecodeError, OSError):
                continue  # binary or unreadable: grep skips it too
            for lineno, line in enumerate(lines, 1):
                if pattern.search(line):
                    matches.append(f"{file.relative_to(self.root)}:{lineno}: {line}")
                    if len(matches) == _MAX_GREP_MATCHES:
                        return "\n".join([*matches, f"(stopped at {_MAX_GREP_MATCHES} matches)"])
        return "\n".join(matches) if matches else f"no matches for {pattern.pattern!r}"

    def read_file(self, args: dict[str, Any]) -> str:
        """``{"path": FILE, "start_line"?: N, "end_line"?: M}`` → numbered lines (1-based, inclusive)."""
        try:
            path = self._resolve(_str_arg(args, "path"))
            if not path.is_file():
                raise ToolError(f"no such file: {args['path']}")
            lines = path.read_text(encoding="utf-8").splitlines()
            start = int(args.get("start_line", 1))
            end = int(args.get("end_line", len(lines)))
        except (ToolError, ValueError, TypeError) as e:
            return f"error: {e}"
        except UnicodeDecodeError:
            return "error: not a text file"
        start, end = max(1, start), min(end, len(lines), start + _MAX_READ_LINES - 1)
        return "\n".join(f"{n:4d}  {lines[n - 1]}" for n in range(start, end + 1)) or "(empty file)"

    def apply_patch(self, args: dict[str, Any]) -> str:
        """``{"patch": UNIFIED_DIFF, "path"?: FILE}`` or ``{"path": FILE, "search": OLD, "replace": NEW}``.

        All or nothing: every hunk of every file must apply before anything is written.
        """
        try:
            if "patch" in args:
                default = str(args["path"]) if "path" in args else None
                changes = [self._patched(path, hunks) for path, hunks in parse_unified_diff(_str_arg(args, "patch"), default)]
            elif "search" in args:
                changes = [self._replaced(_str_arg(args, "path"), _str_arg(args, "search"), str(args.get("replace", "")))]
            else:
                raise ToolError('give "patch" (a unified diff) or "path" + "search" + "replace"')
        except ToolError as e:
            return f"error: {e}; nothing was written"
        for path, text, _ in changes:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return "applied: " + ", ".join(f"{path.relative_to(self.root)} ({summary})" for path, _, summary in changes)

    def run_tests(self, args: dict[str, Any] | None = None) -> str:
        """``{}`` → the test run's exit code and the tail of its output."""
        run = self.test_run()
        return f"exit code: {run.exit_code}\n{run.tail()}"

    def test_run(self, timeout_s: float = 120.0) -> SuiteRun:
        """Run the repository's tests in a subprocess: pytest when installed, else each test file."""
        # Third-party plugins of the calling environment (asyncio, timeout...) have no business in the
        # tiny repo's run, and would drag the caller's warnings into it.
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTEST_ADDOPTS", None)
        if importlib.util.find_spec("pytest") is not None:
            commands = [[sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]]
        else:
            commands = [[sys.executable, str(p.name)] for p in sorted(self.root.glob("test_*.py"))]
        outputs, code = [], 0
        for command in commands:
            try:
                done = subprocess.run(command, cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                return SuiteRun(124, f"timed out after {timeout_s:.0f} s: {' '.join(command)}")
            outputs.append(done.stdout + done.stderr)
            code = code or done.returncode
        return SuiteRun(code, "".join(outputs))

    # ------------------------------------------------------------------------------ helpers
    def _resolve(self, relative: str) -> Path:
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ToolError(f"path {relative!r} is outside the repository")
        return path

    def _files(self, start: Path) -> list[Path]:
        if start.is_file():
            return [start]
        if not start.is_dir():
            return []
        return sorted(
            p for p in start.rglob("*") if p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(self.root).parts)
        )

    def _patched(self, relative: str, hunks: list[Hunk]) -> tuple[Path, str, str]:
        path = self._resolve(relative)
        if path.is_file():
            text = path.read_text(encoding="utf-8")
        elif all(not h.old for h in hunks):
            text = ""  # `--- /dev/null`: a new file
        else:
            raise ToolError(f"no such file: {relative}")
        new_text = apply_hunks(text, hunks, relative)
        added, removed = sum(h.added for h in hunks), sum(h.removed for h in hunks)
        return path, new_text, f"{len(hunks)} hunk{'s' * (len(hunks) != 1)}, +{added} -{removed}"

    def _replaced(self, relative: str, search: str, replace: str) -> tuple[Path, str, str]:
        path = self._resolve(relative)
        if not path.is_file():
            raise ToolError(f"no such file: {relative}")
        text = path.read_text(encoding="utf-8")
        count = text.count(search) if search else 0
        if count != 1:
            found = "not found" if count == 0 else f"found {count} times (add context to make it unique)"
            raise ToolError(f"search text {found} in {relative}")
        return path, text.replace(search, replace, 1), "1 replacement"


def _str_arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ToolError(f'argument "{name}" must be a string')
    return value


# ---- unified diffs ------------------------------------------------------------------------------


@dataclass
class Hunk:
    old_start: int  # 1-based line of the first old line (0 for an empty old side)
    old: list[str] = field(default_factory=list)  # context + removed lines, without newlines
    new: list[str] = field(default_factory=list)  # context + added lines
    added: int = 0
    removed: int = 0


_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_unified_diff(text: str, default_path: str | None = None) -> list[tuple[str, list[Hunk]]]:
    """``[(path, hunks)]`` per file. Hunk bodies are read by the header's line counts, so a removed line
    that starts with ``--`` is never mistaken for a file header. Raises ToolError."""
    files: list[tuple[str, list[Hunk]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith(("diff ", "index ", "--- ", "new file mode", "deleted file mode")) or not line.strip():
            continue
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            if target == "/dev/null":
                raise ToolError("deleting files is not supported")
            files.append((target[2:] if target.startswith("b/") else target, []))
            continue
        header = _HUNK_HEADER.match(line)
        if header is None:
            raise ToolError(f"patch line {i}: expected a @@ hunk header, got {line[:40]!r}")
        if not files:
            if default_path is None:
                raise ToolError('the patch has no "+++ FILE" header and no "path" was given')
            files.append((default_path, []))
        old_left = int(header[2]) if header[2] is not None else 1
        new_left = int(header[4]) if header[4] is not None else 1
        hunk, header_line = Hunk(old_start=int(header[1])), i
        while old_left > 0 or new_left > 0:
            if i >= len(lines):
                raise ToolError(f"hunk at patch line {header_line} ends early (its @@ counts promise more lines)")
            body = lines[i]
            i += 1
            tag, rest = (body[:1], body[1:]) if body else (" ", "")  # an empty line: blank context, trimmed
            if tag == "\\":
                continue  # "\ No newline at end of file"
            if tag not in " -+":
                raise ToolError(f"patch line {i}: hunk lines start with ' ', '-' or '+', got {body[:40]!r}")
            if tag in " -":
                hunk.old.append(rest)
                old_left -= 1
            if tag in " +":
                hunk.new.append(rest)
                new_left -= 1
            hunk.removed += tag == "-"
            hunk.added += tag == "+"
            if old_left < 0 or new_left < 0:
                raise ToolError(f"patch line {i}: hunk longer than its @@ counts")
        files[-1][1].append(hunk)
    if not any(hunks for _, hunks in files):
        raise ToolError("the patch holds no hunks")
    return files


def apply_hunks(text: str, hunks: list[Hunk], path: str) -> str:
    """Apply hunks in order. Each must match exactly (no fuzz); like ``patch``, a hunk may sit at an
    offset from its stated line when the file moved. Raises ToolError naming the first mismatch."""
    lines = text.splitlines()
    offset = 0  # how far earlier hunks moved the lines after them
    floor = 0  # hunks may not overlap what earlier hunks produced
    for number, hunk in enumerate(hunks, 1):
        want = max(0, hunk.old_start - 1) + offset if hunk.old else max(0, hunk.old_start) + offset
        at = _find(lines, hunk.old, want, floor)
        if at is None:
            raise ToolError(f"hunk {number} does not apply to {path}: {_mismatch(lines, hunk.old, want)}")
        lines[at : at + len(hunk.old)] = hunk.new
        offset += (at - want) + len(hunk.new) - len(hunk.old)
        floor = at + len(hunk.new)
    ending = "\n" if text.endswith("\n") or not text else ""
    return "\n".join(lines) + ending if lines else ""


def _find(lines: list[str], old: list[str], want: int, floor: int) -> int | None:
    last = len(lines) - len(old)
    for distance in range(len(lines) + 1):
        for at in (want - distance, want + distance) if distance else (want,):
            if floor <= at <= last and lines[at : at + len(old)] == old:
                return at
    return None


def _mismatch(lines: list[str], old: list[str], want: int) -> str:
    for k, expected in enumerate(old):
        n = want + k
        if n >= len(lines):
            return f"it expects line {n + 1} to be {expected!r} but the file has {len(lines)} lines"
        if lines[n] != expected:
            return f"line {n + 1} is {lines[n]!r}, the hunk expects {expected!r} (and it matches nowhere else)"
    return "its lines match only where an earlier hunk already changed the file"


# ---- the model's script and the request ---------------------------------------------------------


def _line(*calls: tuple[str, dict[str, Any]], tokens: int | None = None) -> str:
    prefix = f"!tokens {tokens} " if tokens is not None else ""
    return prefix + " | ".join(f"!call {name} {json.dumps(args)}" for name, args in calls)


SUMMARY = (
    "Fixed the failing test. stats.mean skipped the last value: its loop ran over range(len(values) - 1), "
    "an off-by-one. The loop now covers every value, and both tests pass (pytest exit code 0)."
)

# One directive line per model turn (SPEC §5). Turn 3 is hosted: the server runs web_search itself and
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
                "path": {"type": "string", "description": "file or directory to search, relative to the repository root"},
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
        "description": "Edit files: a unified diff in `patch`, or replace the unique `search` text of `path` with `replace`.",
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
    return {
        "model": model,
        "instructions": INSTRUCTIONS,
        "input": [{"role": "user", "content": SCRIPT}],
        "tools": TOOLS,
    }


# ---- the timeline -------------------------------------------------------------------------------


@dataclass
class _ItemStats:
    kind: str
    label: str
    added: float
    deltas: int = 0
    first: float | None = None
    last: float | None = None

    def rate(self) -> float | None:
        """Deltas per second between the first and last delta (one delta per token for ASCII text)."""
        if self.first is None or self.last is None or self.deltas < 2 or self.last <= self.first:
            return None
        return (self.deltas - 1) / (self.last - self.first)


_QUIET = frozenset({
    "response.in_progress", "response.content_part.added", "response.content_part.done",
    "response.output_text.done", "response.function_call_arguments.done", "client.tool.start",
})


class Timeline:
    """Prints one line per meaningful moment of the rollout; counts the rest."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0: float | None = None
        self.kinds: Counter[str] = Counter()
        self.items: dict[str, _ItemStats] = {}
        self.tool_ms: list[float] = []
        self.suspensions = 0
        self._outputs: list[tuple[str, str]] = []  # tool outputs not yet shown
        self._waiting_since: tuple[str, float] | None = None  # (what, when) until the next token arrives

    def tool_output(self, name: str, output: str) -> None:
        self._outputs.append((name, output))

    def on_event(self, event: ClientEvent) -> None:
        data, kind = event.data, event.type
        self.kinds[kind] += 1
        if self.t0 is None:
            self.t0 = event.t
        if kind.endswith(".delta"):
            self._delta(event)
            return
        if kind in _QUIET:
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)
        elif kind == "error":
            self._print(event, "bold red", "✗ error", escape(json.dumps(data.get("error", data))))
        else:
            self._print(event, "dim", kind, "")

    # ------------------------------------------------------------------------------ handlers
    def _create(self, event: ClientEvent) -> None:
        self._print(event, "bold", "→ response.create", f"{len(SCRIPT_LINES)} scripted turns, {len(TOOLS)} tools")
        self._waiting_since = ("create", event.t)

    def _created(self, event: ClientEvent) -> None:
        response = event.data.get("response", {})
        self._print(event, "bold", "← response.created", f"{response.get('id')} · {response.get('model')}")

    def _item_added(self, event: ClientEvent) -> None:
        item = event.data.get("item", {})
        kind = str(item.get("type"))
        label = {"function_call": f"call {item.get('name')}", "message": "message"}.get(kind, kind)
        self.items[str(item.get("id"))] = _ItemStats(kind, label, event.t)
        if kind == "web_search_call":
            query = (item.get("action") or {}).get("query", "")
            self._print(event, "magenta", "⌕ web_search", f"hosted, runs on the server: {escape(repr(query))}")

    def _delta(self, event: ClientEvent) -> None:
        stats = self.items.get(str(event.data.get("item_id")))
        if stats is None:
            return
        stats.deltas += 1
        if stats.first is None:
            stats.first = event.t
        stats.last = event.t
        if self._waiting_since is not None:
            what, since = self._waiting_since
            self._waiting_since = None
            self._print(event, "dim", "  first token", f"[dim]{(event.t - since) * 1e3:.1f} ms after the {what}[/]")

    def _item_done(self, event: ClientEvent) -> None:
        item = event.data.get("item", {})
        stats = self.items.get(str(item.get("id")))
        if stats is None or stats.kind == "web_search_call":
            if stats is not None:
                sources = (item.get("action") or {}).get("sources") or []
                titles = _clip("; ".join(str(s.get("title")) for s in sources), 50)
                took = (event.t - stats.added) * 1e3
                self._print(event, "magenta", "⌕ web_search done", f"{len(sources)} sources in {took:.1f} ms: {escape(titles)}")
                self._waiting_since = ("web_search (no round-trip)", event.t)
            return
        if stats.kind == "function_call":
            detail = _clip(str(item.get("arguments", "")), 60)
        else:
            detail = _clip(" ".join(str(part.get("text", "")) for part in item.get("content", [])), 60)
        rate = stats.rate()
        speed = f"{rate:,.0f} tok/s" if rate is not None else "–"
        self._print(event, "cyan", f"◆ {stats.label}", f"{escape(detail)} [dim]· {stats.deltas} deltas · {speed}[/]")

    def _web_search_step(self, event: ClientEvent) -> None:
        step = event.type.rsplit(".", 1)[-1]
        if step != "completed":
            self._print(event, "magenta", "  web_search", f"[dim]{step}[/]")

    def _done(self, event: ClientEvent) -> None:
        self.suspensions += 1
        pending = event.data.get("pending_calls", [])
        names = ", ".join(str(p.get("name")) for p in pending)
        self._print(event, "yellow", "⏸ response.done", f"suspended, waiting for {len(pending)} call(s): {names}")

    def _tool_done(self, event: ClientEvent) -> None:
        name, ms = str(event.data.get("name")), float(event.data.get("duration_ms", 0.0))
        self.tool_ms.append(ms)
        output = next((o for n, o in reversed(self._outputs) if n == name), "")
        self._outputs = [(n, o) for n, o in self._outputs if not (n == name and o is output)]
        self._print(event, "green", f"⚙ {name}", f"{ms:7.1f} ms → {escape(_summary(output))}")

    def _append(self, event: ClientEvent) -> None:
        self._print(event, "yellow", "▶ response.append", f"{event.data.get('outputs')} output(s) sent: resumed")
        self._waiting_since = ("append", event.t)

    def _terminal(self, event: ClientEvent) -> None:
        response = event.data.get("response", {})
        reason = (response.get("incomplete_details") or {}).get("reason") or (response.get("error") or {}).get("message")
        style = "bold green" if event.type == "response.completed" else "bold red"
        self._print(event, style, f"■ {event.type}", f"status {response.get('status')}" + (f": {escape(str(reason))}" if reason else ""))

    def _print(self, event: ClientEvent, style: str, label: str, detail: str) -> None:
        """One timeline line: ms since response.create, a plain label in ``style``, markup ``detail``."""
        at = (event.t - (event.t if self.t0 is None else self.t0)) * 1e3
        self.console.print(f"[dim]{at:9.1f} ms[/]  [{style}]{escape(f'{label:<19}')}[/] {detail}", highlight=False)

    # ------------------------------------------------------------------------------ summary
    def summary(self, result: Rollout) -> None:
        response = result.response
        lab = response.get("lab") or {}
        turns = lab.get("turns") or []
        table = Table(title="turns (the server's report: response.lab.turns)", title_justify="left")
        for column in ("turn", "prompt tok", "cached", "prefill ms", "queue ms", "decode ms", "out tok", "tok/s"):
            table.add_column(column, justify="right")
        for t in turns:
            decode = float(t.get("decode_ms", 0.0))
            out = int(t.get("output_tokens", 0))
            table.add_row(
                str(t.get("turn")), str(t.get("prompt_tokens")), str(t.get("cached_tokens")),
                f"{float(t.get('prefill_ms', 0.0)):.1f}", f"{float(t.get('queue_wait_ms', 0.0)):.1f}",
                f"{decode:.1f}", str(out), f"{out / decode * 1e3:,.0f}" if decode > 0 else "–",
            )
        self.console.print(table)
        usage = response.get("usage") or {}
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        decode_ms = sum(float(t.get("decode_ms", 0.0)) for t in turns)
        out_tokens = int(usage.get("output_tokens", 0))
        start = result.events[0].t if self.t0 is None and result.events else self.t0
        total_s = result.events[-1].t - start if result.events and start is not None else 0.0
        streamed = [s for s in self.items.values() if s.first is not None and s.last is not None and s.deltas > 1]
        span = sum((s.last or 0.0) - (s.first or 0.0) for s in streamed)
        seen = f"{sum(s.deltas - 1 for s in streamed) / span:,.0f}" if span > 0 else "–"
        deltas = sum(n for k, n in self.kinds.items() if k.endswith(".delta"))
        server_events = sum(n for k, n in self.kinds.items() if not k.startswith("client."))
        rows = [
            ("total time", f"{total_s * 1e3:,.1f} ms (response.create → {response.get('status')})"),
            ("turns", f"{len(turns)} sampling segments, {self.suspensions} suspensions, {result.appends} appends"),
            ("local tools", f"{len(self.tool_ms)} calls, {sum(self.tool_ms):,.1f} ms in tools"),
            ("usage", f"input {usage.get('input_tokens', 0):,} (cached {cached:,}) · output {out_tokens:,}"),
            ("tokens/s", f"{out_tokens / decode_ms * 1e3:,.0f} modelled decode · {seen} seen by the client"),
            ("events", f"{server_events} from the server ({deltas} deltas, not printed) · {result.bytes_sent:,} bytes sent"),
        ] if decode_ms > 0 else [("total time", f"{total_s * 1e3:,.1f} ms"), ("usage", json.dumps(usage))]
        for name, value in rows:
            self.console.print(f"  [bold]{name:<12}[/] {value}", highlight=False)


_HANDLERS: dict[str, Callable[[Timeline, ClientEvent], None]] = {
    "client.create": Timeline._create,
    "response.created": Timeline._created,
    "response.output_item.added": Timeline._item_added,
    "response.output_item.done": Timeline._item_done,
    "response.web_search_call.in_progress": Timeline._web_search_step,
    "response.web_search_call.searching": Timeline._web_search_step,
    "response.web_search_call.completed": Timeline._web_search_step,
    "response.done": Timeline._done,
    "client.tool.done": Timeline._tool_done,
    "client.append": Timeline._append,
    "response.completed": Timeline._terminal,
    "response.incomplete": Timeline._terminal,
    "response.failed": Timeline._terminal,
}


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _summary(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return "(empty)"
    if len(lines) == 1:
        return _clip(lines[0], 70)
    return f"{_clip(lines[0], 30)} … {_clip(lines[-1], 28)} ({len(lines)} lines)"


# ---- running it ---------------------------------------------------------------------------------


async def run_demo(url: str, model: str = "mock-1000tps", console: Console | None = None, api_key: str | None = None) -> int:
    """One rollout against the server at ``url``; 0 when it completed and the repo's tests now pass."""
    # Piped output (make, CI logs) gets 120 columns rather than rich's 80, so each event stays on one line.
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    with tempfile.TemporaryDirectory(prefix="responses-lab-demo-") as tmp:
        workspace = Workspace(make_repo(Path(tmp) / "repo"))
        timeline = Timeline(console)
        console.rule("[bold]responses-lab demo: a coding agent over one long-lived Response")
        console.print(f"  server  {url}  ·  model {model}\n  repo    {workspace.root}  (stats.py has an off-by-one)\n")
        try:
            async with LongLivedClient(url, api_key=api_key) as client:
                result = await client.rollout(demo_request(model), workspace.tool_fns(timeline.tool_output), timeline.on_event)
        except ProtocolFailure as e:
            console.print(f"[bold red]the server refused the rollout: {escape(str(e))}[/]")
            return 1
        except (OSError, TimeoutError, WebSocketException) as e:  # refused, 401 at the handshake, dropped
            console.print(f"[bold red]cannot talk to {escape(url)}: {escape(type(e).__name__)}: {escape(str(e))}[/]")
            return 2
        console.print()
        timeline.summary(result)
        started = time.perf_counter()
        check = await asyncio.to_thread(workspace.test_run)
        took = (time.perf_counter() - started) * 1e3
        status = result.response.get("status")
        console.print()
        if check.exit_code == 0:
            console.print(f"[bold green]✓ tests pass[/] after the rollout: exit code 0 ({escape(check.tail(1))}, {took:.0f} ms)")
        else:
            console.print(f"[bold red]✗ tests still fail[/]: exit code {check.exit_code}\n{escape(check.tail())}")
        if status != "completed":
            console.print(f"[bold red]✗ the rollout did not complete[/] (status {status})")
        return 0 if status == "completed" and check.exit_code == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="responses-lab demo", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", help="ws://HOST:PORT/v1/responses of a running server (default: start one on loopback)")
    parser.add_argument("--model", default="mock-1000tps", help="mock model (default: %(default)s)")
    parser.add_argument("--api-key", default=os.environ.get("RESPONSES_LAB_API_KEY"), help="bearer key, if the server wants one")
    args = parser.parse_args(argv)
    if args.url:
        return asyncio.run(run_demo(args.url, args.model, api_key=args.api_key))
    from proto.server.run import serving  # the server is only needed when the demo brings its own

    # A throwaway store and ledger: the demo leaves no database behind.
    with serving(db=":memory:") as url:
        return asyncio.run(run_demo(url, args.model))
