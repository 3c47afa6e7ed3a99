"""The response store's two costs on each database, side by side in one run: ``chain()`` of a stored
conversation (the store path of a reconnect) and ``put()`` (every ``store: true`` response).

    PYTHONPATH=. .venv/bin/python scripts/store_figures.py [--links 15] [--kb 25] [--calls 300]

SQLite: a file in a temporary directory (WAL, ``synchronous=NORMAL``). PostgreSQL: a throwaway server with
its default durability (``fsync`` on, tests/databases.py) over loopback TCP. One caller, calls in turn,
from the event loop as the server makes them (each on the store's threads). Prints p50/p90 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's throwaway PostgreSQL

from databases import PostgresServer  # noqa: E402

from proto.lab.metrics import percentile  # noqa: E402
from proto.server.storage.store import ResponseStore  # noqa: E402


async def measure(url: str, links: int, kb: int, calls: int) -> dict[str, tuple[float, float]]:
    store = ResponseStore(url)
    previous = None
    for i in range(links):  # one conversation: `links` responses of `kb` KiB each
        body = b'{"id": "resp_%d", "output": "%s"}' % (i, b"x" * (kb * 1024))
        await store.put(f"resp_{i}", "key", body, b"[]", previous, "m")
        previous = f"resp_{i}"
    figures = {}
    for name, call in (
        ("chain", lambda n: store.chain(f"resp_{links - 1}", "key")),
        ("put", lambda n: store.put(f"put_{n}", "key", b'{"id": 1}', b"[]", None, "m")),
    ):
        for n in range(20):  # warm: pooled connections open, statements prepared
            await call(-n - 1)
        times = []
        for n in range(calls):
            t0 = time.perf_counter()
            await call(n)
            times.append((time.perf_counter() - t0) * 1e3)
        figures[name] = (percentile(times, 50), percentile(times, 90))
    await store.aclose()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=int, default=15)
    parser.add_argument("--kb", type=int, default=25)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        pg = PostgresServer(durable=True).start()
        try:
            for name, url in (("sqlite", f"{scratch}/store.sqlite3"), ("postgresql", pg.fresh())):
                figures = asyncio.run(measure(url, args.links, args.kb, args.calls))
                for call, (p50, p90) in figures.items():
                    print(f"{name:10} {call:5} ({args.links} x {args.kb} KiB chain): p50 {p50:.3f} ms  p90 {p90:.3f} ms")
        finally:
            pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
