"""Running the lab: a server per profile, the floor, then every (workload, model, mode) cell in turn.

Per cell: each of ``sessions`` concurrent clients opens its connection, runs ``warmup`` short rollouts (not
counted), then — after every session has warmed up — ``rollouts`` measured rollouts. The server's CPU time
is read around the measured part only. Cells run one after another, never overlapping, so modes never
share the two cores.

``reconnect=K``: two servers per profile share one database (``db``, else a temporary SQLite file), and
the ``ws`` clients reconnect to the other one every K turns (proto/lab/clients.py); the servers' CPU is
summed. With ``url``, a second URL after a comma is the other server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil
from websockets.asyncio.client import connect

from proto.client.child import ChildEngine, ChildServer, cpu_seconds
from proto.lab.clients import Transport, make_client
from proto.lab.metrics import Trace
from proto.lab.plan import build_plan, shorten
from sampler.policy import Workload, load_workload


@dataclass(frozen=True)
class Profile:
    """Hop latencies of the remote services the seed's design removed or shortened (server flags)."""

    name: str
    safety_hop_ms: float
    resolve_hop_ms: float


# Values argued in NOTES.md (the lab's "Profiles"): a BERT-scale safety classifier behind an in-region RPC
# (10–50 ms per check in published guardrail budgets; we take 20 ms), and one in-region RPC to a
# routing/config service for model resolution (inter-AZ RTT 1.3–2.1 ms measured on EC2; we take 2 ms).
PROFILES: dict[str, Profile] = {
    "local": Profile("local", 0.0, 0.0),
    "production-like": Profile("production-like", 20.0, 2.0),
}


@dataclass
class BenchConfig:
    modes: tuple[str, ...] = ("http", "http-prev", "ws", "longlived")
    workloads: tuple[str, ...] = ("coding-agent",)
    models: tuple[str, ...] = ("mock-1000tps",)
    profiles: tuple[str, ...] = ("local", "production-like")
    sessions: int = 4
    rollouts: int = 2  # measured, per session
    warmup: int = 1  # per session, before the measured ones
    warmup_turns: int = 3  # warm-up rollouts are this short: they warm code paths and connections only
    turns: int | None = None  # shorten the workload to this many turns (None: all)
    tool_time_scale: float = 1.0
    pings: int = 500
    url: str | None = None
    api_key: str | None = None
    quick: bool = False
    # Passed to every server the lab starts (``--model-override``): ask "what if prefill were 10x faster?"
    # or "what if suspended responses lost their KV pins?" (``pin-suspended=false``) on the same workload.
    model_overrides: tuple[str, ...] = ()
    reconnect: int = 0  # ws: a reconnect to the other server every K turns (0: never)
    db: str | None = None  # the lab's servers' --db (default: a memory database; reconnect, workers: a shared file)
    # The topology of the servers the lab starts: the engine (None: in process; a URL: that engine;
    # "spawn": a `responses-lab engine` the lab starts and every profile's server shares) and the API
    # processes in front of it (`serve --workers N`; N > 1 without an engine starts one of its own).
    engine: str | None = None
    workers: int = 1

    @classmethod
    def quick_preset(cls) -> BenchConfig:
        """< 3 min on 2 cores: 15 of coding-agent's 30 turns (history 6 k → 31 k tokens), mock-4000tps,
        tool waits ×0.1, 2 sessions × 1 measured rollout, 200 pings. Tool waits are identical in every mode
        and only dilute E2E ratios; the full run keeps them as recorded."""
        return cls(models=("mock-4000tps",), sessions=2, rollouts=1, turns=15, tool_time_scale=0.1, pings=200, quick=True)


@dataclass
class CellResult:
    profile: str
    workload: str
    model: str
    mode: str
    sessions: int
    traces: list[Trace]
    server_cpu_s: float | None
    wall_s: float


@dataclass
class BenchResult:
    config: BenchConfig
    pings_ms: dict[str, list[float]] = field(default_factory=dict)  # per profile
    cells: list[CellResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    wall_s: float = 0.0


# ---- the server ---------------------------------------------------------------------------------


def external_server_pid(url: str) -> int | None:
    """The local process listening on ``url``'s port, when psutil may see it (same user, loopback)."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    return None


# ---- the floor ----------------------------------------------------------------------------------


async def ping_rtts_ms(ws_url: str, count: int, api_key: str | None = None) -> list[float]:
    """WebSocket ping → pong round trips on one connection to the same server (answered by the server's
    WebSocket layer, below the app): the least any WebSocket turn can cost on this machine."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sep = "&" if "?" in ws_url else "?"
    rtts: list[float] = []
    async with connect(f"{ws_url}{sep}protocol=longlived", additional_headers=headers, ping_interval=None) as ws:
        for _ in range(count):
            t0 = time.perf_counter()
            await (await ws.ping())
            rtts.append((time.perf_counter() - t0) * 1e3)
    return rtts


# ---- one cell -----------------------------------------------------------------------------------


async def run_cell(
    mode: str,
    workload: Workload,
    model: str,
    config: BenchConfig,
    ws_url: str,
    http_url: str,
    cpu: Callable[[], float] | None,
    on_turn: Callable[[], None] | None = None,
    others: tuple[str, ...] = (),
) -> tuple[list[Trace], float | None, float]:
    """Warm up every session, then run the measured rollouts; returns (traces, server CPU s, wall s).
    ``others``: the other servers' WebSocket URLs, for ``config.reconnect``."""
    clients: list[Transport] = [
        make_client(mode, ws_url, http_url, config.api_key, config.reconnect, others) for _ in range(config.sessions)
    ]
    for client in clients:
        client.on_send = on_turn
    warm = shorten(workload, config.warmup_turns)
    try:
        await asyncio.gather(*(c.open() for c in clients))
        await asyncio.gather(*(_rollouts(c, warm, model, config, config.warmup) for c in clients))
        cpu0, t0 = (cpu() if cpu else None), time.perf_counter()
        per_session = await asyncio.gather(*(_rollouts(c, workload, model, config, config.rollouts) for c in clients))
        wall = time.perf_counter() - t0
        cpu_s = cpu() - cpu0 if cpu and cpu0 is not None else None
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return [t for traces in per_session for t in traces], cpu_s, wall


async def _rollouts(client: Transport, w: Workload, model: str, config: BenchConfig, n: int) -> list[Trace]:
    traces = []
    for _ in range(n):
        # Built before the clock starts; a fresh nonce per rollout keeps KV prefixes unshared. Twelve
        # digits: cl100k splits digits in threes, so every nonce is 4 tokens and usage stays comparable.
        plan = build_plan(w, model, f"{uuid.uuid4().int % 10**12:012d}", config.tool_time_scale)
        traces.append(await client.rollout(plan))
    return traces


# ---- the whole run ------------------------------------------------------------------------------


def workloads_of(config: BenchConfig) -> list[Workload]:
    return [shorten(load_workload(name), config.turns) for name in config.workloads]


def total_turns(config: BenchConfig) -> int:
    """Sends the whole run will make (for the progress bar)."""
    per_mode = 0
    for w in workloads_of(config):
        warm = shorten(w, config.warmup_turns)
        per_mode += config.sessions * (config.warmup * len(warm.turns) + config.rollouts * len(w.turns))
    n_profiles = 1 if config.url else len(config.profiles)
    return per_mode * len(config.modes) * len(config.models) * n_profiles


Server = tuple[str, str, str, Callable[[], float] | None, tuple[str, ...]]  # profile, ws, http, cpu, others


@contextlib.contextmanager
def _servers(config: BenchConfig) -> Iterator[list[Server]]:
    """(profile, ws_url, http_url, cpu, other ws urls) per profile; the lab's own servers, or ``--url``'s."""
    if config.url:
        ws_url, *others = config.url.split(",")
        http_url = ws_url.replace("wss://", "https://").replace("ws://", "http://").split("/v1/")[0]
        pid = external_server_pid(http_url)
        cpu = None if pid is None else functools.partial(cpu_seconds, psutil.Process(pid))
        yield [("external", ws_url, http_url, cpu, tuple(others))]
        return
    pairs = 2 if config.reconnect else 1
    started: list[list[ChildServer]] = []
    engine: ChildEngine | None = None
    with tempfile.TemporaryDirectory(prefix="responses-lab-bench-") as scratch:
        try:
            engine_url = config.engine
            if config.engine == "spawn":
                engine = ChildEngine([f for o in config.model_overrides for f in ("--model-override", o)])
                engine.wait_ready()
                engine_url = engine.http_url
            for name in config.profiles:  # all started before any is waited for: they boot side by side
                # Processes that share a store (a reconnect's pair, N workers) need a file: a memory database is one process's.
                shared = pairs > 1 or config.workers > 1
                db = config.db or (f"{scratch}/{name}.sqlite3" if shared else ":memory:")
                flags = server_flags(PROFILES[name], config, engine_url)
                started.append([ChildServer(flags, api_key=config.api_key, db=db) for _ in range(pairs)])
            for group in started:
                for server in group:
                    server.wait_ready()
            yield [
                (name, group[0].ws_url, group[0].http_url, functools.partial(_cpu_sum, group, engine), tuple(s.ws_url for s in group[1:]))
                for name, group in zip(config.profiles, started, strict=True)
            ]
        finally:
            for group in started:
                for server in group:
                    server.stop()
            if engine is not None:
                engine.stop()


def _cpu_sum(servers: list[ChildServer], engine: ChildEngine | None = None) -> float:
    """The servers' CPU seconds (their workers and their own engine included), plus the lab's engine's."""
    return sum(server.cpu_s() for server in servers) + (engine.cpu_s() if engine is not None else 0.0)


def server_flags(profile: Profile, config: BenchConfig, engine_url: str | None = None) -> list[str]:
    """``responses-lab serve`` flags for one profile's server: its hops, quiet logs, the model overrides
    (which an engine elsewhere ignores: they are that engine's flags), its engine and workers."""
    flags = ["--safety-hop-ms", str(profile.safety_hop_ms), "--resolve-hop-ms", str(profile.resolve_hop_ms),
             "--log-level", "warning"]
    for override in config.model_overrides:
        flags += ["--model-override", override]
    if engine_url:
        flags += ["--engine", engine_url]
    if config.workers > 1:
        flags += ["--workers", str(config.workers)]
    return flags


async def run_bench(config: BenchConfig, on_turn: Callable[[], None] | None = None,
                    on_cell: Callable[[str], None] | None = None) -> BenchResult:
    result = BenchResult(config)
    t0 = time.perf_counter()
    workloads = workloads_of(config)
    with _servers(config) as servers:
        for profile, ws_url, http_url, cpu, others in servers:
            if on_cell:
                on_cell(f"{profile}: WebSocket ping floor")
            result.pings_ms[profile] = await ping_rtts_ms(ws_url, config.pings, config.api_key)
            for w in workloads:
                for model in config.models:
                    for mode in config.modes:
                        if on_cell:
                            on_cell(f"{profile} · {w.name} · {model} · {mode}")
                        traces, cpu_s, wall = await run_cell(mode, w, model, config, ws_url, http_url, cpu, on_turn, others)
                        result.cells.append(CellResult(profile, w.name, model, mode, config.sessions, traces, cpu_s, wall))
    result.wall_s = time.perf_counter() - t0
    return result


