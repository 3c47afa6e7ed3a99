"""Can a script-driven size stall another stream? Gaps of a steady stream as a ratio of its modelled ITL.

    .venv/bin/python scripts/stall_ratio.py [--runs 3] [--heavy 2] [--tokens 30000000]

Starts ``responses-lab serve`` as a child process, and the heavy clients each in a process of their own, so
that no client's decoding shares a loop or a GIL with the server or the measured client. One steady long-lived stream on mock-65tps (``!tokens 200``: 15.4 ms modelled ITL) is measured at the client,
first alone (the floor this machine gives, same run), then with ``--heavy`` connections running
``!tokens --tokens`` on a burst model (mock-1000tps with a 0.1 µs ITL: its whole output is due at once), one
of them with ``max_output_tokens: 1`` (issue 13: that stalled every stream for 4.3 s). Prints, per phase,
the gap median, p99 and max divided by the modelled ITL, and the heavy responses' output tokens (bounded
by the model's ``max-output-tokens``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from typing import Any

from websockets.asyncio.client import connect

from proto.client.child import ChildServer
from sampler.models import MODELS

STEADY = "mock-65tps"
BURST = "mock-1000tps:prefill-overhead=1,prefill-time-per-token=0,inter-token-latency=0.0001"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


async def response(url: str, script: str, model: str, **fields: Any) -> tuple[list[float], dict[str, Any]]:
    """(delta arrival times, terminal event) of one long-lived response."""
    arrivals: list[float] = []
    async with connect(url + "?protocol=longlived", max_size=None) as ws:
        body = {"type": "response.create", "model": model, "input": [{"role": "user", "content": script}], **fields}
        await ws.send(json.dumps(body))
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "response.output_text.delta":
                arrivals.append(time.perf_counter())
            if event["type"] in TERMINAL:
                return arrivals, event


async def heavy(url: str, tokens: int) -> list[int]:
    produced = []
    for fields in ({}, {"max_output_tokens": 1}, {}):
        _, terminal = await response(url, f"!tokens {tokens} !say burst", "mock-1000tps", **fields)
        produced.append(terminal["response"]["usage"]["output_tokens"])
    return produced


async def heavy_process(url: str, tokens: int) -> list[int]:
    worker = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--heavy-worker", url, "--tokens", str(tokens), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await worker.communicate()
    produced: list[int] = json.loads(out)
    return produced


def ratios(gaps: list[float], itl_s: float) -> str:
    ordered = sorted(gaps)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"median {statistics.median(gaps) / itl_s:5.2f}  p99 {p99 / itl_s:5.2f}  max {max(gaps) / itl_s:6.2f}"


async def main(runs: int, n_heavy: int, tokens: int) -> None:
    itl_s = MODELS[STEADY].inter_token_latency_ms / 1e3
    with ChildServer(["--model-override", BURST]) as server:
        for run in range(runs):
            quiet, _ = await response(server.ws_url, "!tokens 200 !say steady", STEADY)
            steady = asyncio.create_task(response(server.ws_url, "!tokens 200 !say steady", STEADY))
            loads = await asyncio.gather(*(heavy_process(server.ws_url, tokens) for _ in range(n_heavy)))
            loaded, _ = await steady
            print(f"run {run + 1}: alone   {ratios([b - a for a, b in itertools.pairwise(quiet)], itl_s)}  (x {itl_s * 1e3:.1f} ms ITL)")
            print(f"run {run + 1}: beside  {ratios([b - a for a, b in itertools.pairwise(loaded)], itl_s)}  heavy output tokens {sorted(set(t for load in loads for t in load))}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heavy", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=30_000_000)
    parser.add_argument("--heavy-worker", metavar="URL", help=argparse.SUPPRESS)  # one heavy client process
    args = parser.parse_args()
    if args.heavy_worker:
        print(json.dumps(asyncio.run(heavy(args.heavy_worker, args.tokens))))
    else:
        asyncio.run(main(args.runs, args.heavy, args.tokens))
