"""Client CPU per streamed SSE event: httpx against aiohttp, on the engine hop's kind of stream.

    .venv/bin/python scripts/sse_clients.py [--events 20000] [--streams 16] [--repeat 3]

Why the engine hop (proto/engine/client.py) uses aiohttp: it reads one small chunk per token. A uvicorn
server in a subprocess (pinned to CPU 1 with taskset when there is one) streams ``--streams`` concurrent
responses of ``--events`` vLLM-shaped completion chunks each; this process (pinned to CPU 0) reads them
with each client, counting events, and reports its own CPU time per event (getrusage). Alternating runs,
``--repeat`` times each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import time

import aiohttp
import httpx

from proto.server.serve import free_port

SERVER = r"""
import asyncio, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

EVENT = (b'data: {"id":"cmpl-x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
         b'"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[279]}]}\n\n')

async def events(n):
    for _ in range(n):
        yield EVENT
        await asyncio.sleep(0)
    yield b"data: [DONE]\n\n"

async def completions(request):
    body = await request.json()
    return StreamingResponse(events(body["n"]), media_type="text/event-stream")

app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", http="httptools", loop="uvloop")
"""


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def with_httpx(url: str, events: int, streams: int) -> tuple[int, float]:
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=streams), timeout=60) as client:
        async def one() -> int:
            got = 0
            async with client.stream("POST", "/v1/completions", json={"n": events}) as reply:
                async for data in reply.aiter_raw():
                    got += data.count(b"\n\n")
            return got

        await one()  # warm the pool and the code paths
        start = cpu()
        got = sum(await asyncio.gather(*(one() for _ in range(streams))))
        return got, cpu() - start


async def with_aiohttp(url: str, events: int, streams: int) -> tuple[int, float]:
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=streams)) as session:
        async def one() -> int:
            got = 0
            async with session.post("/v1/completions", json={"n": events}) as reply:
                async for data in reply.content.iter_any():
                    got += data.count(b"\n\n")
            return got

        await one()
        start = cpu()
        got = sum(await asyncio.gather(*(one() for _ in range(streams))))
        return got, cpu() - start


async def compare(url: str, args: argparse.Namespace) -> None:
    for _ in range(args.repeat):
        for name, read in (("httpx", with_httpx), ("aiohttp", with_aiohttp)):
            got, seconds = await read(url, args.events, args.streams)
            print(f"{name:8} {got} events  client CPU {seconds / got * 1e6:.2f} µs/event", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    two = hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1
    port = free_port()
    pin = ["taskset", "-c", "1"] if two and shutil.which("taskset") else []
    server = subprocess.Popen([*pin, sys.executable, "-c", SERVER, str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):  # until the server answers at all (a 404 will do)
            try:
                httpx.get(url + "/", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        if two:
            os.sched_setaffinity(0, {0})
        import uvloop

        uvloop.run(compare(url, args))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
