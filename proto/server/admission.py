"""Admission: new work is refused at the door, before anything starts, so that work admitted is never shed.

Every create — HTTP, GA WebSocket, long-lived, on every path that opens a response — takes a ``Ticket``
from ``Admission.admit`` (``Pipeline.prepare`` calls it) and holds it until its response ends
(``ResponseDriver.run`` gives it back). The rule counts, per model, the responses open: running, waiting
for a batch slot, being prepared, and suspended on a tool call — a suspended response holds no slot, but it
will come back for one. Each open response has at most one sequence in the engine at a time, so while no
more are open than the engine runs plus the waiting it allows (``max-num-seqs`` + ``max-waiting``), the
engine's waiting queue cannot overflow: a resumed turn of an admitted response waits for a slot and is
never refused. A create past the limit is refused with ``rate_limit_exceeded`` (429) and a retry hint;
nothing has started (no ``response.created``, no ledger row, nothing stored).

The limit: ``--max-admitted`` (0, the default: the engine's capacity; an engine shared by ``--workers N``
gives each worker its share; a larger value is capped to the capacity). An engine in another process that
does not say its capacity (a real vLLM) is bounded by ``--max-admitted`` alone, and by its own refusals:
while it refuses for load (``RemoteEngine.refusing``), creates are refused here for as long as it asked.

Policy and its alternatives: docs/decisions/0018-admission-counts-suspended-rollouts.md.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proto.core.errors import ClientError
from proto.engine.client import RemoteEngine
from proto.engine.routing import Replicas
from proto.server.config import Settings
from sampler.models import ModelSpec

__all__ = ["Admission", "AdmissionCollector", "Ticket"]

# The spread of the retry hint around --retry-after-ms: OpenAI's SDKs wait exactly what the hint says (no
# jitter of their own when one is given), so refused clients spread out only if the hints do.
JITTER = 0.5


class Engines(Protocol):
    """What admission reads of the routing table (``proto.server.pipeline.Engines``): the in-process
    models' knobs, or the engine in another process."""

    specs: dict[str, ModelSpec]
    remote: RemoteEngine | Replicas | None

    def names(self) -> frozenset[str]: ...


class Ticket:
    """One admitted response's place; ``release`` gives it back (exactly once: later calls do nothing)."""

    __slots__ = ("_admission", "model")

    def __init__(self, admission: Admission, model: str) -> None:
        self._admission: Admission | None = admission
        self.model = model

    def release(self) -> None:
        admission, self._admission = self._admission, None
        if admission is not None:
            admission.open[self.model] -= 1


class Admission:
    def __init__(self, settings: Settings, engines: Engines, rng: random.Random | None = None) -> None:
        self.max_admitted = settings.max_admitted
        self.retry_after_s = settings.retry_after_ms / 1e3
        self.workers = max(1, settings.workers)
        self.engines = engines
        self.open: dict[str, int] = {}  # model -> responses admitted and not ended
        self.shed: dict[str, int] = {}  # model -> creates refused
        self._rng = rng or random.Random()

    def limit(self, model: str) -> int | None:
        """How many responses of ``model`` may be open at once (``None``: no limit of ours)."""
        capacity = self.capacity(model)
        if capacity is None:
            return self.max_admitted or None
        return min(self.max_admitted, capacity) if self.max_admitted else capacity

    def capacity(self, model: str) -> int | None:
        """The engine's running + waiting sequences for ``model`` (this worker's share), if it says."""
        spec = self.engines.specs.get(model)
        if spec is not None:
            return spec.max_num_seqs + spec.max_waiting
        remote = self.engines.remote
        card = remote.models.get(model) if remote is not None else None
        if card is None or card.capacity is None:
            return None
        return max(1, card.capacity // self.workers)

    def admit(self, model: str) -> Ticket:
        """A place for one new response of ``model``, or ``ClientError('rate_limit_exceeded')`` with a retry
        hint. The one check every create path makes (``Pipeline.prepare``)."""
        self.check(model)
        self.open[model] = self.open.get(model, 0) + 1
        return Ticket(self, model)

    def check(self, model: str) -> None:
        """``admit``'s refusal without taking a place: a create that would be refused now is refused before
        its pre-inference work (a shed create costs the server next to nothing)."""
        count = self.open.get(model, 0)
        limit = self.limit(model)
        remote = self.engines.remote
        refusing = remote.refusing() if remote is not None else 0.0
        if refusing > 0.0:
            raise self._refuse(model, "the engine refused work for load", max(refusing, self.retry_after_s))
        if limit is not None and count >= limit:
            raise self._refuse(model, f"{count} responses are open (limit {limit}, --max-admitted)")

    def _refuse(self, model: str, why: str, base_s: float | None = None) -> ClientError:
        self.shed[model] = self.shed.get(model, 0) + 1
        base = self.retry_after_s if base_s is None else base_s
        wait = base * (1.0 + JITTER * (2.0 * self._rng.random() - 1.0))
        return ClientError(
            "rate_limit_exceeded",
            f"{model} is at capacity: {why}; nothing was started. Please try again in {wait:.3f}s.",
            retry_after_s=wait,
        )


class AdmissionCollector(Collector):
    """``/metrics``: per model, the responses admitted and open, the limit, and the creates refused."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        admission = self.admission
        models = sorted(set(admission.engines.names()) | set(admission.open) | set(admission.shed))
        open_ = GaugeMetricFamily("responses_lab_admitted", "responses admitted and open", labels=["model"])
        limit = GaugeMetricFamily(
            "responses_lab_admission_limit", "responses that may be open at once (0: none)", labels=["model"]
        )
        shed = CounterMetricFamily(
            "responses_lab_creates_shed", "creates refused at the door", labels=["model"]
        )
        for model in models:
            open_.add_metric([model], float(admission.open.get(model, 0)))
            limit.add_metric([model], float(admission.limit(model) or 0))
            shed.add_metric([model], float(admission.shed.get(model, 0)))
        yield from (open_, limit, shed)
