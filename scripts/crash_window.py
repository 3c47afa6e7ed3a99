"""How long a response runs before its crash trace is durable: the window of the at-most-once guarantee.

    .venv/bin/python scripts/crash_window.py [--responses 50] [--progress-interval-s 1.0]

Starts ``responses-lab serve`` as a child process on a file database. For each of ``--responses`` long-lived
responses (a slow ``!tokens`` stream, cancelled once measured) it takes the time from ``response.created``
at the client to the moment its open row is visible in the database file (polled from this process, WAL:
committed rows only), and the time until that row first shows output tokens (its first durable
``progress``). A SIGKILL inside the first window leaves no trace of that response; inside the second, it
is billed its prompt and 0 output tokens. Prints p50 / p99 / max of both, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from websockets.asyncio.client import connect

from proto.processes import ChildServer

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(responses: int, interval: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "window.db"
        flags = ["--progress-interval-s", str(interval)]
        with ChildServer(flags, db=str(db)) as server:
            reader = sqlite3.connect(db, isolation_level=None)
            opened: list[float] = []
            progressed: list[float] = []
            async with connect(server.ws_url + "?protocol=longlived") as ws:
                for _ in range(responses):
                    body = {"type": "response.create", "model": "mock-65tps", "input": "!tokens 2000 !say go", "store": False}
                    await ws.send(json.dumps(body))
                    created = json.loads(await ws.recv())
                    start = time.perf_counter()
                    response_id = created["response"]["id"]
                    seen_open = seen_progress = None
                    while seen_progress is None:
                        row = reader.execute("SELECT output_tokens FROM open_responses WHERE response_id = ?", (response_id,)).fetchone()
                        now = time.perf_counter()
                        if row is not None and seen_open is None:
                            seen_open = now
                        if row is not None and row[0] > 0:
                            seen_progress = now
                        await asyncio.sleep(0.0002)
                    assert seen_open is not None
                    opened.append((seen_open - start) * 1e3)
                    progressed.append((seen_progress - start) * 1e3)
                    await ws.send(json.dumps({"type": "response.cancel"}))
                    while json.loads(await ws.recv())["type"] not in TERMINAL:
                        pass
            reader.close()
    for name, values in (("open row durable after response.created", opened), ("first progress durable", progressed)):
        print(f"{name}: p50 {statistics.median(values):.2f} ms  p99 {pct(values, 0.99):.2f} ms  max {max(values):.2f} ms  (n={len(values)})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responses", type=int, default=50)
    parser.add_argument("--progress-interval-s", type=float, default=1.0)
    args = parser.parse_args()
    asyncio.run(main(args.responses, args.progress_interval_s))
