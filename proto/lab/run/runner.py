"""Running the lab: a server per profile, the floor, then every (workload, model, mode) cell in turn.

Per cell of a synthetic workload: each of ``sessions`` concurrent clients opens its connection, runs
``warmup`` short rollouts (not counted), then — after every session has warmed up — ``rollouts`` measured
rollouts. A trace (TraceLab CSV/JSONL) brings its own sessions: one client each, warmed up on a small
plan, then every session starts at its arrival time after the measured start (open loop: the GPU sees the
trace's contention), ``rollouts`` times over. The server's CPU time is read around the measured part only.
Cells run one after another, never overlapping, so modes never share the two cores.

``reconnect=K``: two servers per profile share one database (``db``, else a temporary SQLite file), and
the ``ws`` clients reconnect to the other one every K turns (proto/lab/run/clients.py); the servers' CPU is
summed. With ``url``, a second URL after a comma is the other server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import os
import tempfile
import time
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil
from websockets.asyncio.client import connect

from proto.client.frames import SENT
from proto.client.http import HttpClient
from proto.lab.analysis.metrics import Trace
from proto.lab.analysis.predict import Calibration, calibrate
from proto.lab.config import PEER_MODES, WARM, BenchConfig, Profile, jitter_overrides, nonce, profile_named
from proto.lab.records import Floor, Load, cpu_between, floor, load_now, tree_cpu
from proto.lab.run.clients import RolloutClient, make_client
from proto.lab.run.design import draw_tool_times, mode_order, rollout_seed
from proto.lab.run.network import LabNetwork, LinkCheck, live_link, network_named
from proto.lab.run.peers import peer_info, run_peer_modes
from proto.lab.workload.plan import RolloutPlan, build_plan
from proto.lab.workload.traces import Replay, Session, load_replay
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
    group: GroupResult | None = None  # the design, load and floors its (profile, workload, model) ran with
    peer: dict[str, Any] | None = None  # who served it and how it was timed (proto/lab/run/peers.py)


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


# ---- one group: every mode of a (profile, workload, model), interleaved ----------------------------


async def http_noop_rtts_ms(http_url: str, count: int, api_key: str | None = None) -> list[float]:
    """``GET /healthz`` round trips through the lab's HTTP client stack (``proto.client.http.HttpClient``:
    its httpx client, one keep-alive connection), from the send mark (where the request's bytes leave) to
    the body read: the least any HTTP turn can cost, the client's own share included."""
    rtts: list[float] = []
    sent: list[float] = []
    client = HttpClient(
        http_url, api_key, observer=lambda frame: sent.append(frame.t) if frame.direction == SENT else None
    )
    try:
        # This server's /healthz; vLLM's /health on a server given by --url; a server with neither has no
        # no-op route: its floor is recorded as unmeasured (n = 0), never guessed.
        path = None
        for candidate in ("/healthz", "/health"):
            if (await client.get(candidate)).status_code == 200:
                path = candidate
                break
        for _ in range(count if path is not None else 0):
            sent.clear()
            response = await client.get(path or "/healthz")
            t = client.clock()
            if response.status_code != 200 or not sent:
                raise RuntimeError(f"GET {path}: HTTP {response.status_code}")
            rtts.append((t - sent[0]) * 1e3)
    finally:
        await client.aclose()
    return rtts


@dataclass
class ModeTally:
    """One mode's part of a group, summed over its blocks."""

    traces: list[Trace] = field(default_factory=list)
    cpu_s: float | None = 0.0
    wall_s: float = 0.0


@dataclass
class GroupResult:
    """A group's shared facts, recorded in each of its cells."""

    orders: list[list[str]]  # per rollout index, the modes in the order they ran
    load: Load
    floors: list[Floor]
    blocks: int  # server lifetimes: 1, or one per rollout index with fresh_server
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)  # per peer mode: proto/lab/run/peers.py
    link: LinkCheck | None = None  # the shaped link's check, beside the floors (docs/lab.md, "Network")


def _plans(replay: Replay, model: str, config: BenchConfig, index: int) -> list[tuple[Session, int | None]]:
    """Rollout ``index``'s sessions, each with its tool-time seed: a synthetic workload's ``sessions``
    copies, each with tool times drawn from its seed; a trace's own sessions with their recorded times."""
    if replay.trace:
        return [(s, None) for s in replay.sessions]
    out: list[tuple[Session, int | None]] = []
    for k in range(config.sessions):
        seed = rollout_seed(config.seed, index, k)
        first = replay.sessions[0]
        out.append((draw_tool_times(first, seed), seed if first.drawn else None))
    return out


async def run_group(
    modes: Sequence[str],
    replay: Replay,
    model: str,
    config: BenchConfig,
    servers: Callable[[], contextlib.AbstractContextManager[Server]],
    on_turn: Callable[[], None] | None = None,
    peer_flags: list[str] | None = None,
) -> tuple[dict[str, ModeTally], GroupResult]:
    """Every mode of one (profile, workload, model) over the same rollouts: rollout index ``i`` runs each
    mode once, in row ``i`` of the Williams design (proto/lab/run/design.py), every mode on the same plan and
    tool times (a distinct nonce each, so no KV prefix or cached item is shared). ``servers()`` gives the
    server: entered once, or once per rollout index with ``config.fresh_server``. The floors are measured on
    the first server, before the warm-up; the load average is read around the whole group. A peer mode
    (``--peer``) runs the same indices through its own processes, started with ``peer_flags``, after the
    others (proto/lab/run/peers.py)."""
    tallies = {mode: ModeTally() for mode in modes}
    ours = [m for m in modes if m not in PEER_MODES]
    peer_modes = [m for m in modes if m in PEER_MODES]
    orders: list[list[str]] = []
    indices = list(range(config.rollouts))
    blocks = [[i] for i in indices] if config.fresh_server else [indices]
    floors: list[Floor] = []
    link: LinkCheck | None = None
    before = load_now()
    cpu_before = tree_cpu()
    for block in blocks:
        with servers() as server:
            if not floors:
                _, ws_url, http_url, _, _ = server
                floors = [
                    floor("ws_ping", await ping_rtts_ms(ws_url, config.pings, config.api_key)),
                    floor("http_noop", await http_noop_rtts_ms(http_url, config.pings, config.api_key)),
                ]
                shaped = live_link(http_url)
                link = None if shaped is None else await shaped.check()
            if ours:
                await _block(ours, replay, model, config, server, block, tallies, orders, on_turn)
    peers = await run_peer_modes(
        peer_modes, replay, model, config, peer_flags or [], indices, tallies, on_turn, _block
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    load = Load(before, load_now(), cores, cpu_between(cpu_before, tree_cpu()))
    return tallies, GroupResult(orders, load, floors, len(blocks), peers, link)


async def _block(
    modes: Sequence[str],
    replay: Replay,
    model: str,
    config: BenchConfig,
    server: Server,
    indices: Sequence[int],
    tallies: dict[str, ModeTally],
    orders: list[list[str]],
    on_turn: Callable[[], None] | None,
) -> None:
    """One server's part of a group: every mode's clients opened and warmed up (in the first index's
    order), then ``indices`` rollout by rollout, the modes interleaved."""
    _, ws_url, http_url, cpu, others = server
    n = len(replay.sessions) if replay.trace else config.sessions
    clients: dict[str, list[RolloutClient]] = {
        mode: [
            make_client(mode, ws_url, http_url, config.api_key, config.reconnect, others) for _ in range(n)
        ]
        for mode in modes
    }
    for c in (c for cs in clients.values() for c in cs):
        c.on_send = on_turn
    warm = WARM if replay.trace else replay.shortened(config.warmup_turns).sessions[0]
    try:
        await asyncio.gather(*(c.open() for cs in clients.values() for c in cs))
        for mode in mode_order(modes, indices[0]):
            await asyncio.gather(*(_warm(c, warm, model, config) for c in clients[mode]))
        for index in indices:
            order = mode_order(modes, index)
            orders.append(list(order))
            sessions = _plans(replay, model, config, index)
            for position, mode in enumerate(order):
                # Built before the clock starts: the same sessions and tool times in every mode.
                plans = [build_plan(s, model, nonce(), config.tool_time_scale) for s, _ in sessions]
                tally = tallies[mode]
                cpu0, t0 = (cpu() if cpu else None), time.perf_counter()
                start = asyncio.get_running_loop().time()
                traces = await asyncio.gather(
                    *(
                        _arrive(c, plan, s.arrival_s if replay.trace else 0.0, start)
                        for c, plan, (s, _) in zip(clients[mode], plans, sessions, strict=True)
                    )
                )
                tally.wall_s += time.perf_counter() - t0
                if cpu is None or cpu0 is None or tally.cpu_s is None:
                    tally.cpu_s = None
                else:
                    tally.cpu_s += cpu() - cpu0
                for k, (trace, (_, seed)) in enumerate(zip(traces, sessions, strict=True)):
                    trace.index, trace.session_index, trace.seed, trace.position = index, k, seed, position
                tally.traces += traces
    finally:
        await asyncio.gather(*(c.close() for cs in clients.values() for c in cs), return_exceptions=True)


def _client(
    mode: str, config: BenchConfig, ws_url: str, http_url: str, others: tuple[str, ...]
) -> RolloutClient:
    return make_client(mode, ws_url, http_url, config.api_key, config.reconnect, others)


async def _warm(client: RolloutClient, session: Session, model: str, config: BenchConfig) -> None:
    for _ in range(config.warmup):
        await client.rollout(build_plan(session, model, nonce(), config.tool_time_scale))


async def _arrive(client: RolloutClient, plan: RolloutPlan, arrival_s: float, start: float) -> Trace:
    """One session's rollout, started at its arrival time after ``start`` (a trace's open loop; a synthetic
    workload's sessions all arrive at once); closed loop within it."""
    delay = start + arrival_s - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)
    trace = await client.rollout(plan)
    trace.arrival_s = arrival_s
    return trace


# ---- the whole run ------------------------------------------------------------------------------


def replays_of(config: BenchConfig) -> list[Replay]:
    return [load_replay(name).shortened(config.turns) for name in config.workloads]


def cell_turns(config: BenchConfig, r: Replay) -> int:
    """Sends one cell of ``r`` makes, warm-up included (for the progress bar)."""
    blocks = config.rollouts if config.fresh_server else 1
    if r.trace:
        per = len(r.sessions) * config.warmup * len(WARM.rounds)
        return per * blocks + config.rollouts * r.rounds
    warm = r.shortened(config.warmup_turns)
    return config.sessions * (config.warmup * warm.rounds * blocks + config.rollouts * r.rounds)


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
    networked = any(profile_named(name).network for name in config.profiles)
    with (
        tempfile.TemporaryDirectory(prefix="responses-lab-bench-") as scratch,
        LabNetwork(seed=config.seed) if networked else contextlib.nullcontext() as net,
    ):
        try:
            engine_url = config.engine
            if config.engine == "spawn":
                engine = ChildEngine([f for o in overrides_of(config) for f in ("--model-override", o)])
                engine.wait_ready()
                engine_url = engine.http_url
            for name in config.profiles:  # all started before any is waited for: they boot side by side
                # Processes that share a store (a reconnect's pair, N workers) need a file: a memory database
                # is one process's.
                shared = pairs > 1 or config.workers > 1
                db = config.db or (f"{scratch}/{name}.sqlite3" if shared else ":memory:")
                flags = server_flags(profile_named(name), config, engine_url)
                if pairs > 1 or config.db:  # several of its servers on one file, on purpose
                    flags.append("--db-shared")
                # Behind a shaped link: the profile's servers in its namespace (docs/lab.md, "Network").
                network = profile_named(name).network
                link = net.link(network_named(network)) if net and network else None
                started.append(
                    [
                        ChildServer(
                            flags, api_key=config.api_key, db=db, placement=link.placement() if link else None
                        )
                        for _ in range(pairs)
                    ]
                )
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


def _server_of(
    config: BenchConfig, server: Server
) -> Callable[[], contextlib.AbstractContextManager[Server]]:
    """A group's servers: ``server`` itself, or a fresh set per rollout index (``--fresh-server``)."""
    if config.fresh_server:
        return functools.partial(_fresh, config, server[0])
    return functools.partial(_same, server)


@contextlib.contextmanager
def _same(server: Server) -> Iterator[Server]:
    yield server


@contextlib.contextmanager
def _fresh(config: BenchConfig, profile: str) -> Iterator[Server]:
    """New server processes for ``profile`` (``--fresh-server``: one set per rollout index), stopped on
    exit."""
    with _servers(dataclasses.replace(config, profiles=(profile,))) as servers:
        yield servers[0]


def _cpu_sum(servers: list[ChildServer], engine: ChildEngine | None = None) -> float:
    """The servers' CPU seconds (their workers and their own engine included), plus the lab's engine's."""
    return sum(server.cpu_s() for server in servers) + (engine.cpu_s() if engine is not None else 0.0)


def overrides_of(config: BenchConfig) -> tuple[str, ...]:
    """The ``--model-override``s of the servers the lab starts: the mock GPU's jitter (unless off), then the
    user's own (which win)."""
    return (*jitter_overrides(config), *config.model_overrides)


def server_flags(profile: Profile, config: BenchConfig, engine_url: str | None = None) -> list[str]:
    """``responses-lab serve`` flags for one profile's server: its rules and hops, quiet logs, the model
    overrides (which an engine elsewhere ignores: they are that engine's flags), its engine and workers."""
    flags = [*profile.flags(), "--log-level", "warning"]
    for override in overrides_of(config):
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

    A long sweep (run/store.py) runs only the cells in ``todo``, starts the servers of their profiles
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
        for server in servers:
            profile, ws_url = server[0], server[1]
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
                    modes = [m for m in config.modes if (profile, w.name, model, m) in keys]
                    if not modes:
                        continue
                    if on_cell:
                        on_cell(f"{profile} · {w.name} · {model} · {', '.join(modes)}")
                    # The cells so far are garbage or results kept to the end: collect the one, freeze the
                    # other, so a full collection during this group walks only its own objects (unfrozen, a
                    # long run's gen-2 pause grew with every cell and landed inside a measured round).
                    gc.collect()
                    gc.freeze()
                    # A peer's upstream: a server of this project with the profile's flags (docs/lab.md,
                    # "Peers").
                    peer_flags = (
                        server_flags(profile_named(profile), config, config.engine)
                        if any(m in PEER_MODES for m in modes)
                        else None
                    )
                    tallies, shared = await run_group(
                        modes, w, model, config, _server_of(config, server), on_turn, peer_flags
                    )
                    sessions = len(w.sessions) if w.trace else config.sessions
                    for mode in modes:
                        t = tallies[mode]
                        cell = CellResult(
                            profile, w.name, model, mode, sessions, t.traces, t.cpu_s, t.wall_s, w
                        )
                        cell.group = shared
                        cell.peer = shared.peers.get(mode) or peer_info(mode, config)
                        if on_done:  # the cell's record is written there; nothing keeps its traces after
                            on_done(cell)
    result.wall_s = time.perf_counter() - t0
    return result
