"""``perf rss``: server RSS per suspended long-lived response, by context size (each context distinct)."""

from __future__ import annotations

import argparse
import asyncio
import json

from websockets.asyncio.client import ClientConnection, connect

import proto.client.messages as messages
from proto.core.events import TERMINAL_TYPES
from proto.perf.servers import lab_server, servers
from proto.perf.workload import FAST, MODEL, rollout_body
from proto.processes import ChildServer


async def suspend_one(url: str, context: int, salt: int) -> ClientConnection:
    """A long-lived response over a ``context``-token history of its own, suspended on a tool call."""
    ws = await connect(url + "?protocol=longlived", max_size=2**26, compression=None, ping_interval=None)
    script = f"Hold {salt}.\n!call grep {{}}\n!say done"
    await ws.send(json.dumps(messages.create(rollout_body(script, context, salt))))
    while (kind := json.loads(await ws.recv())["type"]) != "response.done":
        if kind == "error" or kind in TERMINAL_TYPES:
            raise RuntimeError(kind)
    return ws


async def rss_once(server: ChildServer, context: int, count: int) -> tuple[float, float]:
    """RSS per response over the first ``count`` held at once, and per response over ``count`` more."""
    warm = [await suspend_one(server.ws_url, context, 10_000 + k) for k in range(2)]
    for ws in warm:
        await ws.close()
    await asyncio.sleep(0.5)
    rss = [server.process.memory_info().rss]
    held: list[ClientConnection] = []
    for wave in range(2):
        held += [await suspend_one(server.ws_url, context, wave * count + k + 1) for k in range(count)]
        await asyncio.sleep(0.5)
        rss.append(server.process.memory_info().rss)
    for ws in held:
        await ws.close()
    return (rss[1] - rss[0]) / count, (rss[2] - rss[1]) / count


def cmd_rss(args: argparse.Namespace) -> None:
    print(
        f"server RSS per suspended long-lived response, each context distinct: the first {args.count} held "
        f"at once,"
    )
    print(
        f"then {args.count} more. The mock GPU's KV pool (30 000 blocks of 16 tokens) is shared and bounded: "
        f"once"
    )
    print("it is full a response pins nothing more, so the second figure is what a response itself holds")
    print(f"{'server':<10}{'context':>9}{'first':>12}{'B/token':>9}{'next':>12}{'B/token':>9}")
    for label, path in servers(args):
        for context in args.contexts:
            with lab_server(["--model-override", f"{MODEL}:{FAST}", *args.flags], path) as server:
                first, more = asyncio.run(rss_once(server, context, args.count))
            print(
                f"{label:<10}{context:>9}{first / 2**20:>10.3f}MB{first / context:>9.1f}"
                f"{more / 2**20:>10.3f}MB{more / context:>9.1f}"
            )
