"""Running the lab: a server per profile, the floor, then every (workload, model, mode) cell in turn.

Per cell of a synthetic workload: each of ``sessions`` concurrent clients opens its connection, runs
``warmup`` short rollouts (not counted), then — after every session has warmed up — ``rollouts`` measured
rollouts. A trace (TraceLab CSV/JSONL) brings its own sessions: one client each, warmed up on a small
plan, then every session starts at its arrival time after the measured start (open loop: the GPU sees the
trace's contention), ``rollouts`` times over. The server's CPU time is read around the measured part only.
Cells run one after another, never overlapping, so modes never share the two cores.

``reconnect=K``: two servers per profile share one database (``db``, else a temporary SQLite file), and
the ``ws`` clients reconnect to the other one every K turns (proto/lab/clients.py); the servers' CPU is
summed. With ``url``, a second URL after a comma is the other server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import tempfile
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil
from websockets.asyncio.client import connect

from proto.lab.clients import RolloutClient, make_client
from proto.lab.config import PEER_MODES, PROFILES, WARM, BenchConfig, Profile, nonce
from proto.lab.metrics import Trace
from proto.lab.peers import peer_info, run_peer_cell
from proto.lab.plan import build_plan
from proto.lab.predict import Calibration, calibrate
from proto.lab.traces import Replay, Session, load_replay
from proto.processes import ChildEngine, ChildServer, cpu_seconds


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
    replay: Replay | None = None
    peer: dict[str, Any] | None = None  # who served it and how it was timed (proto/lab/peers.py)


@dataclass
class BenchResult:
    config: BenchConfig
    pings_ms: dict[str, list[float]] = field(default_factory=dict)  # per profile
    started: float = field(default_factory=time.time)
    wall_s: float = 0.0
    calibration: Calibration | None = None  # when the run calibrated the fast model


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
    async with connect(
        f"{ws_url}{sep}protocol=longlived", additional_headers=headers, ping_interval=None
    ) as ws:
        for _ in range(count):
            t0 = time.perf_counter()
            await (await ws.ping())
            rtts.append((time.perf_counter() - t0) * 1e3)
    return rtts


# ---- one cell -----------------------------------------------------------------------------------


async def run_cell(
    mode: str,
    replay: Replay,
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
    n = len(replay.sessions) if replay.trace else config.sessions
    clients: list[RolloutClient] = [
        make_client(mode, ws_url, http_url, config.api_key, config.reconnect, others) for _ in range(n)
    ]
    for client in clients:
        client.on_send = on_turn
    warm = WARM if replay.trace else replay.shortened(config.warmup_turns).sessions[0]
    try:
        await asyncio.gather(*(c.open() for c in clients))
        await asyncio.gather(*(_rollouts(c, warm, model, config, config.warmup) for c in clients))
        cpu0, t0 = (cpu() if cpu else None), time.perf_counter()
        if replay.trace:
            traces = []
            for _ in range(config.rollouts):
                start = asyncio.get_running_loop().time()
                traces += await asyncio.gather(
                    *(
                        _arrive(c, s, start, model, config)
                        for c, s in zip(clients, replay.sessions, strict=True)
                    )
                )
        else:
            session = replay.sessions[0]
            per_session = await asyncio.gather(
                *(_rollouts(c, session, model, config, config.rollouts) for c in clients)
            )
            traces = [t for ts in per_session for t in ts]
        wall = time.perf_counter() - t0
        cpu_s = cpu() - cpu0 if cpu and cpu0 is not None else None
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return traces, cpu_s, wall


async def _rollouts(
    client: RolloutClient, session: Session, model: str, config: BenchConfig, n: int
) -> list[Trace]:
    traces = []
    for _ in range(n):
        plan = build_plan(session, model, nonce(), config.tool_time_scale)  # built before the clock starts
        traces.append(await client.rollout(plan))
    return traces


async def _arrive(
    client: RolloutClient, session: Session, start: float, model: str, config: BenchConfig
) -> Trace:
    """One trace session, started at its arrival time (open loop); closed loop within it."""
    plan = build_plan(session, model, nonce(), config.tool_time_scale)
    delay = start + session.arrival_s - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)
    trace = await client.rollout(plan)
    trace.arrival_s = session.arrival_s
    return trace


# ---- the whole run ------------------------------------------------------------------------------


def replays_of(config: BenchConfig) -> list[Replay]:
    return [load_replay(name).shortened(config.turns) for name in config.workloads]


def cell_turns(config: BenchConfig, r: Replay) -> int:
    """Sends one cell of ``r`` makes, warm-up included (for the progress bar)."""
    if r.trace:
        return len(r.sessions) * config.warmup * len(WARM.rounds) + config.rollouts * r.rounds
    warm = r.shortened(config.warmup_turns)
    return config.sessions * (config.warmup * warm.rounds + config.rollouts * r.rounds)


def profiles_of(config: BenchConfig) -> tuple[str, ...]:
    """The run's profiles: ``external`` alone with ``--url``."""
    return ("external",) if config.url else config.profiles


CellKey = tuple[str, str, str, str]  # (profile, workload, model, mode): one cell of the grid


def grid(config: BenchConfig, replays: list[Replay]) -> list[CellKey]:
    """Every cell of the run, in the order it runs them."""
    return [
        (profile, w.name, model, mode)
        for profile in profiles_of(config)
        for w in replays
        for model in config.models
        for mode in config.modes
    ]


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
                # Processes that share a store (a reconnect's pair, N workers) need a file: a memory database
                # is one process's.
                shared = pairs > 1 or config.workers > 1
                db = config.db or (f"{scratch}/{name}.sqlite3" if shared else ":memory:")
                flags = server_flags(PROFILES[name], config, engine_url)
                started.append([ChildServer(flags, api_key=config.api_key, db=db) for _ in range(pairs)])
            for group in started:
                for server in group:
                    server.wait_ready()
            yield [
                (
                    name,
                    group[0].ws_url,
                    group[0].http_url,
                    functools.partial(_cpu_sum, group, engine),
                    tuple(s.ws_url for s in group[1:]),
                )
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
    flags = [
        "--safety-hop-ms",
        str(profile.safety_hop_ms),
        "--resolve-hop-ms",
        str(profile.resolve_hop_ms),
        "--log-level",
        "warning",
    ]
    for override in config.model_overrides:
        flags += ["--model-override", override]
    if engine_url:
        flags += ["--engine", engine_url]
    if config.workers > 1:
        flags += ["--workers", str(config.workers)]
    return [*flags, *config.server_flags]


def h_max_of(replays: list[Replay]) -> int:
    """The largest prompt the run's workloads reach (+10 %, at least 16 k): the calibration's history
    range."""
    top = 0
    for r in replays:
        for s in r.sessions:
            sizes = [x.input_tokens for x in s.rounds if x.input_tokens is not None]
            top = max(top, *sizes) if sizes else max(top, build_plan(s, "m", nonce()).sends[-1].prompt_tokens)
    return max(int(top * 1.1), 16_000)


async def run_bench(
    config: BenchConfig,
    on_turn: Callable[[], None] | None = None,
    on_cell: Callable[[str], None] | None = None,
    cells: bool = True,
    *,
    calibration: Calibration | None = None,
    todo: Container[CellKey] | None = None,
    floors: dict[str, list[float]] | None = None,
    on_floor: Callable[[str, list[float]], None] | None = None,
    on_done: Callable[[CellResult], None] | None = None,
) -> BenchResult:
    """The run: the fast model's calibration (unless ``config.predict`` is off, or ``calibration`` is
    given: a resumed run's), then every cell (unless ``cells`` is off: ``--predict`` alone).

    A long sweep (proto/lab/store.py) runs only the cells in ``todo``, starts the servers of their profiles
    only, keeps a profile's floor from ``floors`` where it is there (else measures it and hands it to
    ``on_floor``), and hands each cell to ``on_done`` as it finishes."""
    result = BenchResult(config, calibration=calibration)
    t0 = time.perf_counter()
    workloads = replays_of(config)
    if config.predict and calibration is None:
        if on_cell:
            on_cell("fast model: calibrating every mode")
        h_max = 128_000 if not cells else h_max_of(workloads)
        result.calibration = await calibrate(
            tuple(m for m in config.modes if m not in PEER_MODES),
            config.calibration_rounds,
            h_max,
            config.api_key,
            on_turn,
        )
    if not cells:
        result.wall_s = time.perf_counter() - t0
        return result
    keys = {k for k in grid(config, workloads) if todo is None or k in todo}  # looked up per cell
    needed = tuple(p for p in config.profiles if any(k[0] == p for k in keys))
    if not keys:
        result.wall_s = time.perf_counter() - t0
        return result
    with _servers(dataclasses.replace(config, profiles=needed)) as servers:
        for profile, ws_url, http_url, cpu, others in servers:
            if floors and profile in floors:
                result.pings_ms[profile] = floors[profile]
            else:
                if on_cell:
                    on_cell(f"{profile}: WebSocket ping floor")
                result.pings_ms[profile] = await ping_rtts_ms(ws_url, config.pings, config.api_key)
                if on_floor:
                    on_floor(profile, result.pings_ms[profile])
            for w in workloads:
                for model in config.models:
                    for mode in config.modes:
                        if (profile, w.name, model, mode) not in keys:
                            continue
                        if on_cell:
                            on_cell(f"{profile} · {w.name} · {model} · {mode}")
                        # The cells so far are garbage or results kept to the end: collect the one, freeze the
                        # other, so a full collection during this cell walks only its own objects (unfrozen, a
                        # long run's gen-2 pause grew with every cell and landed inside a measured round).
                        gc.collect()
                        gc.freeze()
                        peer = peer_info(mode, config)
                        if mode in PEER_MODES:  # its own processes, started for the cell (proto/lab/peers.py)
                            flags = server_flags(PROFILES[profile], config, config.engine)
                            traces, cpu_s, wall, peer = await run_peer_cell(
                                mode, w, model, config, flags, on_turn
                            )
                        else:
                            traces, cpu_s, wall = await run_cell(
                                mode, w, model, config, ws_url, http_url, cpu, on_turn, others
                            )
                        sessions = len(w.sessions) if w.trace else config.sessions
                        cell = CellResult(
                            profile, w.name, model, mode, sessions, traces, cpu_s, wall, w, peer
                        )
                        if on_done:  # the cell's record is written there; nothing keeps its traces after
                            on_done(cell)
    result.wall_s = time.perf_counter() - t0
    return result
