"""``perf profile``: what a py-spy run (``perf --profile DIR …``) spent its samples on."""

from __future__ import annotations

import argparse
from pathlib import Path

IDLE = ("select (", "poll (", "_run_once (selectors")  # the event loop's idle wait, left out


def frame_name(frame: str) -> str:
    """``function (path/to/file.py:line)`` → ``function (file.py)``: one name per function, whatever the
    line."""
    if " (" not in frame:
        return frame
    function, where = frame.split(" (", 1)
    return f"{function} ({where.split(':')[0].rsplit('/', 1)[-1]})"


def shares(paths: list[str]) -> tuple[int, dict[str, int], dict[str, int]]:
    """(busy samples, self samples by function, inclusive samples by function) of py-spy raw (collapsed)
    stacks."""
    selfs: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for path in paths:
        for line in Path(path).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [frame_name(f) for f in stack.split(";")]
            if not frames or frames[-1].startswith(IDLE):
                continue
            n = int(count)
            total += n
            selfs[frames[-1]] = selfs.get(frames[-1], 0) + n
            for f in set(frames):
                incl[f] = incl.get(f, 0) + n
    return total, selfs, incl


def cmd_profile(args: argparse.Namespace) -> None:
    """Self and inclusive shares of py-spy's raw stacks, the event loop's idle wait left out."""
    total, selfs, incl = shares(args.files)
    print(f"{total} busy samples")
    for title, table in (("self", selfs), ("inclusive", incl)):
        print(f"-- {title}")
        for name, n in sorted(table.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{n / total:7.1%}  {name}")
