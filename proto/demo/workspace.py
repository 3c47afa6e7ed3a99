"""The local tools the client runs for the model, over one repository directory: grep, read_file,
apply_patch and run_tests, each for real (files, regexes, a pytest subprocess)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proto.client.longlived import ToolFn
from proto.demo.errors import ToolError
from proto.demo.patch import Hunk, apply_hunks, parse_unified_diff


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

        tools = {
            "grep": self.grep,
            "read_file": self.read_file,
            "apply_patch": self.apply_patch,
            "run_tests": self.run_tests,
        }
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
                changes = [
                    self._patched(path, hunks)
                    for path, hunks in parse_unified_diff(_str_arg(args, "patch"), default)
                ]
            elif "search" in args:
                changes = [
                    self._replaced(
                        _str_arg(args, "path"), _str_arg(args, "search"), str(args.get("replace", ""))
                    )
                ]
            else:
                raise ToolError('give "patch" (a unified diff) or "path" + "search" + "replace"')
        except ToolError as e:
            return f"error: {e}; nothing was written"
        for path, text, _ in changes:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return "applied: " + ", ".join(
            f"{path.relative_to(self.root)} ({summary})" for path, _, summary in changes
        )

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
                done = subprocess.run(
                    command,
                    cwd=self.root,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout_s,
                    check=False,
                )
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
            p
            for p in start.rglob("*")
            if p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(self.root).parts)
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
