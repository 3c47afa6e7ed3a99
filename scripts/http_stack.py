"""Round trip of one small POST /v1/responses per uvicorn stack (event loop x HTTP parser).

    .venv/bin/python scripts/http_stack.py [--requests 300]

For each of asyncio+h11, asyncio+httptools, uvloop+h11, uvloop+httptools: a server in a child
process (``uvicorn_config(settings, loop=..., http=...)``, nothing else changed), a 4 000 tok/s model
with a 1 ms prefill answering ``!say hi``, one request at a time from an httpx client on keep-alive.
Reports round-trip p50/p90 and the server process's CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time

import httpx
import psutil

from proto.server.config import Settings
from proto.server.serve import LabServer, free_port, uvicorn_config

MODEL = "mock-4000tps"


def serve(port: int, loop: str, http: str) -> None:
    settings = Settings(db=":memory:", port=port, model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0"])
    LabServer(uvicorn_config(settings, loop=loop, http=http)).run()


async def measure(url: str, n: int, pid: int) -> tuple[float, float, float]:
    body = {"model": MODEL, "input": "!say hi"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for _ in range(50):  # warm-up
            (await client.post("/v1/responses", json=body)).raise_for_status()
        proc = psutil.Process(pid)
        cpu0 = sum(proc.cpu_times()[:2])
        rtts = []
        for _ in range(n):
            t0 = time.perf_counter()
            (await client.post("/v1/responses", json=body)).raise_for_status()
            rtts.append(time.perf_counter() - t0)
        cpu = sum(proc.cpu_times()[:2]) - cpu0
    rtts.sort()
    return rtts[n // 2] * 1e3, rtts[int(n * 0.9)] * 1e3, cpu / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    print(f"{args.requests} sequential POST /v1/responses ({MODEL}, 1 ms prefill, '!say hi')")
    print(f"{'loop':<9}{'http':<11}{'RTT p50':>10}{'p90':>10}{'server CPU/req':>16}")
    for loop in ("asyncio", "uvloop"):
        for http in ("h11", "httptools"):
            port = free_port()
            child = multiprocessing.get_context("spawn").Process(target=serve, args=(port, loop, http), daemon=True)
            child.start()
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(url + "/healthz", timeout=1)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or not child.is_alive():
                        raise
                    time.sleep(0.1)
            assert child.pid is not None
            p50, p90, cpu = asyncio.run(measure(url, args.requests, child.pid))
            print(f"{loop:<9}{http:<11}{p50:>8.3f}ms{p90:>8.3f}ms{cpu:>14.3f}ms")
            child.terminate()
            child.join(10)


if __name__ == "__main__":
    main()
