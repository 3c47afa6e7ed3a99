"""What a response cut after a second of streaming is billed, per transport (issue 13's first finding).

    .venv/bin/python scripts/cut_billing.py [--model mock-1000tps] [--seconds 1]

Starts ``responses-lab serve`` as a child process on a file database. Per transport, one ``!tokens 100000``
response streams for ``--seconds``, then is cut: ``response.cancel`` on the long-lived protocol (the client
reads on to the terminal event), a dropped connection on GA WebSocket and SSE, a cancelled request for
JSON. Prints the output tokens the client counted (tokenizing each delta), the terminal event's usage
where one was heard, and the ledger row (read from the database file once the server has flushed it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

from proto.core.events import TERMINAL_TYPES
from proto.processes import ChildServer
from sampler.tokens import Tokenizer

DELTAS = {"response.output_text.delta", "response.function_call_arguments.delta"}
_tokenizer = Tokenizer()


def tokens(events: list[dict[str, Any]]) -> int:
    return sum(_tokenizer.count(e["delta"]) for e in events if e["type"] in DELTAS)


async def cut(server: ChildServer, transport: str, model: str, seconds: float) -> tuple[str | None, int, int | None]:
    """(response id, tokens received, the terminal event's output tokens)."""
    body = {"model": model, "input": "!tokens 100000 !say never", "store": False}
    events: list[dict[str, Any]] = []
    if transport in ("longlived", "ga"):
        async with connect(server.ws_url + ("?protocol=longlived" if transport == "longlived" else ""), max_size=None) as ws:
            await ws.send(json.dumps({"type": "response.create", **body}))
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                events.append(json.loads(await ws.recv()))
            if transport == "ga":
                ws.transport.abort()
                return events[0]["response"]["id"], tokens(events), None
            await ws.send(json.dumps({"type": "response.cancel"}))
            while events[-1]["type"] not in TERMINAL_TYPES:
                events.append(json.loads(await ws.recv()))
        return events[0]["response"]["id"], tokens(events), events[-1]["response"]["usage"]["output_tokens"]
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        if transport == "sse":
            async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
                end = time.perf_counter() + seconds
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[len("data: ") :]))
                    if time.perf_counter() >= end:
                        break
            return events[0]["response"]["id"], tokens(events), None
        request = asyncio.create_task(http.post("/v1/responses", json=body))
        await asyncio.sleep(seconds)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        return None, 0, None


async def main(model: str, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "cut.db"
        with ChildServer(["--model-override", f"{model}:max-output-tokens=100000"], db=str(db)) as server:
            results = [(t, *await cut(server, t, model, seconds)) for t in ("longlived", "ga", "sse", "json")]
            await asyncio.sleep(0.5)  # the ledger writer commits within milliseconds
            with sqlite3.connect(db) as sql:
                rows = {r[0]: r[1:] for r in sql.execute("SELECT response_id, mode, status, reason, input_tokens, output_tokens FROM usage")}
            sql.close()
    print(f"{model}, cut after {seconds} s of streaming")
    print("| transport | how | tokens received | terminal usage.output_tokens | ledger row (status, reason, input, output) |")
    print("|---|---|---|---|---|")
    how = {"longlived": "response.cancel", "ga": "connection dropped", "sse": "connection dropped", "json": "request cancelled"}
    named = {response_id for _, response_id, _, _ in results}
    for transport, response_id, received, heard in results:
        # The JSON client never learns its id: its row is the HTTP one no other transport named.
        row = rows.get(response_id) if response_id else next((r for i, r in rows.items() if r[0] == "http" and i not in named), None)
        shown = row[1:] if row else None
        print(f"| {transport} | {how[transport]} | {received} | {heard if heard is not None else '-'} | {shown} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mock-1000tps")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    asyncio.run(main(args.model, args.seconds))
