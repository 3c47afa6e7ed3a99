"""Several engine replicas behind one API process, and the policy that picks one per engine sequence
(docs/engine.md, "Replicas and routing").

``serve --engine URL1,URL2,…`` gives the API tier M replicas of one engine (every replica must list the
same models). Each *engine sequence* — one response's turns (``sampler.engine.EngineSequence``) — is routed
once, at its first turn, when its prompt is known, and stays on that replica for its life: a long-lived
response's suspended KV is there, and its pin (``DELETE /v1/sequences/{id}``) must reach the engine that
holds it. HTTP and GA WebSocket responses are one sequence each, so each of their turns is routed anew —
which is where the policies differ.

The policies (``--engine-routing``):

* ``random`` — a uniform draw (seeded by ``--engine-routing-seed``): no affinity at all, the floor.
* ``least-loaded`` — the replica with the fewest streams this process has in flight to it (the
  outstanding requests the API tracks, as vLLM production-stack's QPS fallback and llm-d's queue scorer
  read load), ties to the replica routed to least so far, then the lowest index.
* ``prefix-aware`` — llm-d's endpoint picker: its ``prefix-cache-scorer`` (gateway-api-inference-extension,
  ``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``) cuts the prompt into blocks, block
  *i*'s hash chaining block *i − 1*'s, the first seeded with what scopes the engine's cache (the model and
  the sequence's cache salt); at most ``MAX_PREFIX_BLOCKS`` leading blocks are hashed; an LRU index per
  replica remembers the hashes of the prompts routed there; a replica scores the share of the prompt's
  hashes its index holds as a leading run. Its default profile adds the queue scorer's (weights
  ``PREFIX_WEIGHT`` and ``QUEUE_WEIGHT``) and takes the highest total; ties go to ``least-loaded``. So a
  rollout's next turn goes back to its prefix, while a prefix every agent shares (the tools before the
  conversation) no longer sends every new rollout to one replica. vLLM production-stack's ``prefixaware``
  router keeps the longest match alone, on a trie of 128-character chunks
  (``vllm_router/routers/routing_logic.py``, ``PrefixAwareRouter``; ties at random). The index is what
  this process routed, not what the engine kept: an evicted prefix still draws its prompts (both
  routers' documented approximation).
* ``sticky`` — one key, one replica: the request's ``prompt_cache_key`` when it has one (OpenAI routes on
  it with the prompt's first ~256 tokens: its prompt caching guide), else the client's connection (a
  WebSocket, or the keep-alive TCP connection of an HTTP request, as an L4 balancer sees it). A new key
  goes to ``least-loaded`` and is remembered (LRU, ``MAX_KEYS``); vLLM production-stack's ``session``
  router keys on a session header through a hash ring instead, with the lowest-QPS replica for a request
  without one.

The table (``Router``) is sans-IO: it takes the prompt and the loads and returns an index. ``Replicas`` holds
the ``RemoteEngine`` of each replica; its models and sequences implement ``sampler.engine.Engine`` and
``EngineSequence`` by delegating, once routed, to that replica's own. With ``--workers N`` each worker
routes by what it alone has seen.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Final

from proto.engine.client import RemoteEngine, RemoteModel, RemoteSequence
from sampler.engine import Breakpoint, EngineReport
from sampler.models import ModelLimits

POLICIES: Final = ("random", "least-loaded", "prefix-aware", "sticky")
# llm-d's defaults (plugin.go above): 256 leading blocks are hashed; longer prompts that agree on those
# are one prefix to the router. Its per-server LRU holds 31 250 entries (an H100's KV for an 8B model).
MAX_PREFIX_BLOCKS: Final = 256
LRU_PER_REPLICA: Final = 31_250
MAX_KEYS: Final = 65_536  # sticky keys remembered (LRU)
DEFAULT_BLOCK = 16  # vLLM's default block size, when the engine's card does not say
# llm-d's default scheduling profile weighs its prefix-cache scorer 3 and its queue scorer 2 and picks the
# highest total (Red Hat OpenShift AI 3.4, "Configuring scheduler settings for LLM inference services";
# the gpustack operator's llm-d-router profile: prefix 3, queue depth 2, KV utilization 2). The KV scorer
# is left out: the API tier does not see the replicas' KV occupancy.
PREFIX_WEIGHT: Final = 3.0
QUEUE_WEIGHT: Final = 2.0


def queue_scores(loads: Sequence[int]) -> list[float]:
    """llm-d's queue scorer: 1 for the least loaded replica, 0 for the most, linear between; 1 for all when
    they are equal."""
    low, high = min(loads), max(loads)
    if high == low:
        return [1.0] * len(loads)
    return [(high - load) / (high - low) for load in loads]


def block_hashes(prompt: Sequence[int], seed: str, block: int, limit: int = MAX_PREFIX_BLOCKS) -> list[int]:
    """The chained hashes of the prompt's full leading blocks (at most ``limit``): block *i*'s hash covers
    its tokens and block *i − 1*'s hash, the first the ``seed`` (model and cache salt). Python's hash of a
    tuple of ints is the same in every process (only str and bytes are salted per process)."""
    out: list[int] = []
    parent = hash(seed)
    for start in range(0, min(len(prompt), block * limit) - block + 1, block):
        parent = hash((parent, *prompt[start : start + block]))
        out.append(parent)
    return out


class Router:
    """The routing table of one API process for one set of replicas: picks a replica per sequence."""

    def __init__(self, policy: str, replicas: int, seed: int | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"--engine-routing must be one of {', '.join(POLICIES)}, not {policy!r}")
        if replicas < 1:
            raise ValueError("routing needs at least one replica")
        self.policy = policy
        self.replicas = replicas
        self.routed = [0] * replicas  # sequences sent to each replica
        self.prefix_hits = 0  # sequences routed to a replica that had seen a leading block of their prompt
        self._rng = random.Random(seed)
        self._index: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self._keys: OrderedDict[str, int] = OrderedDict()

    def pick(self, loads: Sequence[int], hashes: Sequence[int] = (), key: str = "") -> int:
        """The replica for a new sequence. ``loads``: each replica's streams in flight; ``hashes``: its
        prompt's ``block_hashes`` (prefix-aware); ``key``: its sticky key ("" when it has none)."""
        if len(loads) != self.replicas:
            raise ValueError(f"{len(loads)} loads for {self.replicas} replicas")
        if self.policy == "random":
            chosen = self._rng.randrange(self.replicas)
        elif self.policy == "least-loaded":
            chosen = self._least_loaded(loads, range(self.replicas))
        elif self.policy == "prefix-aware":
            matched = [self._matched(r, hashes) for r in range(self.replicas)]
            score = [
                PREFIX_WEIGHT * (m / len(hashes) if hashes else 0.0) + QUEUE_WEIGHT * q
                for m, q in zip(matched, queue_scores(loads), strict=True)
            ]
            best = max(score)
            chosen = self._least_loaded(loads, [r for r in range(self.replicas) if score[r] == best])
            self.prefix_hits += matched[chosen] > 0
        else:
            chosen = self._sticky(loads, key)
        self.routed[chosen] += 1
        return chosen

    def seen(self, replica: int, hashes: Sequence[int]) -> None:
        """Remember that ``replica`` was sent a prompt with these leading blocks (prefix-aware)."""
        if self.policy != "prefix-aware":
            return
        index = self._index[replica]
        for h in hashes:
            index[h] = None
            index.move_to_end(h)
        while len(index) > LRU_PER_REPLICA:
            index.popitem(last=False)

    def _matched(self, replica: int, hashes: Sequence[int]) -> int:
        index, n = self._index[replica], 0
        for h in hashes:
            if h not in index:
                break
            n += 1
        return n

    def _least_loaded(self, loads: Sequence[int], among: Sequence[int]) -> int:
        return min(among, key=lambda r: (loads[r], self.routed[r], r))

    def _sticky(self, loads: Sequence[int], key: str) -> int:
        if not key:
            return self._least_loaded(loads, range(self.replicas))
        chosen = self._keys.get(key)
        if chosen is None:
            chosen = self._least_loaded(loads, range(self.replicas))
            self._keys[key] = chosen
            if len(self._keys) > MAX_KEYS:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        return chosen


class Replicas:
    """M ``RemoteEngine``s of one engine and the router between them: what ``Engines.remote`` is with
    several ``--engine`` URLs (the same surface admission and ``/metrics`` read of one ``RemoteEngine``)."""

    def __init__(self, engines: list[RemoteEngine], policy: str, seed: int | None = None) -> None:
        self.engines = engines
        self.router = Router(policy, len(engines), seed)
        self.cards: list[dict[str, Any]] = []
        self.models: dict[str, RoutedModel] = {}

    async def start(self) -> None:
        """Start every replica (concurrently) and check that they serve the same models."""
        results = await asyncio.gather(*(e.start() for e in self.engines), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.aclose()
            raise failed[0]
        names = [sorted(e.models) for e in self.engines]
        if any(n != names[0] for n in names):
            await self.aclose()
            listed = "; ".join(f"{e.url}: {', '.join(n)}" for e, n in zip(self.engines, names, strict=True))
            raise RuntimeError(f"the engine replicas must serve the same models ({listed})")
        first = self.engines[0]
        self.cards = first.cards
        self.models = {name: RoutedModel(self, name, model) for name, model in first.models.items()}

    async def aclose(self) -> None:
        await asyncio.gather(*(e.aclose() for e in self.engines), return_exceptions=True)

    @property
    def lab_extension(self) -> bool:
        return all(e.lab_extension for e in self.engines)

    def refusing(self) -> float:
        """How much longer every replica is taken to be full: the door closes only when none has room."""
        return min(e.refusing() for e in self.engines)

    def metrics(self) -> dict[str, float]:
        """The replicas' hop gauges summed (one ``RemoteEngine``'s names)."""
        total: dict[str, float] = {}
        for e in self.engines:
            for name, value in e.metrics().items():
                total[name] = total.get(name, 0.0) + value
        return total

    def route(self, model: str, prompt: Sequence[int], salt: str, key: str) -> tuple[int, list[int]]:
        """The replica for a sequence's first turn, and its prompt's block hashes (for ``seen``)."""
        hashes: list[int] = []
        if self.router.policy == "prefix-aware":
            hashes = block_hashes(prompt, f"{model}\x1f{salt}", self.models[model].block_size)
        loads = [len(e.in_flight) for e in self.engines]
        return self.router.pick(loads, hashes, key), hashes


class RoutedModel:
    """One model on every replica: ``sampler.engine.Engine``."""

    def __init__(self, replicas: Replicas, name: str, first: RemoteModel) -> None:
        self.replicas = replicas
        self.name = name
        self.limits: ModelLimits = first.limits
        settings = next((c.get("settings") for c in replicas.cards if c.get("id") == name), None) or {}
        self.block_size = int(settings.get("block-size") or DEFAULT_BLOCK)
        capacities = [e.models[name].capacity for e in replicas.engines]
        # the sequences every replica holds at once: admission's room (None: a replica does not say)
        self.capacity = None if any(c is None for c in capacities) else sum(c or 0 for c in capacities)

    def open(self, keep_warm: bool = True, salt: str = "", affinity: str = "") -> RoutedSequence:
        return RoutedSequence(self, keep_warm, salt, affinity)


class RoutedSequence:
    """One response's turns: routed at its first turn, then that replica's ``RemoteSequence``."""

    def __init__(self, model: RoutedModel, keep_warm: bool, salt: str, affinity: str) -> None:
        self.model = model
        self.keep_warm = keep_warm
        self.salt = salt
        self.affinity = affinity
        self.replica: int | None = None
        self.inner: RemoteSequence | None = None
        self._retention: tuple[Breakpoint, ...] | None = None
        self._closed = False

    @property
    def limits(self) -> ModelLimits:
        return self.model.limits

    @property
    def last_report(self) -> EngineReport | None:
        return self.inner.last_report if self.inner is not None else None

    @last_report.setter
    def last_report(self, value: EngineReport | None) -> None:
        if self.inner is not None:
            self.inner.last_report = value

    @property
    def live(self) -> EngineReport | None:
        return self.inner.live if self.inner is not None else None

    @live.setter
    def live(self, value: EngineReport | None) -> None:
        if self.inner is not None:
            self.inner.live = value

    @property
    def retention(self) -> tuple[Breakpoint, ...] | None:
        return self._retention

    @retention.setter
    def retention(self, value: tuple[Breakpoint, ...] | None) -> None:
        self._retention = value
        if self.inner is not None:
            self.inner.retention = value

    def run_turn(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], every_s: float = 0.0
    ) -> AsyncGenerator[int, None]:
        """The replica's own turn (no generator of ours in between): routed here on the first turn."""
        if self._closed:
            raise RuntimeError("sequence closed")
        model, replicas = self.model, self.model.replicas
        if self.inner is None:
            self.replica, hashes = replicas.route(model.name, prompt_ids, self.salt, self.affinity)
            engine = replicas.engines[self.replica]
            self.inner = engine.models[model.name].open(self.keep_warm, self.salt)
            self.inner.retention = self._retention
        elif replicas.router.policy == "prefix-aware":  # its later prompts live on its replica too
            hashes = block_hashes(prompt_ids, f"{model.name}\x1f{self.salt}", model.block_size)
        else:
            hashes = []
        assert self.replica is not None
        replicas.router.seen(self.replica, hashes)
        return self.inner.run_turn(prompt_ids, output_ids, every_s)

    def suspend(self) -> None:
        if self.inner is not None:
            self.inner.suspend()

    def close(self) -> None:
        self._closed = True
        if self.inner is not None:
            self.inner.close()
