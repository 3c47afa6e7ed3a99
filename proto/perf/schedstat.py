"""A process's CPU time and run-queue wait to the ns: the scheduler's own counts (/proc/PID/task/*/schedstat).

psutil's CPU times are in 10 ms ticks, too coarse for a per-token figure. A thread that has exited is no
longer counted: the servers measured here keep theirs (event loop, store writer and readers, ledger writer)
for their whole life.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil


def cpu_and_wait(process: psutil.Process) -> tuple[float, float]:
    """(CPU time, run-queue wait) of the process's threads, in seconds: schedstat's first two fields. The
    wait is time the server was ready to run but another process had the CPU — on a shared box, the share of
    a stall that is not the server's doing."""
    cpu = wait = 0
    for task in Path(f"/proc/{process.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            fields = (task / "schedstat").read_text().split()
            cpu += int(fields[0])
            wait += int(fields[1])
    return cpu / 1e9, wait / 1e9


def thread_cpu_seconds(process: psutil.Process) -> float:
    """CPU time the process's threads have used (the process alone: its children are not counted)."""
    return cpu_and_wait(process)[0]
