"""Unified diffs: the parser and the strict applier behind the ``apply_patch`` tool.

Pure text in, text out (no files): the workspace reads and writes, so a patch is checked whole before
anything touches the disk. Every refusal is a ToolError whose message goes to the model as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from proto.demo.errors import ToolError


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
        if (
            line.startswith(("diff ", "index ", "--- ", "new file mode", "deleted file mode"))
            or not line.strip()
        ):
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
                raise ToolError(
                    f"hunk at patch line {header_line} ends early (its @@ counts promise more lines)"
                )
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
            return (
                f"line {n + 1} is {lines[n]!r}, the hunk expects {expected!r} (and it matches nowhere else)"
            )
    return "its lines match only where an earlier hunk already changed the file"
