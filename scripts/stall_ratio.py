"""Can a script-driven size or a huge prompt stall another stream? Gaps as a ratio of the modelled ITL.

    .venv/bin/python scripts/stall_ratio.py [--runs 3] [--heavy 2] [--tokens 30000000] [--prompt-mb 4]

The server runs in this process (a thread with its own loop) with a monitor on its loop: the loop's lag
(how late a 1 ms sleep wakes) is the server-side stall, free of the clients' own CPU. Every client is a
process of its own. One steady long-lived stream on mock-65tps (``!tokens 200``: 15.4 ms modelled ITL) is
measured at its client, first alone (the floor this machine gives, same run), then beside ``--heavy``
clients that each send a ``--prompt-mb`` MB prompt (scanned and tokenized off the loop, then refused
``context_length_exceeded``) and three ``!tokens --tokens`` responses on a burst model (mock-1000tps with a
0.1 µs ITL: the whole output is due at once), one with ``max_output_tokens: 1`` (issue 13: that stalled
every stream for 4.3 s). Prints per phase: the steady stream's gap median / p99 / max over the ITL, the
server loop's lag p99 / max, and the heavy responses' output tokens (bounded by ``max-output-tokens``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

from websockets.asyncio.client import connect

from proto.server.config import Settings
from proto.server.serve import ThreadedServer
from sampler.models import MODELS

STEADY = "mock-65tps"
BURST = "mock-1000tps:prefill-overhead=1,prefill-time-per-token=0,inter-token-latency=0.0001"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


async def response(url: str, content: str, model: str, **fields: Any) -> tuple[list[float], dict[str, Any]]:
    """(delta arrival times, terminal event) of one long-lived response."""
    arrivals: list[float] = []
    async with connect(url + "?protocol=longlived", max_size=None) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": model, "input": content, "store": False, **fields}))
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "response.output_text.delta":
                arrivals.append(time.perf_counter())
            if event["type"] in TERMINAL:
                return arrivals, event


async def heavy(url: str, tokens: int, prompt_mb: float) -> list[int]:
    produced = []
    _, terminal = await response(url, "word " * int(prompt_mb * 2**20 / 5), "mock-1000tps")
    produced.append(terminal["response"]["usage"]["output_tokens"])
    for fields in ({}, {"max_output_tokens": 1}, {}):
        _, terminal = await response(url, f"!tokens {tokens} !say burst", "mock-1000tps", **fields)
        produced.append(terminal["response"]["usage"]["output_tokens"])
    return produced


async def worker(*args: str) -> Any:
    """A client process: ``--worker steady URL`` prints its gaps, ``--worker heavy URL TOKENS MB`` its outputs."""
    kind, url, *rest = args
    if kind == "steady":
        arrivals, _ = await response(url, "!tokens 200 !say steady", STEADY)
        return [b - a for a, b in itertools.pairwise(arrivals)]
    return await heavy(url, int(rest[0]), float(rest[1]))


async def spawn(*args: str) -> Any:
    process = await asyncio.create_subprocess_exec(sys.executable, __file__, "--worker", *args, stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    return json.loads(out)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(runs: int, n_heavy: int, tokens: int, prompt_mb: float) -> None:
    itl_s = MODELS[STEADY].inter_token_latency_ms / 1e3
    settings = replace(Settings(db=":memory:", port=0), model_override=[BURST])
    server = ThreadedServer(settings)
    await asyncio.to_thread(server.start)
    lags: list[float] = []

    async def monitor() -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - started - 0.001)

    assert server.loop is not None
    watch = asyncio.run_coroutine_threadsafe(monitor(), server.loop)
    try:
        for run in range(runs):
            for phase in ("alone", "beside"):
                lags.clear()
                work = [spawn("steady", server.url)]
                if phase == "beside":
                    work += [spawn("heavy", server.url, str(tokens), str(prompt_mb)) for _ in range(n_heavy)]
                gaps, *loads = await asyncio.gather(*work)
                lag = list(lags)
                outputs = sorted({t for load in loads for t in load})
                print(
                    f"run {run + 1} {phase:6}: gap/ITL median {statistics.median(gaps) / itl_s:5.2f} p99 {pct(gaps, 0.99) / itl_s:5.2f}"
                    f" max {max(gaps) / itl_s:6.2f}   server loop lag p99 {pct(lag, 0.99) * 1e3:6.2f} ms max {max(lag) * 1e3:6.2f} ms"
                    + (f"   heavy output tokens {outputs}" if outputs else ""),
                    flush=True,
                )
    finally:
        watch.cancel()
        await asyncio.to_thread(server.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heavy", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=30_000_000)
    parser.add_argument("--prompt-mb", type=float, default=4.0)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)  # a client process
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(worker(*args.worker))))
    else:
        asyncio.run(main(args.runs, args.heavy, args.tokens, args.prompt_mb))
