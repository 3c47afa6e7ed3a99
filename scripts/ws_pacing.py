"""Real-clock pacing over a real WebSocket: configured vs observed tokens/s, modelled vs observed TTFT.

    .venv/bin/python scripts/ws_pacing.py [--tokens 4000] [--runs 5] [--url ws://…/v1/responses]

Starts its own server on a free loopback port unless ``--url`` is given. Per model, ``--runs``
long-lived rollouts of one final message of ``--tokens`` tokens (``!tokens N !say``): observed tokens/s
is (deltas − 1) / (last delta − first delta) at the client; TTFT is ``response.create`` sent → first
``response.output_text.delta``; the modelled part is the server's reported prefill + queue wait for
that turn (``response.lab.turns``), so TTFT − modelled is what the API and the wire add.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

from proto.client.longlived import LongLivedClient
from proto.server.serve import serving

MODELS = ("mock-65tps", "mock-1000tps", "mock-4000tps")


async def one(url: str, model: str, tokens: int) -> dict[str, float]:
    async with LongLivedClient(url) as client:
        script = f"pacing\n!tokens {tokens} !say go"
        result = await client.rollout({"model": model, "input": script}, tools={})
    sent = result.events[0].t
    deltas = [e.t for e in result.events if e.type == "response.output_text.delta"]
    turn: dict[str, Any] = result.response["lab"]["turns"][0]
    modelled = turn["prefill_ms"] + turn["queue_wait_ms"]
    ttft = (deltas[0] - sent) * 1e3
    return {
        "observed_tps": (len(deltas) - 1) / (deltas[-1] - deltas[0]),
        "ttft_ms": ttft,
        "modelled_ms": modelled,
        "overhead_ms": ttft - modelled,
        "deltas": float(len(deltas)),
    }


async def main(url: str, tokens: int, runs: int) -> None:
    print(f"{'model':14} {'config tok/s':>12} {'observed':>10} {'TTFT ms':>9} {'modelled':>9} {'API+wire':>9}  ({runs} runs, {tokens} tokens, medians)")
    for model in MODELS:
        n = min(tokens, 650) if model == "mock-65tps" else tokens  # 65 tok/s: keep each run ~10 s
        rows = [await one(url, model, n) for _ in range(runs)]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        configured = float(model.split("-")[1].removesuffix("tps"))
        print(f"{model:14} {configured:12.0f} {med['observed_tps']:10.1f} {med['ttft_ms']:9.2f} {med['modelled_ms']:9.2f} {med['overhead_ms']:9.2f}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.tokens, args.runs))
        return
    with serving() as url:
        asyncio.run(main(url, args.tokens, args.runs))


if __name__ == "__main__":
    cli()
