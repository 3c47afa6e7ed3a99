"""Many agents on one shared engine (docs/lab.md, "Fleets"): ``responses-lab bench fleet``.

N desynchronised agents arrive by a seeded Poisson process and each runs one rollout of the workload's plan
(workload/plan.py) with its own seeded tool-time draws (run/design.py), through the real stack: the
lab's rollout clients → ``responses-lab serve --engine URL`` → a ``responses-lab engine`` process (the mock
GPU: chunked prefill, KV capacity, preemption, pinned suspended blocks; docs/mock-gpu.md). Every cell —
(agents, KV budget, pinning, mode) — gets a fresh engine and server, so the engine's counters are the
cell's own and no cell inherits another's cache; every mode of a (agents, KV, pinning) replays the same
arrival schedule and the same tool times.

The engine's figures (preemptions, queue time, prefix-cache queries and hits, KV blocks in use and pinned)
come from its ``/metrics``, scraped before and after the cell and sampled during it; the per-turn figures
(TTFT, queue wait, cached tokens) from what the clients saw and the server reported (``response.lab.turns``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from proto.core.response import MODES
from proto.engine.routing import POLICIES
from proto.helpfmt import HelpFormatter
from proto.lab.analysis.fleet_stats import summarize
from proto.lab.analysis.metrics import Trace, percentile, rollout_metrics
from proto.lab.config import JITTER, nonce
from proto.lab.records import cpu_between, provenance, tree_cpu
from proto.lab.run.clients import make_client
from proto.lab.run.design import draw_tool_times, rollout_seed
from proto.lab.workload.plan import build_plan
from proto.lab.workload.traces import load_replay
from proto.processes import ChildEngine, ChildServer

SETTLE_POLL_S = 0.05  # how often the engine is asked whether it has settled between cells


@dataclass(frozen=True)
class FleetConfig:
    modes: tuple[str, ...] = ("http-cached", "ws", "longlived")
    workload: str = "coding-agent"
    model: str = "mock-4000tps"
    agents: tuple[int, ...] = (8, 64)
    rate: float = 4.0  # agent arrivals per second (Poisson)
    turns: int | None = 6  # the workload shortened to this many turns (None: all)
    tool_time_scale: float = 0.05
    pins: tuple[bool, ...] = (True, False)  # the engine's pin-suspended
    kv_blocks: tuple[int | None, ...] = (None,)  # the engine's kv-cache-size (None: the model's own)
    # Engine replicas behind the API (each its own process and KV cache), and how the API routes among
    # them (proto/engine/routing.py); with one replica there is nothing to route (one group, routing "-").
    replicas: tuple[int, ...] = (1,)
    routings: tuple[str, ...] = ("prefix-aware",)
    # Draws per cell: repeat r runs arrivals and tool times from seed + r, the same in every mode and
    # routing of a group (paired), for the intervals (proto/lab/analysis/fleet_stats.py).
    repeats: int = 1
    # The SLO a rollout meets for goodput: every turn's TTFT and the whole rollout's E2E within these. A
    # stated knob, not an outside figure: set it to the product's own target.
    slo_ttft_ms: float = 1000.0
    slo_e2e_s: float = 60.0
    seed: int = 1
    jitter: bool = True
    # How often the engine's KV gauges are read during a cell. Each read walks the suspended sequences'
    # blocks on the engine's loop (distinct pinned blocks), so hundreds of agents want a longer period.
    sample_s: float = 0.05

    @property
    def cells_per_group(self) -> int:
        """A group's cells: every mode, every draw (a group is one engine stack: run_fleet)."""
        return len(self.modes) * self.repeats


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times (s after the cell's start) of a Poisson process at ``rate`` per second: the first
    at 0, then exponential gaps drawn from a stream of their own (same seed, same schedule, in every mode)."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(f"fleet-arrivals:{seed}")
    out, t = [], 0.0
    for _ in range(n):
        out.append(round(t, 6))
        t += rng.expovariate(rate)
    return out


# ---- the engine's own figures ---------------------------------------------------------------------------


@dataclass
class EngineScrape:
    """One read of the engine's ``/metrics`` for one model."""

    preemptions: float = 0.0
    queue_time_s_sum: float = 0.0
    queue_time_count: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    kv_capacity: float = 0.0
    kv_used: float = 0.0
    kv_pinned: float = 0.0
    waiting: float = 0.0
    running: float = 0.0


def summed(scrapes: Sequence[EngineScrape]) -> EngineScrape:
    """The replicas' figures added up (every field is a count, a sum or a gauge of blocks/requests)."""
    out = EngineScrape()
    for s in scrapes:
        for name, value in asdict(s).items():
            setattr(out, name, getattr(out, name) + value)
    return out


# (metric, its ``part`` label) -> the EngineScrape field it fills (proto/engine/app.py exports them).
_SCRAPED: dict[tuple[str, str | None], str] = {
    ("vllm:num_preemptions_total", None): "preemptions",
    ("vllm:request_queue_time_seconds_sum", None): "queue_time_s_sum",
    ("vllm:request_queue_time_seconds_count", None): "queue_time_count",
    ("vllm:prefix_cache_queries_total", None): "prefix_queries",
    ("vllm:prefix_cache_hits_total", None): "prefix_hits",
    ("vllm:num_requests_waiting", None): "waiting",
    ("vllm:num_requests_running", None): "running",
    ("responses_lab_engine_kv_blocks", "capacity"): "kv_capacity",
    ("responses_lab_engine_kv_blocks", "used"): "kv_used",
    ("responses_lab_engine_kv_blocks", "pinned_suspended"): "kv_pinned",
}


def parse_engine_metrics(text: str, model: str) -> EngineScrape:
    out = EngineScrape()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model_name") != model:
                continue
            field_name = _SCRAPED.get((s.name, s.labels.get("part")))
            if field_name is not None:
                setattr(out, field_name, s.value)
    return out


async def scrape(client: httpx.AsyncClient, url: str, model: str) -> EngineScrape:
    response = await client.get(f"{url}/metrics")
    response.raise_for_status()
    return parse_engine_metrics(response.text, model)


async def scrape_all(client: httpx.AsyncClient, urls: Sequence[str], model: str) -> list[EngineScrape]:
    return list(await asyncio.gather(*(scrape(client, url, model) for url in urls)))


@dataclass
class Occupancy:
    samples: list[EngineScrape] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


async def _sample(
    client: httpx.AsyncClient,
    urls: Sequence[str],
    model: str,
    into: Occupancy,
    stop: asyncio.Event,
    every_s: float,
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not stop.is_set():
        into.samples.append(summed(await scrape_all(client, urls, model)))
        into.times.append(round(loop.time() - start, 4))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


# ---- one cell ------------------------------------------------------------------------------------


@dataclass
class FleetCell:
    mode: str
    agents: int
    pin_suspended: bool
    kv_blocks: float  # the engine's capacity, as it reports it
    rate: float
    wall_s: float
    rollouts: int
    completed: int
    ttft_ms_p50: float
    ttft_ms_p99: float
    e2e_s_p50: float
    e2e_s_p99: float
    goodput_rps: float  # rollouts per second meeting the SLO, over the cell's wall time
    slo_met: int
    queue_wait_ms_p50: float
    queue_wait_ms_p99: float
    queue_wait_ms_sum: float  # every turn's, as the server reported it
    turns: int
    prefix_hit_rate_client: float  # cached / prompt tokens over the turns' reports
    # The engine's own, over the cell (after minus before):
    engine_preemptions: float
    engine_queue_time_ms_sum: float
    engine_requests: float
    engine_prefix_hit_rate: float
    kv_used_mean: float  # blocks, sampled every FleetConfig.sample_s
    kv_used_max: float
    kv_pinned_mean: float
    kv_pinned_max: float
    kv_samples: int
    waiting_max: float
    arrivals_s: list[float]
    seeds: list[int]
    # (s after the start, blocks used, blocks pinned by suspended sequences, requests waiting) per sample
    kv_trace: list[tuple[float, float, float, float]]
    settled: bool = True  # the engine held nothing of the previous cell when this one started
    replicas: int = 1
    routing: str = "-"  # the API's routing policy among the replicas ("-": one replica)
    repeat: int = 0  # the draw: arrivals and tool times from seed + repeat
    seed: int = 0
    # Per replica, over the cell (the engines' own counters): requests served, prompt tokens looked up,
    # found cached, and the hit rate (the engine_* figures above are their sums).
    replica_requests: list[float] = field(default_factory=list)
    replica_prefix_queries: list[float] = field(default_factory=list)
    replica_prefix_hits: list[float] = field(default_factory=list)
    replica_prefix_hit_rate: list[float] = field(default_factory=list)
    # Per rollout, in agent order (the pairs of the intervals): E2E, its turns' median TTFT, and whether
    # it met the SLO.
    rollout_e2e_s: list[float | None] = field(default_factory=list)  # None: the rollout failed
    rollout_ttft_ms_p50: list[float | None] = field(default_factory=list)
    rollout_slo_met: list[bool] = field(default_factory=list)
    # Per rollout, its turns' prompt tokens and the part the server reported cached (the clients' hit rate,
    # rollout by rollout: its interval resamples agents where a cell has too few draws for the engines').
    rollout_prompt_tokens: list[int] = field(default_factory=list)
    rollout_cached_tokens: list[int] = field(default_factory=list)
    # The lab's processes (its clients, the server, the engines) over the cell, from the kernel's schedstat
    # (proto/lab/records.py, tree_cpu): ms on a core and ms runnable but waiting for one; None where the
    # kernel has no schedstat or in a file from before the lab read it.
    lab_run_ms: float | None = None
    lab_wait_ms: float | None = None


def _cell_figures(
    mode: str,
    pin: bool,
    config: FleetConfig,
    schedule: list[float],
    seeds: list[int],
    traces: list[Trace],
    befores: list[EngineScrape],
    afters: list[EngineScrape],
    occupancy: Occupancy,
    wall_s: float,
) -> FleetCell:
    before, after = summed(befores), summed(afters)
    # A rollout whose response failed (the server's error, a turn it could not serve) has no figures of
    # its own: it counts as not completed and not meeting the SLO, and its per-rollout figures are None.
    by_agent = [rollout_metrics(t) if t.status == "completed" else None for t in traces]
    rollouts = [r for r in by_agent if r is not None]
    ttfts = [turn.ttft_ms for r in rollouts for turn in r.turns]
    e2es = [r.e2e_s for r in rollouts]
    reports = [rep for t in traces for rep in t.reports]
    waits = [float(rep["queue_wait_ms"]) for rep in reports]
    prompt = sum(int(rep["prompt_tokens"]) for rep in reports)
    cached = sum(int(rep["cached_tokens"]) for rep in reports)
    slo = [
        r is not None
        and r.e2e_s <= config.slo_e2e_s
        and all(turn.ttft_ms <= config.slo_ttft_ms for turn in r.turns)
        for r in by_agent
    ]
    met = sum(slo)
    queries_by = [a.prefix_queries - b.prefix_queries for a, b in zip(afters, befores, strict=True)]
    hits_by = [a.prefix_hits - b.prefix_hits for a, b in zip(afters, befores, strict=True)]
    queries = after.prefix_queries - before.prefix_queries
    used = [s.kv_used for s in occupancy.samples]
    pinned = [s.kv_pinned for s in occupancy.samples]
    return FleetCell(
        mode=mode,
        agents=len(schedule),
        pin_suspended=pin,
        kv_blocks=after.kv_capacity,
        rate=config.rate,
        wall_s=wall_s,
        rollouts=len(traces),
        completed=sum(1 for t in traces if t.status == "completed"),
        ttft_ms_p50=percentile(ttfts, 50),
        ttft_ms_p99=percentile(ttfts, 99),
        e2e_s_p50=percentile(e2es, 50),
        e2e_s_p99=percentile(e2es, 99),
        goodput_rps=met / wall_s if wall_s > 0 else 0.0,
        slo_met=met,
        queue_wait_ms_p50=percentile(waits, 50),
        queue_wait_ms_p99=percentile(waits, 99),
        queue_wait_ms_sum=sum(waits),
        turns=len(reports),
        prefix_hit_rate_client=cached / prompt if prompt else 0.0,
        engine_preemptions=after.preemptions - before.preemptions,
        engine_queue_time_ms_sum=(after.queue_time_s_sum - before.queue_time_s_sum) * 1e3,
        engine_requests=after.queue_time_count - before.queue_time_count,
        engine_prefix_hit_rate=(after.prefix_hits - before.prefix_hits) / queries if queries else 0.0,
        kv_used_mean=sum(used) / len(used) if used else 0.0,
        kv_used_max=max(used, default=0.0),
        kv_pinned_mean=sum(pinned) / len(pinned) if pinned else 0.0,
        kv_pinned_max=max(pinned, default=0.0),
        kv_samples=len(occupancy.samples),
        waiting_max=max((s.waiting for s in occupancy.samples), default=0.0),
        arrivals_s=schedule,
        seeds=seeds,
        kv_trace=[
            (t, s.kv_used, s.kv_pinned, s.waiting)
            for t, s in zip(occupancy.times, occupancy.samples, strict=True)
        ],
        replicas=len(afters),
        replica_requests=[
            a.queue_time_count - b.queue_time_count for a, b in zip(afters, befores, strict=True)
        ],
        replica_prefix_queries=queries_by,
        replica_prefix_hits=hits_by,
        replica_prefix_hit_rate=[h / q if q else 0.0 for h, q in zip(hits_by, queries_by, strict=True)],
        rollout_e2e_s=[None if r is None else r.e2e_s for r in by_agent],
        rollout_ttft_ms_p50=[
            None if r is None else percentile([t.ttft_ms for t in r.turns], 50) for r in by_agent
        ],
        rollout_slo_met=slo,
        rollout_prompt_tokens=[sum(int(rep["prompt_tokens"]) for rep in t.reports) for t in traces],
        rollout_cached_tokens=[sum(int(rep["cached_tokens"]) for rep in t.reports) for t in traces],
    )


def engine_overrides(config: FleetConfig, pin: bool, kv_blocks: int | None) -> list[str]:
    """The engine's ``--model-override`` flags for one cell: the lab's jitter (docs/lab.md, "Jitter"), then
    the factors."""
    knobs = [f"pin-suspended={'true' if pin else 'false'}"]
    if kv_blocks is not None:
        knobs.append(f"kv-cache-size={kv_blocks}")
    if config.jitter:
        knobs += [f"{k}={v}" for k, v in JITTER.items()] + [f"seed={config.seed}"]
    return ["--model-override", f"{config.model}:{','.join(knobs)}"]


@contextlib.contextmanager
def stack(
    config: FleetConfig, pin: bool, kv_blocks: int | None, replicas: int = 1, routing: str = "-"
) -> Iterator[tuple[list[ChildEngine], ChildServer]]:
    """``replicas`` fresh engine processes and an API server in front of them (routing among them by
    ``routing``), stopped on exit."""
    engines: list[ChildEngine] = []
    server: ChildServer | None = None
    try:
        for _ in range(replicas):
            engines.append(ChildEngine(engine_overrides(config, pin, kv_blocks)))
        for engine in engines:
            engine.wait_ready()
        flags = ["--engine", ",".join(e.http_url for e in engines), "--log-level", "warning"]
        if replicas > 1:
            flags += ["--engine-routing", routing, "--engine-routing-seed", str(config.seed)]
        server = ChildServer(flags)
        server.wait_ready()
        yield engines, server
    finally:
        if server is not None:
            server.stop()
        for engine in engines:
            engine.stop()


async def run_cell(
    mode: str,
    config: FleetConfig,
    n: int,
    pin: bool,
    kv_blocks: int | None,
    engine_urls: Sequence[str],
    server: ChildServer,
    repeat: int = 0,
) -> tuple[FleetCell, list[Trace]]:
    """Every agent's connection opened first (not timed), then each agent's rollout started at its arrival."""
    replay = load_replay(config.workload).shortened(config.turns)
    seed = config.seed + repeat
    schedule = arrivals(n, config.rate, seed)
    seeds = [rollout_seed(seed, 0, k) for k in range(n)]
    plans = [
        build_plan(draw_tool_times(replay.sessions[0], seed), config.model, nonce(), config.tool_time_scale)
        for seed in seeds
    ]
    clients = [make_client(mode, server.ws_url, server.http_url) for _ in range(n)]
    async with httpx.AsyncClient(timeout=30.0) as http:
        try:
            await asyncio.gather(*(c.open() for c in clients))
            before = await scrape_all(http, engine_urls, config.model)
            occupancy, stop = Occupancy(), asyncio.Event()
            sampler = asyncio.get_running_loop().create_task(
                _sample(http, engine_urls, config.model, occupancy, stop, config.sample_s),
                name="fleet-kv-sampler",
            )
            loop = asyncio.get_running_loop()
            cpu_before = tree_cpu()
            start = loop.time()

            async def agent(k: int) -> Trace:
                delay = start + schedule[k] - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # the open loop's arrival, not a stand-in for work
                trace = await clients[k].rollout(plans[k])
                trace.arrival_s, trace.session_index, trace.seed = schedule[k], k, seeds[k]
                return trace

            try:
                traces = list(await asyncio.gather(*(agent(k) for k in range(n))))
            finally:
                stop.set()
                await sampler
            wall_s = loop.time() - start
            cpu = cpu_between(cpu_before, tree_cpu())
            after = await scrape_all(http, engine_urls, config.model)
        finally:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    cell = _cell_figures(mode, pin, config, schedule, seeds, traces, before, after, occupancy, wall_s)
    cell.repeat, cell.seed = repeat, seed
    if cpu is not None:
        cell.lab_run_ms, cell.lab_wait_ms = cpu.run_ms, cpu.wait_ms
    return cell, traces


async def settle(url: str, model: str, timeout_s: float = 30.0) -> bool:
    """Wait until the engine holds nothing for the last cell: no request running or waiting, no block
    pinned by a suspended sequence (closed connections release theirs). False if it never did."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    async with httpx.AsyncClient(timeout=10.0) as http:
        while True:
            now = await scrape(http, url, model)
            if now.running == 0 and now.waiting == 0 and now.kv_pinned == 0:
                return True
            if loop.time() > end:
                return False
            await asyncio.sleep(SETTLE_POLL_S)  # polling the engine's gauges: it has no event to wait on


def groups(config: FleetConfig) -> list[tuple[int, int | None, bool, int, str]]:
    """(agents, KV budget, pinning, replicas, routing) of every group: one stack each. One replica has no
    routing to vary."""
    out = []
    for n in config.agents:
        for kv in config.kv_blocks:
            for pin in config.pins:
                for m in config.replicas:
                    for routing in config.routings if m > 1 else ("-",):
                        out.append((n, kv, pin, m, routing))
    return out


async def run_fleet(
    config: FleetConfig, on_cell: Callable[[FleetCell], None] | None = None, skip: int = 0
) -> list[FleetCell]:
    """Every (agents, KV budget, pinning, replicas, routing) group on fresh engines and a fresh server (but
    the first ``skip``: a resumed sweep's finished groups), its repeats one after another, within a repeat
    its modes in turn (interleaved, not all of one mode first), each once every engine has settled (the
    engines' counters are read as differences around each cell; the earlier cells' blocks stay stored but
    evictable, and no prefix is shared across rollouts)."""
    cells: list[FleetCell] = []
    for n, kv, pin, m, routing in groups(config)[skip:]:
        with stack(config, pin, kv, m, routing) as (engines, server):
            urls = [e.http_url for e in engines]
            for repeat in range(config.repeats):
                for mode in config.modes:
                    settled = all([await settle(url, config.model) for url in urls])
                    cell, _ = await run_cell(mode, config, n, pin, kv, urls, server, repeat)
                    cell.settled, cell.routing = settled, routing
                    cells.append(cell)
                    if on_cell:
                        on_cell(cell)
    return cells


# ---- the command ---------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _kv(text: str) -> tuple[int | None, ...]:
    return tuple(None if x == "default" else int(x) for x in text.split(",") if x)


def _routings(text: str) -> tuple[str, ...]:
    chosen = tuple(x for x in text.split(",") if x)
    unknown = [x for x in chosen if x not in POLICIES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"--routing takes {','.join(POLICIES)}: got {text!r}")
    return chosen


def _pins(text: str) -> tuple[bool, ...]:
    values = {"on": True, "off": False}
    try:
        return tuple(values[x] for x in text.split(",") if x)
    except KeyError as exc:
        raise argparse.ArgumentTypeError(f"--pin takes on,off: got {exc}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="responses-lab bench fleet",
        formatter_class=HelpFormatter,
        description="N agents arriving by a seeded Poisson process, each running one rollout, against one "
        "shared engine process behind the API server; every mode on the same schedule and tool times.",
    )
    d = FleetConfig()
    grid = p.add_argument_group(
        "the grid: a cell per mode, load, pin, KV size, replicas and routing"
    ).add_argument
    agents = p.add_argument_group("the agents and the engine").add_argument
    measured = p.add_argument_group("measurement and output").add_argument
    grid("--modes", default=",".join(d.modes), help=f"modes to compare, from {', '.join(MODES)}")
    agents("--workload", default=d.workload, help="the workload every agent runs one rollout of")
    agents("--model", default=d.model, help="the mock model the engine serves")
    grid(
        "--agents", type=_ints, default=",".join(map(str, d.agents)), help="loads: agents per cell, e.g. 8,64"
    )
    agents("--rate", type=float, default=d.rate, help="agent arrivals per second (Poisson)")
    agents("--turns", type=int, default=d.turns, help="shorten the workload to this many turns")
    agents(
        "--tool-time-scale", type=float, default=d.tool_time_scale, help="multiplies every drawn tool time"
    )
    grid(
        "--pin",
        type=_pins,
        default=",".join("on" if x else "off" for x in d.pins),
        help="the engine's pin-suspended: on, off or on,off",
    )
    grid(
        "--kv-blocks",
        type=_kv,
        default=",".join("default" if x is None else str(x) for x in d.kv_blocks),
        help="the engine's kv-cache-size in blocks, comma list, e.g. default,2000 (default: the model's own)",
    )
    grid(
        "--replicas",
        type=_ints,
        default=",".join(map(str, d.replicas)),
        help="engine processes behind the API, e.g. 1,2 (each its own KV cache)",
    )
    grid(
        "--routing",
        type=_routings,
        default=",".join(d.routings),
        help=f"the API's routing among replicas, from {','.join(POLICIES)} (a factor)",
    )
    measured("--repeats", type=int, default=d.repeats, help="draws per cell (seed, seed+1, …): the intervals")
    measured(
        "--slo-ttft-ms", type=float, default=d.slo_ttft_ms, help="goodput's SLO: every turn's TTFT within"
    )
    measured("--slo-e2e-s", type=float, default=d.slo_e2e_s, help="goodput's SLO: the rollout's E2E within")
    agents("--seed", type=int, default=d.seed, help="the arrivals', tool times' and jitter's seed")
    measured(
        "--kv-sample-ms", type=float, default=d.sample_s * 1e3, help="read the engine's KV gauges this often"
    )
    agents("--no-jitter", action="store_true", help="the mock GPU without its lab jitter")
    measured("--out", type=Path, default=None, help="write DIR/fleet.json")
    measured(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="go on with DIR/fleet.json's sweep (its configuration): keep its whole groups, run the rest",
    )
    measured(
        "--summarize",
        type=Path,
        default=None,
        metavar="FILE",
        help="measure nothing: recompute a fleet.json's summary from its cells (the current analysis)",
    )
    return p


HEADER = (
    f"{'mode':<12}{'agents':>7}{'pin':>5}{'kv':>8}{'M':>3}{'routing':>14}{'rep':>4}"
    f"{'ttft p50':>10}{'p99':>9}{'e2e p50':>9}{'p99':>8}"
    f"{'good/s':>8}{'qwait p99':>10}{'hit':>6}{'preempt':>8}{'kv max':>8}{'pinned':>8}  requests/replica"
)


def row(c: FleetCell) -> str:
    return (
        f"{c.mode:<12}{c.agents:>7}{'on' if c.pin_suspended else 'off':>5}{c.kv_blocks:>8.0f}"
        f"{c.replicas:>3}{c.routing:>14}{c.repeat:>4}"
        f"{c.ttft_ms_p50:>10.1f}{c.ttft_ms_p99:>9.1f}{c.e2e_s_p50:>9.2f}{c.e2e_s_p99:>8.2f}"
        f"{c.goodput_rps:>8.2f}{c.queue_wait_ms_p99:>10.1f}{c.engine_prefix_hit_rate:>6.2f}"
        f"{c.engine_preemptions:>8.0f}{c.kv_used_max:>8.0f}{c.kv_pinned_max:>8.0f}"
        f"  {'/'.join(f'{r:.0f}' for r in c.replica_requests)}"
    )


def cells_of(doc: dict[str, Any]) -> list[FleetCell]:
    """A fleet.json's cells read back."""
    return [FleetCell(**c) for c in doc["cells"]]


def resummarize(path: Path) -> int:
    """``--summarize FILE``: the file's ``summary`` recomputed from its cells (nothing measured is touched),
    recorded under ``summary_recomputed`` (commit, time), as ``bench repredict`` records its predictions.
    Returns how many cells it read."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    cells = cells_of(doc)
    doc["summary"] = msgspec.to_builtins(summarize(cells))
    commit = provenance().commit
    doc["summary_recomputed"] = {"commit": commit, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return len(cells)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    if args.summarize is not None:
        print(f"{args.summarize}: summary recomputed from {resummarize(args.summarize)} cells")
        return 0
    if args.resume is not None:
        return resume(args.resume)
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser().error(f"unknown mode(s) {', '.join(unknown)}; expected from {', '.join(MODES)}")
    config = FleetConfig(
        modes=modes,
        workload=args.workload,
        model=args.model,
        agents=args.agents,
        rate=args.rate,
        turns=args.turns,
        tool_time_scale=args.tool_time_scale,
        pins=args.pin,
        kv_blocks=args.kv_blocks,
        replicas=args.replicas,
        routings=args.routing,
        repeats=args.repeats,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_e2e_s=args.slo_e2e_s,
        seed=args.seed,
        jitter=not args.no_jitter,
        sample_s=args.kv_sample_ms / 1e3,
    )
    head = {
        "config": asdict(config),
        "command": "responses-lab bench fleet " + shlex.join(argv),
        "provenance": msgspec.to_builtins(provenance()),  # the checkout and machine, before the first cell
        "started": time.time(),
    }
    return sweep(config, head, [], args.out)


def sweep(config: FleetConfig, head: dict[str, Any], kept: list[FleetCell], out: Path | None) -> int:
    """Run the groups after ``kept``'s, writing ``out``/fleet.json (``head``'s fields, every cell, the
    summary) after every cell with ``complete`` false until the last, so a sweep that fails keeps the cells
    it finished and ``--resume`` goes on from its last whole group."""
    done = list(kept)

    def write(complete: bool) -> None:
        if out is None:
            return
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            **head,
            "complete": complete,
            "cells": [asdict(c) for c in done],
            "summary": msgspec.to_builtins(summarize(done)) if complete else [],
        }
        path = out / "fleet.json"
        path.with_suffix(".tmp").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".tmp").replace(path)

    def finished(cell: FleetCell) -> None:
        print(row(cell), flush=True)
        done.append(cell)
        write(complete=False)

    print(HEADER, flush=True)
    asyncio.run(run_fleet(config, on_cell=finished, skip=len(kept) // config.cells_per_group))
    write(complete=True)
    return 0


def resume(out: Path) -> int:
    """``--resume DIR``: DIR/fleet.json's sweep, its configuration as it ran. Its whole groups are kept (a
    group's cells share one engine and server, so a group cut short runs again from its start); the run
    appends itself to ``resumed`` (provenance, time, cells kept), the first run's provenance stays."""
    path = out / "fleet.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("complete", True):
        raise SystemExit(f"{path}: the sweep is complete; nothing to resume")
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["config"].items()}
    config = FleetConfig(**fields)
    cells = cells_of(doc)
    kept = cells[: len(cells) // config.cells_per_group * config.cells_per_group]
    resumed = [
        *doc.get("resumed", []),
        {"provenance": msgspec.to_builtins(provenance()), "started": time.time(), "cells_kept": len(kept)},
    ]
    head = {k: doc[k] for k in ("config", "command", "provenance", "started") if k in doc}
    print(f"{path}: {len(kept)} cells of whole groups kept, {len(cells) - len(kept)} run again", flush=True)
    return sweep(config, {**head, "resumed": resumed}, kept, out)
