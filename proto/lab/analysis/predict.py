"""The fast model (``responses-lab bench --predict``): each mode's per-round API overhead measured on this
machine, composed with any model, workload and hop profile into E2E and TTFT.

**Measure.** A calibration server (its own process, no hops, a model with zero prefill and 4 000 tokens/s
decode) and one client per mode replay a seeded calibration workload, session by session with every mode in
turn (so the shared machine's other load falls on every mode alike): rounds whose history grows to
``h_max`` tokens, appended sizes log-uniform 50 → 8 000 tokens, outputs 4 → 64 tokens (every 24th round
256 → 2 048: ``LONG_OUTPUTS``), no tool time, a user message every 8th round and a history rewrite every
6th. Per round the client's timeline and the server's report give

* ``c`` — the round's whole overhead: (its end event − the previous round's end) − tool wait − the
  modelled queue, prefill and decode; a rollout's E2E is exactly Σ (c + tools + modelled);
* ``o`` — the part of it before the first token (TTFT − prefill − queue);
* the remote calls the server made for it (``safety_hops``, ``model_resolutions``, per response).

Each mode × round kind (first, outputs, user, rewrite) gets a least-squares fit ``c, o ≈ b0 + b1·H + b2·A
+ b3·chain + b4·O`` (H: prompt tokens; A: tokens after what the previous context kept; chain: stored
responses a continuation loads; O: output tokens), refitted once without the rounds whose residual exceeds
5 median absolute deviations (the shared machine's stalls), and the mean hop counts.

**Compose.** E2E = Σ over rounds (c + hops × hop ms + API-cost knob + queue + prefill + decode + tools):
the modelled parts come from the very engine the server runs (``sampler.gpu.MockGPU``, its KV cache and
batch slots, on a virtual clock), so queueing, load factor and cache hits are the server's own; with one
session a round is the sum, with several (lock-step copies or a trace's arrivals) the sessions run
concurrently on one simulated GPU, and the server's own work of rounds served at the same time shares its
event loop's core (processor sharing, ``SharedCore``): each is slowed by what the others do meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from proto.lab.analysis.metrics import Trace, round_times
from proto.lab.config import PROFILES, WARM, BenchConfig, Profile, nonce, profile_named
from proto.lab.run.clients import make_client
from proto.lab.run.design import draw_tool_times, rollout_seed
from proto.lab.workload.plan import RolloutPlan, build_plan
from proto.lab.workload.traces import Replay, Round, Session
from proto.processes import ChildServer
from sampler.clock import FakeClock
from sampler.gpu import MockGPU
from sampler.models import ModelSpec
from sampler.policy import PlannedCall

KINDS = ("first", "outputs", "user", "rewrite")
CALIBRATION_MODEL = "mock-4000tps"
CALIBRATION_OVERRIDE = (
    f"{CALIBRATION_MODEL}:prefill-overhead=0,prefill-time-per-token=0,time-to-first-token=0"
)
_FEATURES = ("1", "H", "A", "chain", "O")
# latency knobs: the server sleeps, its core is free
_SLEPT = frozenset({"safety_hop", "resolve_hop", "store_hop", "safety_wait", "api_cost"})


# ---- the calibration workload ------------------------------------------------------------------


# Output tokens of a calibration round: log-uniform over OUTPUTS, and every LONG_EVERY-th round over
# LONG_OUTPUTS, so the fit's O term spans the outputs the workloads use (a coding-agent turn hundreds of
# tokens, a trace's up to thousands) and not only the short ones. Each long round costs its decode (at the
# calibration model's 4 000 tok/s: ~0.2 s for the mean 860 tokens), so they are few.
OUTPUTS = (4, 64)
LONG_OUTPUTS = (256, 2048)
LONG_EVERY = 24


def calibration_replay(rounds: int, h_max: int, seed: int = 11) -> Replay:
    """Sessions of up to 24 rounds until ``rounds`` rounds in all; seeded, so two runs replay the same."""
    rng = random.Random(seed)
    long_rng = random.Random(seed + 1)  # its own stream: the other draws stay as they were
    counted = 0
    tool = (PlannedCall("tool", "{}"),)
    sessions: list[Session] = []
    left = rounds
    while left > 0:
        total = int(math.exp(rng.uniform(math.log(800), math.log(8000))))
        session: list[Round] = []
        n = min(left, 24)
        for r in range(n):
            out = int(math.exp(rng.uniform(math.log(OUTPUTS[0]), math.log(OUTPUTS[1]))))
            counted += 1
            if counted % LONG_EVERY == LONG_EVERY // 2:
                out = int(math.exp(long_rng.uniform(*(math.log(x) for x in LONG_OUTPUTS))))
            last = r == n - 1 or total > h_max
            message = not last and r % 8 == 7
            keep = None
            if r > 0 and r % 6 == 5:
                keep = int((session[-1].input_tokens or 0) * rng.uniform(0.6, 0.95))
            if r > 0:
                prev = session[-1]
                base = keep if keep is not None else (prev.input_tokens or 0) + prev.output_tokens
                # a rewrite clears every later item to a token: room for them
                low = 60 if keep is None else 1500
                total = base + int(math.exp(rng.uniform(math.log(low), math.log(8000))))
            session.append(
                Round(
                    out,
                    () if (last or message) else tool,
                    0.0,
                    input_tokens=total,
                    keep=keep,
                    result_weights=() if (last or message) else (1.0,),
                )
            )
            if last:
                break
        sessions.append(Session(f"calibration#{len(sessions)}", 0.0, tuple(session)))
        left -= len(session)
    return Replay("calibration", "the fast model's calibration workload", tuple(sessions), trace=True)


# ---- samples and fits ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    mode: str
    kind: str
    H: int
    A: int
    chain: int
    out: int  # output tokens (O)
    c_ms: float
    o_ms: float
    busy_ms: (
        float  # the server's own timed phases of the round (its event loop's CPU), hops and knobs excluded
    )
    safety_hops: int
    resolutions: int


def chains(mode: str, plan: RolloutPlan) -> list[int]:
    """Per round, how many stored responses the server loads to continue (``http-prev``'s chain, a
    long-lived create chained on an ended response); 0 where nothing is loaded."""
    out: list[int] = []
    length = 0
    for send in plan.sends:
        if send.kind in ("first", "rewrite") or mode in ("http", "http-cached"):
            length = 0
        elif mode == "longlived":
            length += send.kind == "user"
        else:
            length += 1
        out.append(length if mode in ("http-prev", "longlived") else 0)
    return out


def samples_of(mode: str, plan: RolloutPlan, trace: Trace) -> list[Sample]:
    times = round_times(trace.marks)
    if len(times) != len(plan.sends) or len(trace.reports) != len(plan.sends):
        raise ValueError(
            f"{mode}: {len(times)} rounds timed, {len(trace.reports)} reported, {len(plan.sends)} planned"
        )
    hops = _hops_by_round(trace)
    out = []
    previous_end = times[0].sent
    for k, (send, t, report, chain, (safety, resolve)) in enumerate(
        zip(plan.sends, times, trace.reports, chains(mode, plan), hops, strict=True)
    ):
        modelled = (
            float(report["queue_wait_ms"]) + float(report["prefill_ms"]) + float(report["decode_ms"])
        ) / 1e3
        c = (t.end - previous_end) - send.wait_s * (k > 0) - modelled
        o = (t.first - t.sent) - (float(report["queue_wait_ms"]) + float(report["prefill_ms"])) / 1e3
        busy = sum(float(v) for name, v in (report.get("phases_ms") or {}).items() if name not in _SLEPT)
        out.append(
            Sample(
                mode,
                send.kind,
                send.prompt_tokens,
                send.appended_tokens,
                chain,
                send.output_tokens,
                c * 1e3,
                o * 1e3,
                busy,
                safety,
                resolve,
            )
        )
        previous_end = t.end
    return out


def _hops_by_round(trace: Trace) -> list[tuple[int, int]]:
    """Each response's remote calls, on its first round (they are paid before it starts)."""
    out: list[tuple[int, int]] = []
    for turns, safety, resolve in trace.hops:
        out += [(safety, resolve)] + [(0, 0)] * max(turns - 1, 0)
    return out


@dataclass
class Fit:
    """One mode × kind: coefficients over ``_FEATURES`` (ms per unit; H, A in tokens), hop means."""

    c: list[float]
    o: list[float]
    busy: list[float]
    safety_hops: float
    resolutions: float
    n: int
    dropped: int = 0

    def at(self, coef: Sequence[float], H: int, A: int, chain: int, out: int) -> float:
        return max(coef[0] + coef[1] * H + coef[2] * A + coef[3] * chain + coef[4] * out, 0.0)


def _lstsq(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> tuple[list[float], np.ndarray[Any, Any]]:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return [float(v) for v in coef], y - x @ coef


@dataclass
class _Job:
    end: float  # when its share of the core has done its work (later as other rounds arrive)
    extra: float = 0.0  # how much later than alone


class SharedCore:
    """The server's event loop as one core shared by the rounds it serves at once (processor sharing): a
    round arriving while others are served overlaps them, and each is slowed by what the other does
    meanwhile. Lock-step sessions stay in lock-step (each waits for the other's work every round), where a
    first-come-first-served queue would let the second fall behind once and never meet the first again."""

    def __init__(self) -> None:
        self.jobs: list[_Job] = []

    def arrive(self, t: float, work: float) -> _Job:
        job = _Job(t + work)
        for other in self.jobs:
            if other.end > t:
                overlap = min(other.end - t, work)
                other.end += overlap
                other.extra += overlap
                job.end += overlap
                job.extra += overlap
        self.jobs = [j for j in self.jobs if j.end > t]
        self.jobs.append(job)
        return job


# Each calibration round is measured this many times (the whole replay again, every mode in turn) and its
# median kept: a stall of the shared machine lands on one pass of a round, not on the fit. With one pass
# the mode ÷ http ratios of two back-to-back runs moved by up to 5.8–7 %
# (docs/decisions/0016-fast-model-three-passes-and-a-shared-core.md).
PASSES = 3


def median_sample(runs: Sequence[Sample]) -> Sample:
    """One round measured on several passes (the same round: same features): its median figures."""
    first = runs[0]
    return dataclasses.replace(
        first,
        c_ms=statistics.median(s.c_ms for s in runs),
        o_ms=statistics.median(s.o_ms for s in runs),
        busy_ms=statistics.median(s.busy_ms for s in runs),
    )


def fit(samples: Sequence[Sample]) -> Fit:
    x = np.array([[1.0, s.H, s.A, s.chain, s.out] for s in samples])
    keep = np.ones(len(samples), dtype=bool)
    for _ in range(2):  # fit, drop the stalls (> 5 MADs), fit again
        coefs = []
        for y in (
            np.array([s.c_ms for s in samples]),
            np.array([s.o_ms for s in samples]),
            np.array([s.busy_ms for s in samples]),
        ):
            coef, _ = _lstsq(x[keep], y[keep])
            coefs.append(coef)
        residual = np.array([s.c_ms for s in samples]) - x @ np.array(coefs[0])
        mad = float(np.median(np.abs(residual - np.median(residual)))) or 1e-9
        keep = np.abs(residual - np.median(residual)) <= 5 * mad * 1.4826
    return Fit(
        coefs[0],
        coefs[1],
        coefs[2],
        statistics.fmean(s.safety_hops for s in samples),
        statistics.fmean(s.resolutions for s in samples),
        len(samples),
        int((~keep).sum()),
    )


@dataclass
class Calibration:
    fits: dict[str, dict[str, Fit]]  # mode -> kind -> fit
    samples: list[Sample]
    wall_s: float
    h_max: int

    def get(self, mode: str, kind: str) -> Fit:
        """A kind with too few calibration rounds borrows: a first round is a full create, as a rewrite is."""
        by_kind = self.fits[mode]
        for name in (kind, "rewrite" if kind == "first" else kind, "outputs"):
            if name in by_kind:
                return by_kind[name]
        raise KeyError(f"no calibration for {mode}")

    def overhead_ratio(self) -> dict[str, float]:
        """Mode ÷ http: the fitted overhead summed over the calibration's own rounds (the repeatability
        figure: same seed, same rounds, every mode)."""
        total: dict[str, float] = {}
        for s in self.samples:
            if s.mode == "http":
                for mode in self.fits:
                    f = self.get(mode, s.kind)
                    total[mode] = total.get(mode, 0.0) + f.at(f.c, s.H, s.A, s.chain, s.out)
        base = total.get("http") or 1.0
        return {mode: v / base for mode, v in total.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        """The fits ``to_json`` wrote (a kept run's ``calibration``); its samples are not kept there."""
        fits = {
            mode: {
                kind: Fit(
                    f["c_ms"],
                    f["o_ms"],
                    f["busy_ms"],
                    f["safety_hops"],
                    f["model_resolutions"],
                    f["rounds"],
                    f["dropped"],
                )
                for kind, f in kinds.items()
            }
            for mode, kinds in data["fits"].items()
        }
        return cls(fits, [], data["wall_s"], data["h_max"])

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "h_max": self.h_max,
            "workload": "calibration",  # calibration_replay's, never a cell's (analysis/validate.py)
            "outputs": [OUTPUTS[0], LONG_OUTPUTS[1]],  # the output tokens its rounds span
            "features": list(_FEATURES),
            "fits": {
                mode: {
                    kind: {
                        "c_ms": f.c,
                        "o_ms": f.o,
                        "busy_ms": f.busy,
                        "safety_hops": f.safety_hops,
                        "model_resolutions": f.resolutions,
                        "rounds": f.n,
                        "dropped": f.dropped,
                    }
                    for kind, f in kinds.items()
                }
                for mode, kinds in self.fits.items()
            },
            "overhead_vs_http": self.overhead_ratio(),
            "rounds_by_mode": {mode: sum(1 for s in self.samples if s.mode == mode) for mode in self.fits},
            "c_ms_by_mode_at": {
                mode: {
                    f"H={h // 1000}k": self.get(mode, "outputs").at(
                        self.get(mode, "outputs").c, h, 1000, 5, 50
                    )
                    for h in (1000, 8000, 32000, 100_000)
                }
                for mode in self.fits
            },
        }


async def calibrate(
    modes: Sequence[str],
    rounds: int,
    h_max: int,
    api_key: str | None = None,
    on_turn: Callable[[], None] | None = None,
    passes: int = PASSES,
) -> Calibration:
    """Start the calibration server, replay the calibration workload over each mode ``passes`` times,
    take each round's median over the passes, fit."""
    replay = calibration_replay(rounds, h_max)
    t0 = time.perf_counter()
    measured: dict[tuple[str, int], list[list[Sample]]] = {}
    flags = ["--log-level", "warning", "--model-override", CALIBRATION_OVERRIDE]
    with ChildServer(flags, api_key=api_key) as server:
        clients = {mode: make_client(mode, server.ws_url, server.http_url, api_key) for mode in modes}
        try:
            for client in clients.values():
                client.on_send = on_turn
                await client.open()
                for _ in range(2):
                    await client.rollout(build_plan(WARM, CALIBRATION_MODEL, nonce()))
            # Session by session, every mode in turn: whatever else the shared machine runs meanwhile falls on
            # every mode alike, so the ratios between modes hold even when the absolute figures move.
            for _ in range(passes):
                for index, session in enumerate(replay.sessions):
                    for mode, client in clients.items():
                        plan = build_plan(session, CALIBRATION_MODEL, nonce())
                        measured.setdefault((mode, index), []).append(
                            samples_of(mode, plan, await client.rollout(plan))
                        )
        finally:
            for client in clients.values():
                await client.close()
    samples = [median_sample(rounds) for runs in measured.values() for rounds in zip(*runs, strict=True)]
    fits = {
        mode: {
            kind: fit(group)
            for kind in KINDS
            if len(group := [s for s in samples if s.mode == mode and s.kind == kind]) >= 6
        }
        for mode in modes
    }
    return Calibration(fits, samples, time.perf_counter() - t0, h_max)


# ---- composing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hops:
    safety_ms: float = 0.0
    resolve_ms: float = 0.0
    api_cost_ms: float = 0.0  # the HTTP modes' modelled API work (Settings.api_cost_ms)
    api_cost_ms_per_1k: float = 0.0
    store_ms: float = 0.0  # per store read (a chain link loaded: ``chains``)
    beside: bool = False  # the classifier's hop runs beside the prefill: the first token waits for the later

    @classmethod
    def of(cls, profile: Profile, api_cost_ms: float = 0.0, api_cost_ms_per_1k: float = 0.0) -> Hops:
        return cls(
            profile.safety_hop_ms,
            profile.resolve_hop_ms,
            api_cost_ms,
            api_cost_ms_per_1k,
            profile.store_hop_ms,
            profile.placement == "beside",
        )

    def api(self, mode: str, history: int) -> float:
        if mode in ("http", "http-prev"):
            return self.api_cost_ms + self.api_cost_ms_per_1k * history / 1000.0
        return self.api_cost_ms if mode == "http-cached" else 0.0


@dataclass
class Prediction:
    e2e_s: list[float] = field(default_factory=list)  # per rollout
    ttft_ms: list[float] = field(default_factory=list)  # per round
    # summed over rollouts: overhead, hops, queue, prefill, decode, tools
    parts_s: dict[str, float] = field(default_factory=dict)

    @property
    def e2e_s_p50(self) -> float:
        return float(np.percentile(self.e2e_s, 50)) if self.e2e_s else math.nan

    @property
    def ttft_ms_p50(self) -> float:
        return float(np.percentile(self.ttft_ms, 50)) if self.ttft_ms else math.nan


class _InstantClock:
    """Virtual time for one task alone: a sleep just moves the clock (nothing else could run meanwhile)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def timer(self) -> None:
        return None  # sleeps only: nothing else runs meanwhile


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 100_000) for _ in range(n)]


async def _session(
    cal: Calibration,
    mode: str,
    plan: RolloutPlan,
    gpu: MockGPU,
    clock: Any,
    hops: Hops,
    start_at: float,
    seed: int,
    out: Prediction,
    core: SharedCore,
) -> None:
    """One session's rollout on the simulated GPU. ``core`` is shared by the cell's sessions: a round's own
    server work (``busy``, the part of ``o`` the server's timed phases take) shares it with the rounds
    served at the same time (``SharedCore``)."""
    rng = random.Random(seed)
    await clock.sleep_until(start_at)
    t0 = clock.now()
    context: list[int] = []
    sequence = gpu.open()
    parts = out.parts_s
    try:
        for k, (send, chain) in enumerate(zip(plan.sends, chains(mode, plan), strict=True)):
            if k:
                await clock.sleep_until(clock.now() + send.wait_s)
                parts["tools"] = parts.get("tools", 0.0) + send.wait_s
            f = cal.get(mode, send.kind)
            c = f.at(f.c, send.prompt_tokens, send.appended_tokens, chain, send.output_tokens) / 1e3
            o = min(f.at(f.o, send.prompt_tokens, send.appended_tokens, chain, send.output_tokens) / 1e3, c)
            classifier = f.safety_hops * hops.safety_ms / 1e3
            hop = (
                f.resolutions * hops.resolve_ms + chain * hops.store_ms + hops.api(mode, send.prompt_tokens)
            ) / 1e3 + (0.0 if hops.beside else classifier)
            sent = clock.now()
            work = min(
                f.at(f.busy, send.prompt_tokens, send.appended_tokens, chain, send.output_tokens) / 1e3, o
            )
            job = core.arrive(sent, work)
            while clock.now() < sent + o + hop + job.extra:  # rounds arriving meanwhile slow it further
                await clock.sleep_until(sent + o + hop + job.extra)
            parts["contention"] = parts.get("contention", 0.0) + job.extra
            kept = send.prompt_tokens - send.appended_tokens
            prompt = context[:kept] + _ids(rng, send.prompt_tokens - min(kept, len(context)))
            prompt = prompt[: send.prompt_tokens]
            output = _ids(rng, send.output_tokens)
            # Beside the prefill, the classifier started with it; tokens due before it answers leave then.
            gate = clock.now() + (classifier if hops.beside else 0.0)
            async with contextlib.aclosing(sequence.run_turn(prompt, output)) as ticks:
                first = None
                async for _ in ticks:
                    if first is None:
                        first = max(clock.now(), gate)
            report = sequence.last_report
            assert report is not None
            await clock.sleep_until(gate)
            out.ttft_ms.append(((first if first is not None else clock.now()) - sent) * 1e3)
            await clock.sleep_until(clock.now() + (c - o))
            context = prompt + output
            for name, value in (
                ("overhead", c),
                ("hops", hop),
                ("queue", report.queue_wait_ms / 1e3),
                ("prefill", report.prefill_ms / 1e3),
                ("decode", report.decode_ms / 1e3),
            ):
                parts[name] = parts.get(name, 0.0) + value
    finally:
        sequence.close()
    out.e2e_s.append(clock.now() - t0)


def predict_cell(
    cal: Calibration,
    mode: str,
    replay: Replay,
    spec: ModelSpec,
    hops: Hops,
    sessions: int = 1,
    rollouts: int = 1,
    tool_time_scale: float = 1.0,
    seed: int | None = None,
) -> Prediction:
    """A cell as the runner runs it: ``sessions`` lock-step copies of a synthetic session, or a trace's own
    sessions at their arrival times; ``rollouts`` times over, each on a fresh engine state's KV prefix.
    ``seed``: a synthetic session's tool times drawn per rollout as the runner draws them
    (proto/lab/run/design.py); None: the workload file's."""
    out = Prediction()
    plans = [(_plan(s, i, tool_time_scale), s.arrival_s) for i, s in enumerate(replay.sessions)]
    if not replay.trace:
        plans = plans[:1] * sessions
    concurrent = len(plans) > 1

    def drawn(rep: int) -> list[tuple[RolloutPlan, float]]:
        if seed is None or replay.trace:
            return plans
        first = replay.sessions[0]
        return [
            (_plan(draw_tool_times(first, rollout_seed(seed, rep, k)), 0, tool_time_scale), 0.0)
            for k in range(len(plans))
        ]

    async def run() -> None:
        clock: Any = FakeClock(settle_rounds=2) if concurrent else _InstantClock()
        gpu = MockGPU(spec, clock)
        for rep in range(rollouts):
            core = SharedCore()
            tasks = [
                asyncio.ensure_future(
                    _session(
                        cal, mode, plan, gpu, clock, hops, clock.now() + arrival, 7919 * rep + i, out, core
                    )
                )
                for i, (plan, arrival) in enumerate(drawn(rep))
            ]
            if concurrent:
                while not all(t.done() for t in tasks):
                    await clock.run_until_idle()
                    await asyncio.sleep(0)
            await asyncio.gather(*tasks)

    asyncio.run(run()) if not _loop_running() else _run_in_thread(run)
    return out


@functools.lru_cache(maxsize=512)
def _plan(session: Session, index: int, tool_time_scale: float) -> RolloutPlan:
    # the model name is not used
    return build_plan(session, CALIBRATION_MODEL, f"{index:012d}", tool_time_scale)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _run_in_thread(factory: Callable[[], Any]) -> None:
    import threading

    error: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(factory())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="predict")
    thread.start()
    thread.join()
    if error:
        raise error[0]


def profile_hops(name: str, config: BenchConfig) -> Hops:
    """The hops and API-cost knobs a run's server had for ``name`` (its profile and server flags)."""
    try:
        profile = profile_named(name)
    except ValueError:  # ``external``: a server the lab did not start
        profile = PROFILES["local"]
    flags = list(config.server_flags)
    cost = _flag(flags, "--api-cost-ms")
    per_1k = _flag(flags, "--api-cost-ms-per-1k")
    return Hops.of(profile, cost, per_1k)


def _flag(flags: list[str], name: str) -> float:
    return float(flags[flags.index(name) + 1]) if name in flags else 0.0
