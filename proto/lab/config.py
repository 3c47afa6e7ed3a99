"""The lab's configuration: what a run measures (``BenchConfig``), the hop profiles, and the pieces of a
rollout that the runner and the fast model share (the warm-up session, the nonce)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from proto.lab.traces import Round, Session
from sampler.policy import PlannedCall


@dataclass(frozen=True)
class Profile:
    """Hop latencies of the remote services the seed's design removed or shortened (server flags)."""

    name: str
    safety_hop_ms: float
    resolve_hop_ms: float


# Peers: other projects' Responses servers the lab runs as one more mode each (docs/lab.md, "Peers";
# proto/lab/peers.py).
AGENTIC_API = "agentic-api"
PEER_MODES: tuple[str, ...] = (AGENTIC_API,)

# Values argued in docs/lab.md, "Profiles": a BERT-scale safety classifier behind an in-region RPC
# (10–50 ms per check in published guardrail budgets; we take 20 ms), and one in-region RPC to a
# routing/config service for model resolution (inter-AZ RTT 1.3–2.1 ms measured on EC2; we take 2 ms).
PROFILES: dict[str, Profile] = {
    "local": Profile("local", 0.0, 0.0),
    "production-like": Profile("production-like", 20.0, 2.0),
    # The hop curve's third real-clock point: a safety classifier at the top of the published 10-50 ms
    # range, and the resolve hop at a tenth of it as in production-like (docs/lab.md, "Profiles").
    "remote": Profile("remote", 50.0, 5.0),
}


@dataclass
class BenchConfig:
    modes: tuple[str, ...] = ("http", "http-cached", "http-prev", "ws", "longlived")
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

    @classmethod
    def quick_preset(cls) -> BenchConfig:
        """< 3 min on 2 cores: 15 of coding-agent's 30 turns (history 6 k → 31 k tokens), mock-4000tps,
        tool waits ×0.1, 2 sessions × 1 measured rollout, 200 pings. Tool waits are identical in every mode
        and only dilute E2E ratios; the full run keeps them as recorded."""
        return cls(
            models=("mock-4000tps",),
            sessions=2,
            rollouts=1,
            turns=15,
            tool_time_scale=0.1,
            pings=200,
            quick=True,
            calibration_rounds=120,
        )


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
