"""``responses-lab soak``: many long-lived rollouts (plus a share of HTTP traffic) against one server process,
bounded in count and time, on loopback only.

It reports errors, the per-turn API overhead (TTFT minus the modelled prefill and queue wait the server
reports for that turn, as the latency lab defines it) at p50/p99, the server's RSS over time (psutil on
the server process), and the asyncio tasks still alive on the server once every client has gone
(``responses_lab_tasks`` on ``/metrics``: a leak of one task per connection shows as a number ≫ baseline).
``--suspended K`` then holds K responses suspended at once and reports the RSS each one costs.

Its clients retry a create refused at the door (``rate_limit_exceeded``: 429 over HTTP, the error envelope
over WebSocket; nothing had started) as OpenAI's SDK does (``proto.client.retry``), up to ``--max-retries``
times, and it reports how many creates were shed and retried, how many rollouts failed after they had
started (``failed_mid_rollout``: admitted work that was not carried to its end), and each rollout's e2e
time from its first create to its terminal event, waits included.

Without ``--url`` it starts ``responses-lab serve`` itself (a subprocess, so its RSS is its own) on a free
port with a throwaway database, and raises this process's open-file limit to the hard limit first (the
server inherits it): N connections need N descriptors on each side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import random
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

import httpx
import psutil

from proto.client import messages
from proto.client.http import HttpClient
from proto.client.longlived import LongLivedClient
from proto.client.retry import REFUSED, retry_delay
from proto.core.events import TERMINAL_TYPES
from proto.helpfmt import HelpFormatter
from proto.lab.analysis.metrics import percentile
from proto.processes import ChildServer

TOOLS = [{"type": "function", "name": "grep"}]
FAST_OVERRIDE = "mock-4000tps:prefill-overhead=1,prefill-time-per-token=0"


@dataclass
class Report:
    command: str
    connections: int
    turns: int
    http_share: float
    rollouts_ok: int = 0
    turns_ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    failed_mid_rollout: int = 0  # a rollout that had started and did not complete
    creates_shed: int = 0  # creates refused at the door (each rollout may be refused several times)
    retries: int = 0  # creates sent again after a refusal
    e2e_s_p50: float = 0.0  # a completed rollout: first create sent → terminal event, retry waits included
    e2e_s_p99: float = 0.0
    wall_s: float = 0.0
    overhead_ms_p50: float = 0.0
    overhead_ms_p99: float = 0.0
    ttft_ms_p50: float = 0.0
    ttft_ms_p99: float = 0.0
    rss_mb: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, MB)
    tasks_before: int = 0
    tasks_after: int = 0
    sessions_after: int = 0
    suspended: int = 0
    suspended_rss_mb_before: float = 0.0
    suspended_rss_mb_after: float = 0.0
    suspended_kb_per_response: float = 0.0


class Soak:
    def __init__(self, url: str, args: argparse.Namespace, server: psutil.Process | None) -> None:
        self.http_url = url.rstrip("/")
        self.ws_url = "ws" + self.http_url[4:] + "/v1/responses"
        self.args = args
        self.server = server
        self.overheads: list[float] = []
        self.ttfts: list[float] = []
        self.e2es: list[float] = []
        self.rng = random.Random(0)
        self.report = Report(" ".join(sys.argv), args.connections, args.turns, args.http_share)

    def error(self, kind: str) -> None:
        self.report.errors[kind] = self.report.errors.get(kind, 0) + 1

    def script(self) -> str:
        calls = [f'!call grep {{"turn": {k}}}' for k in range(self.args.turns - 1)]
        return "\n".join(["Soak the server.", *calls, "!say done"])

    # ------------------------------------------------------------------------------ one rollout each
    def body(self) -> dict[str, Any]:
        return messages.body(self.args.model, self.script(), tools=TOOLS)

    async def refused(self, code: str, headers: dict[str, str] | None, attempt: int) -> bool:
        """A create refused at the door: wait as the SDK would and say to ask again (False: give up)."""
        if code != REFUSED:
            return False
        self.report.creates_shed += 1
        if attempt > self.args.max_retries:
            return False
        self.report.retries += 1
        await asyncio.sleep(retry_delay(headers, attempt, self.rng))
        return True

    def ended(self, status: str, started: float) -> None:
        """A rollout that had started reached its terminal event."""
        if status == "completed":
            self.report.rollouts_ok += 1
            self.e2es.append(time.perf_counter() - started)
        else:
            self.report.failed_mid_rollout += 1
            self.error(status)

    async def longlived(self, index: int) -> None:
        await asyncio.sleep(index * self.args.ramp_s / max(1, self.args.connections))
        started = time.perf_counter()
        async with LongLivedClient(self.ws_url, open_timeout=60) as client:
            create = messages.create(self.body())
            sent = await client.send(create)
            first: float | None = None
            attempt = 0
            while True:
                event = await client.recv()
                kind = event.type
                if first is None and kind.endswith(".delta"):
                    first = event.t
                if kind == "error":
                    code = event.data["error"]["code"]
                    attempt += 1
                    if await self.refused(code, event.data.get("headers"), attempt):
                        sent, first = await client.send(create), None
                        continue
                    self.error(code)
                    return
                if kind == "response.done" or kind in TERMINAL_TYPES:
                    self.turn(event.data["response"], sent, first)
                    if kind in TERMINAL_TYPES:
                        self.ended(event.data["response"]["status"], started)
                        return
                    sent, first = (
                        await client.send(messages.append(messages.outputs(event.data["pending_calls"]))),
                        None,
                    )

    def turn(self, response: dict[str, Any], sent: float, first: float | None) -> None:
        self.report.turns_ok += 1
        turns = (response.get("lab") or {}).get("turns") or []
        if first is None or not turns:
            return
        ttft = (first - sent) * 1e3
        self.ttfts.append(ttft)
        self.overheads.append(ttft - turns[-1]["prefill_ms"] - turns[-1]["queue_wait_ms"])

    async def http(self, index: int, client: HttpClient) -> None:
        """Each request is a new response: any of them may be refused at the door, and is asked again."""
        await asyncio.sleep(index * self.args.ramp_s / max(1, self.args.connections))
        started = time.perf_counter()
        base = self.body()
        body = base
        attempt = 0
        while True:
            reply = await client.post(body)
            if reply.status_code == 429:
                attempt += 1
                if await self.refused(reply.json()["error"]["code"], dict(reply.headers), attempt):
                    continue
            if reply.status_code != 200:
                self.error(f"http_{reply.status_code}")
                if body is not base:
                    self.report.failed_mid_rollout += 1
                return
            attempt = 0
            response = reply.json()
            self.report.turns_ok += 1
            calls = messages.function_calls(response)
            if not calls:
                self.ended(response["status"], started)
                return
            body = messages.continuation(base, messages.outputs(calls), response["id"])

    async def guarded(self, work: Any) -> None:
        try:
            await work
        except Exception as exc:
            self.error(type(exc).__name__)

    # ------------------------------------------------------------------------------ the whole run
    async def run(self) -> Report:
        report = self.report
        report.tasks_before = int((await self.metrics())["responses_lab_tasks"])
        started = time.perf_counter()
        sampler = asyncio.create_task(self.sample_rss(started))
        n_http = round(self.args.connections * self.args.http_share)
        async with HttpClient(self.http_url, timeout=120, max_connections=max(1, n_http)) as client:
            work = [self.longlived(i) for i in range(self.args.connections - n_http)]
            work += [self.http(i, client) for i in range(n_http)]
            try:
                async with asyncio.timeout(self.args.max_s):
                    await asyncio.gather(*(self.guarded(w) for w in work))
            except TimeoutError:
                self.error("soak_time_limit")
        report.wall_s = time.perf_counter() - started
        report.sessions_after, report.tasks_after = await self.settle()
        if self.args.suspended:
            await self.hold_suspended(self.args.suspended)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await self.sample_once(started)
        for name, values in (("overhead_ms", self.overheads), ("ttft_ms", self.ttfts), ("e2e_s", self.e2es)):
            if values:
                setattr(report, f"{name}_p50", round(percentile(values, 50), 3))
                setattr(report, f"{name}_p99", round(percentile(values, 99), 3))
        return report

    async def settle(self) -> tuple[int, int]:
        """Once every client is gone: WebSocket sessions and tasks left on the server."""
        metrics: dict[str, float] = {}
        for _ in range(200):
            metrics = await self.metrics()
            if metrics["responses_lab_ws_sessions"] == 0:
                break
            await asyncio.sleep(0.05)
        return int(metrics["responses_lab_ws_sessions"]), int(metrics["responses_lab_tasks"])

    async def hold_suspended(self, count: int) -> None:
        """``count`` long-lived responses suspended at once (each waits on a tool call): RSS per response."""
        report = self.report
        report.suspended = count
        await asyncio.sleep(0.5)
        report.suspended_rss_mb_before = self.rss_mb()
        sockets: list[LongLivedClient] = []
        try:
            for start in range(0, count, 100):  # in waves: the handshakes are the slow part
                sockets += await asyncio.gather(*(self.suspend_one() for _ in range(min(100, count - start))))
            await asyncio.sleep(0.5)
            report.suspended_rss_mb_after = self.rss_mb()
            report.suspended_kb_per_response = round(
                (report.suspended_rss_mb_after - report.suspended_rss_mb_before) * 1024 / count, 1
            )
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)

    async def suspend_one(self) -> LongLivedClient:
        client = LongLivedClient(self.ws_url, max_size=2**20, open_timeout=60)
        await client.connect()
        await client.send(messages.create(self.body()))
        while (kind := (await client.recv()).type) != "response.done":
            if kind == "error" or kind in TERMINAL_TYPES:
                self.error(f"suspend_{kind}")
                break
        return client

    # ------------------------------------------------------------------------------ observation
    async def metrics(self) -> dict[str, float]:
        async with httpx.AsyncClient(base_url=self.http_url, timeout=30) as client:
            text = (await client.get("/metrics")).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(("responses_lab_tasks ", "responses_lab_ws_sessions ")):
                name, value = line.split()
                values[name] = float(value)
        return values

    def rss_mb(self) -> float:
        return self.server.memory_info().rss / 2**20 if self.server is not None else 0.0

    async def sample_rss(self, started: float) -> None:
        while True:
            await self.sample_once(started)
            await asyncio.sleep(self.args.sample_s)

    async def sample_once(self, started: float) -> None:
        if self.server is not None:
            self.report.rss_mb.append((round(time.perf_counter() - started, 2), round(self.rss_mb(), 1)))


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
URLS = "http://HOST:PORT, http://HOST:PORT/v1 or ws://HOST:PORT/v1/responses[?protocol=longlived]"
URL_HELP = f"a running server on loopback (default: start one), as {URLS}"


def http_base(url: str) -> str:
    """The server's HTTP base (``http://HOST:PORT``) from any URL a user would pass as ``--url``: the base
    itself (``demo --url``), the API base (``…/v1``), or the WebSocket endpoint (``ws://…/v1/responses``,
    as ``bench --url`` takes it, with or without ``?protocol=longlived``). Anything else is refused with a
    message that says what is accepted."""
    parts = urlsplit(url)
    scheme = _SCHEMES.get(parts.scheme)
    path = parts.path.rstrip("/")
    if (
        scheme is None
        or not parts.hostname
        or path not in ("", "/v1", "/v1/responses")
        or parts.query not in ("", "protocol=longlived")
    ):
        raise SystemExit(f"--url {url!r}: expected the server's URL, as {URLS}")
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise SystemExit(f"soak runs against loopback only, not {host!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter, prog="responses-lab soak", description=__doc__.split("\n\n")[0]
    )
    target = parser.add_argument_group("the server")
    load = parser.add_argument_group("the load")
    output = parser.add_argument_group("the report")
    target.add_argument("--url", default=None, help=URL_HELP)
    target.add_argument(
        "--server-pid", type=int, default=None, help="with --url: the server's pid, for its RSS"
    )
    load.add_argument("--connections", type=int, default=100, help="rollouts run at once (long-lived + HTTP)")
    load.add_argument("--turns", type=int, default=10, help="model turns per rollout (turns-1 tool calls)")
    load.add_argument(
        "--http-share",
        type=float,
        default=0.1,
        help="share of the rollouts run over HTTP (previous_response_id)",
    )
    load.add_argument(
        "--suspended",
        type=int,
        default=0,
        help="then hold this many responses suspended at once: RSS per response",
    )
    load.add_argument("--model", default="mock-4000tps", help="the mock model every rollout runs on")
    load.add_argument(
        "--max-retries",
        type=int,
        default=100,
        help="times a client asks again after its create was refused at the door (the openai SDK's: 2)",
    )
    target.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="a flag for the server it starts, e.g. --server-flag=--max-admitted=500 (repeatable)",
    )
    load.add_argument("--ramp-s", type=float, default=2.0, help="connections start spread over this long")
    load.add_argument("--max-s", type=float, default=300.0, help="the run's time limit (an error if reached)")
    output.add_argument("--sample-s", type=float, default=1.0, help="RSS sampling interval")
    output.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    for name in ("connections", "turns", "suspended"):
        if not 0 <= getattr(args, name) <= 100_000:
            parser.error(f"--{name} must be within 0..100000 (the soak is bounded)")
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    raise_fd_limit()
    if args.url is not None:
        url = http_base(args.url)
        check_loopback(url)
        process = psutil.Process(args.server_pid) if args.server_pid else None
        report = asyncio.run(Soak(url, args, process).run())
    else:
        with (
            tempfile.TemporaryDirectory() as tmp,
            ChildServer(
                ["--model-override", FAST_OVERRIDE, *args.server_flag], db=str(Path(tmp) / "soak.db")
            ) as server,
        ):
            report = asyncio.run(Soak(server.http_url, args, server.process).run())
    text = json.dumps(asdict(report), indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
