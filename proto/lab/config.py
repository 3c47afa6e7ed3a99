"""The lab's configuration: what a run measures (``BenchConfig``), the hop profiles, and the pieces of a
rollout that the runner and the fast model share (the warm-up session, the nonce)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

import msgspec

from proto.lab.run.network import network_named
from proto.lab.workload.traces import Round, Session
from sampler.policy import PlannedCall


@dataclass(frozen=True)
class Profile:
    """The rules a cell's server runs under, alike for every design (docs/lab.md, "Equal rules"): the
    latencies of the remote services the seed's design removed or shortened, where the safety classifier's
    hop sits (``before`` the prefill, or ``beside`` it: the overlap) and what it classifies. A factor of
    the experiment: a named preset, or any point of hop ms × placement × content (``profile``)."""

    name: str
    safety_hop_ms: float
    resolve_hop_ms: float
    store_hop_ms: float = 0.0
    placement: str = "before"  # --safety-placement: before | beside
    classify: str = "new"  # --safety-classify: user | new | all
    # The link between the clients and this server (``NAME@NETWORK``; docs/lab.md, "Network"): None is
    # loopback, the server in the lab's own namespace.
    network: str | None = None

    def flags(self) -> list[str]:
        """The ``responses-lab serve`` flags that set it."""
        return [
            "--safety-hop-ms",
            str(self.safety_hop_ms),
            "--resolve-hop-ms",
            str(self.resolve_hop_ms),
            "--store-hop-ms",
            str(self.store_hop_ms),
            "--safety-placement",
            self.placement,
            "--safety-classify",
            self.classify,
        ]

    def factors(self) -> dict[str, object]:
        """What a run's results record of it: every rule its cells ran under, and behind a link its network
        (the link's profile and source)."""
        link = None if self.network is None else msgspec.to_builtins(network_named(self.network))
        network = {} if link is None else {"network": link}
        return {
            "safety_hop_ms": self.safety_hop_ms,
            "resolve_hop_ms": self.resolve_hop_ms,
            "store_hop_ms": self.store_hop_ms,
            "safety_placement": self.placement,
            "safety_classify": self.classify,
            **network,
        }


# Peers: other projects' Responses servers the lab runs as one more mode each (docs/lab.md, "Peers";
# proto/lab/run/peers.py).
AGENTIC_API = "agentic-api"
PEER_MODES: tuple[str, ...] = (AGENTIC_API,)

# Values argued in docs/lab.md, "Profiles": a BERT-scale safety classifier behind an in-region RPC
# (10–50 ms per check in published guardrail budgets; we take 20 ms), and one in-region RPC each to a
# routing/config service for model resolution and to the response store (inter-AZ RTT 1.3–2.1 ms measured
# on EC2; we take 2 ms). `local` — measured work only — is the primary profile.
PROFILES: dict[str, Profile] = {
    "local": Profile("local", 0.0, 0.0),
    "production-like": Profile("production-like", 20.0, 2.0, 2.0),
    # The same hops with the classifier beside the prefill, as async moderation runs it.
    "production-like-beside": Profile("production-like-beside", 20.0, 2.0, 2.0, "beside"),
    # The hop curve's third real-clock point: a safety classifier at the top of the published 10-50 ms
    # range, and the resolve and store hops at a tenth of it as in production-like (docs/lab.md,
    # "Profiles").
    "remote": Profile("remote", 50.0, 5.0, 5.0),
}
PLACEMENTS = ("before", "beside")
CLASSIFY = ("user", "new", "all")


def profile_named(name: str) -> Profile:
    """A preset, or a point of the parametric factor named ``hops:SAFETY/RESOLVE/STORE[:PLACEMENT]
    [:CLASSIFY]`` (ms; e.g. ``hops:20/2/2:beside:user``), either behind a network: ``…@NETWORK``
    (proto/lab/run/network.py, ``network_named``). ``ValueError`` names what is wrong."""
    rules, at, network = name.rpartition("@")
    if at:
        network_named(network)  # its ValueError names what is wrong
        return replace(profile_named(rules), name=name, network=network)
    if name in PROFILES:
        return PROFILES[name]
    kind, _, spec = name.partition(":")
    if kind != "hops" or not spec:
        raise ValueError(f"unknown profile {name!r} (presets: {', '.join(PROFILES)}; or hops:S/R/ST[:…])")
    hops, *rest = spec.split(":")
    try:
        safety, resolve, store = (float(part) for part in hops.split("/"))
    except ValueError:
        raise ValueError(f"profile {name!r}: hops are SAFETY/RESOLVE/STORE in ms, e.g. hops:20/2/2") from None
    placements = [r for r in rest if r in PLACEMENTS]
    contents = [r for r in rest if r in CLASSIFY]
    known = len(placements) + len(contents) == len(rest)
    if not known or len(placements) > 1 or len(contents) > 1 or min(safety, resolve, store) < 0:
        raise ValueError(
            f"profile {name!r}: after the hops, a placement ({'|'.join(PLACEMENTS)}) and a content rule "
            f"({'|'.join(CLASSIFY)}), each at most once; hops >= 0"
        )
    placement = placements[0] if placements else "before"
    return Profile(name, safety, resolve, store, placement, contents[0] if contents else "new")


def with_networks(profiles: tuple[str, ...], networks: tuple[str, ...]) -> tuple[str, ...]:
    """``bench --network``: every profile behind every network (``NAME@NETWORK``), in that order."""
    return tuple(f"{p}@{n}" for p in profiles for n in networks)


@dataclass
class BenchConfig:
    modes: tuple[str, ...] = ("http", "http-cached", "http-prev", "ws", "longlived")
    workloads: tuple[str, ...] = ("coding-agent",)
    models: tuple[str, ...] = ("mock-1000tps",)
    # `local` first: measured work only is the primary result; both placements of the classifier's hop.
    profiles: tuple[str, ...] = ("local", "production-like", "production-like-beside")
    sessions: int = 4
    rollouts: int = 3  # measured, per session: 4 x 3 = 12 per mode, >= 10 (docs/lab.md, "Statistics")
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
    server_flags: tuple[str, ...] = ()  # more ``responses-lab serve`` flags (a scenario's API-cost knob)
    predict: bool = True  # calibrate the fast model first and report each cell's prediction
    calibration_rounds: int = 240  # per mode (--predict-rounds)
    reconnect: int = 0  # ws: a reconnect to the other server every K turns (0: never)
    db: str | None = (
        None  # the lab's servers' --db (default: a memory database; reconnect, workers: a shared file)
    )
    # The topology of the servers the lab starts: the engine (None: in process; a URL: that engine;
    # "spawn": a `responses-lab engine` the lab starts and every profile's server shares) and the API
    # processes in front of it (`serve --workers N`; N > 1 without an engine starts one of its own).
    engine: str | None = None
    workers: int = 1
    # The experiment's design (docs/lab.md, "Method"): the run's seed (each rollout's tool times, the mock
    # GPU's jitter), the mock GPU's jitter on (``JITTER``), and a fresh server per rollout index.
    seed: int = 1
    jitter: bool = True
    fresh_server: bool = False

    @classmethod
    def quick_preset(cls) -> BenchConfig:
        """< 3 min on 2 cores: 15 of coding-agent's 30 turns (history 6 k → 31 k tokens), mock-4000tps,
        tool waits ×0.02, 2 sessions × 2 measured rollouts (4 per mode: fewer than a default cell's 12, and
        it says so), 200 pings, two profiles (the classifier before the prefill only). Tool waits are
        identical in every mode of a rollout and only dilute E2E ratios; drawn per rollout they would take
        ~10 s a rollout at ×0.1, five times the quick run's budget. The full run keeps them as drawn."""
        return cls(
            models=("mock-4000tps",),
            sessions=2,
            rollouts=2,
            turns=15,
            tool_time_scale=0.02,
            pings=200,
            quick=True,
            calibration_rounds=120,
            profiles=("local", "production-like"),
        )


# The mock GPU's jitter in lab runs (docs/lab.md, "Jitter"): std-devs as fractions of the mean, read off a
# published single-stream serving benchmark (SGLang bench_serving, DeepSeek-OCR, concurrency 1, on the
# radixark cookbook's DeepSeek-OCR page): median ITL 1.51 ms, p95 1.76, p99 1.93 -> sigma ~ 0.25 / 1.645
# = 0.15 ms ~ 10 %; median TTFT 20.89 ms, p99 24.81 -> sigma ~ 3.92 / 2.326 = 1.7 ms ~ 8 %.
JITTER = {"ttft-jitter-std": 0.08, "itl-jitter-std": 0.10}


def jitter_overrides(config: BenchConfig) -> tuple[str, ...]:
    """The ``--model-override``s that turn the mock GPU's jitter on for the run's models, seeded with the
    run's seed; before the user's own overrides, so a user's knob wins. None with ``jitter`` off."""
    if not config.jitter:
        return ()
    knobs = ",".join(f"{k}={v}" for k, v in JITTER.items())
    return tuple(f"{model}:{knobs},seed={config.seed}" for model in config.models)


# A trace cell's warm-up: code paths and connections, not the trace's sizes (its first prompt may be 30 k).
WARM = Session(
    "warm-up",
    0.0,
    (
        Round(16, (PlannedCall("tool", "{}"),), 0.0, result_tokens=(200,)),
        Round(16, (PlannedCall("tool", "{}"),), 0.0, result_tokens=(200,)),
        Round(16, (), 0.0, text="Warm."),
    ),
    first_tokens=600,
)


def nonce() -> str:
    # A fresh nonce per rollout keeps KV prefixes unshared. Twelve digits: cl100k splits digits in threes, so
    # every nonce is 4 tokens and usage stays comparable.
    return f"{uuid.uuid4().int % 10**12:012d}"
