"""What the sampling loop needs from an engine, whichever it is: the in-process mock GPU
(``sampler.gpu.MockGPU``) or one in another process spoken to over vLLM's completions API
(``proto.engine.client.RemoteEngine``: the mock engine, ``responses-lab engine``, or a real vLLM).

The mock model decides *what* is said (the token ids); the engine decides *when* (each count it yields
releases that many of them). One ``EngineSequence`` per response: a long-lived response keeps it across
its turns, so the engine can keep the prefix warm while the response waits for a tool.

An engine that paces its tokens by deadlines on a clock of the server's own (the mock GPU) is also a
``PacedSequence``: its turn says *when* the next tokens fall due (a ``Pacing``) instead of sleeping until
then, so that its owner may wait for them on that clock's timer and take them from there, with no task
woken (docs/architecture.md, "The fast path"). An engine whose tokens arrive on the task's own reads (one
in another process) is not: it only yields counts.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from sampler.clock import Timer
from sampler.models import ModelLimits

__all__ = [
    "Breakpoint",
    "Engine",
    "EngineFailure",
    "EngineOverloaded",
    "EngineReport",
    "EngineSequence",
    "PacedSequence",
    "Pacing",
]


class EngineOverloaded(Exception):
    """The engine refused a sequence: its waiting queue is full (``max-waiting``). Refusing now beats
    queueing without bound."""


class EngineFailure(Exception):
    """The engine failed a turn: an injected fault (``fail-rate``) dying mid-stream as a crashed worker would,
    or an engine in another process that crashed, timed out or broke the protocol."""


@dataclass(frozen=True)
class Breakpoint:
    """A prefix the prompt cache is asked to keep (docs/protocol.md, "Prompt caching"): the prompt's full
    blocks up to token ``end`` (None: the whole chain, the turn's output included, as implicit mode's
    managed breakpoint at the prompt's end keeps it), each for ``ttl_s`` seconds after its last use on the
    engine's clock. ``ttl`` is the lifetime's name as the API reports it (``30m``, ``12h``); a block under
    several breakpoints lives the longest of their lifetimes."""

    end: int | None
    ttl: str
    ttl_s: float


@dataclass
class EngineReport:
    prompt_tokens: int
    cached_tokens: int
    prefill_ms: float  # modelled, load factor and jitter included: TTFT minus this is API overhead
    queue_wait_ms: float  # waiting for a batch slot
    decode_ms: float  # modelled: first token's deadline to the last one's
    output_tokens: int
    # Spans the API side measured around the engine call (``engine_hop`` for an engine in another
    # process); empty in process. They join the turn's phase breakdown.
    phases_ms: dict[str, float] = field(default_factory=dict)
    # Measured, not modelled: the engine's own CPU time before the prefill (prefix hashing, lookup, pins),
    # and how late its clock woke it for the first token (the simulator's share of TTFT past the model's).
    # None where not measured (an engine in another process).
    lookup_ms: float | None = None
    first_late_ms: float | None = None
    # Prompt tokens this turn stored in the prefix cache (full blocks it found missing and held after the
    # turn): what prompt caching reports as ``cache_write_tokens`` (docs/protocol.md, "Prompt caching").
    written_tokens: int = 0
    # The written tokens by the lifetime they were written under (``Breakpoint.ttl``; a sequence without
    # breakpoints writes without one, and reports none here).
    written_by_ttl: dict[str, int] = field(default_factory=dict)
    # Prompt tokens the prefix cache had stored right where this turn's match stopped, dropped as past their
    # lifetime: a miss that nothing in the prompt caused.
    expired_tokens: int = 0
    block_size: int = 0  # the prefix cache's block (0: not reported, e.g. by vLLM)

    def to_dict(self) -> dict[str, float | int]:
        """The engine's own figures, as numbers (the API side's spans are not the engine's to report; the
        written tokens by lifetime are ``written_by_ttl``)."""
        return {k: v for k, v in asdict(self).items() if not isinstance(v, dict)}


class EngineSequence(Protocol):
    last_report: EngineReport | None  # set when a turn completes
    # The turn in progress once the engine started it (prompt; cached tokens where the engine says), None
    # before: what a turn cut short bills (``sampler.loop.cut_turn``). Reset when the next turn starts.
    live: EngineReport | None
    # What prompt caching asks the prefix cache to keep (docs/protocol.md, "Prompt caching"): blocks under
    # no breakpoint are not written (``()``: nothing). None: all of it, without a lifetime (the cache's
    # LRU decides), as for a caller that is not an API request.
    retention: tuple[Breakpoint, ...] | None

    @property
    def limits(self) -> ModelLimits:
        """The model's context window and max output per call: the loop bounds every turn by them."""
        ...

    def run_turn(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], every_s: float = 0.0
    ) -> AsyncGenerator[int, None]:
        """Yield how many of ``output_ids`` are due at each wake-up (each ≥ 1, summing to their count);
        iterate under ``contextlib.aclosing`` so an abandoned turn frees the engine's slot at once.
        ``every_s`` > 0: no two yields closer than that (``--coalesce-ms``: what falls due meanwhile is
        yielded together; the first tokens are not held back).
        Raises ``EngineOverloaded`` (the engine refused: queue full) or ``EngineFailure`` (it failed,
        crashed, timed out or broke the protocol), before or during the stream."""
        ...

    def suspend(self) -> None:
        """The response waits for a tool between two turns (the engine's pin policy applies)."""
        ...

    def close(self) -> None:
        """Give everything back (slot, pins); idempotent, safe while a turn is suspended at a yield."""
        ...


class Pacing(Protocol):
    """A paced turn's schedule, handed to the owner while nothing is due (``PacedSequence.run_paced``): when
    the next tokens fall due on the engine's clock, and how to take them from that clock's timer."""

    @property
    def timer(self) -> Timer:
        """The engine clock's timer: deadlines from ``next_due`` are on its time scale."""
        ...

    def next_due(self) -> float | None:
        """When the next tokens fall due (a time already past when the wake-up is late); ``None`` when
        what comes next is the iterating task's: the turn's last tokens are out, an injected failure is
        next, the sequence was closed."""
        ...

    def release(self, limit: int) -> int:
        """Up to ``limit`` of the tokens due now (0 when none, or closed): they are the caller's, as a
        yield's count is, and are not yielded. Never blocks."""
        ...


@runtime_checkable
class PacedSequence(Protocol):
    """An ``EngineSequence`` whose turns are paced by deadlines on a clock with a timer (the mock GPU)."""

    def run_paced(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int]
    ) -> AsyncGenerator[int | Pacing, None]:
        """``run_turn`` without coalescing, where, after a yielded count, a wait for the next tokens is
        yielded as the ``Pacing`` of the turn instead of slept in the task. The owner may then release
        tokens from its timer; resuming the turn hands the rest back to it: what is due then is yielded, and
        if nothing is, the turn sleeps until it is (so resuming at once is always right)."""
        ...


class Engine(Protocol):
    @property
    def limits(self) -> ModelLimits:
        """The model's context window and max output per call, as its sequences report them: what an
        input is checked against while it is tokenized (``Tokenizer.prepare``)."""
        ...

    def open(self, keep_warm: bool = True, salt: str = "", affinity: str = "") -> EngineSequence:
        """A sequence for one response. ``keep_warm``: the response may resume after a tool call, so its
        prefix is worth holding between turns (an engine in another process is asked to pin it; the
        in-process mock GPU holds it anyway, as its ``pin-suspended`` knob says). ``salt``: its tenant;
        cached prefixes are shared only between sequences of one salt (vLLM's ``cache_salt``): the tenant and
        the request settings prompt caching keys on (docs/protocol.md, "Prompt caching"). ``affinity``: the
        sticky routing key (``prompt_cache_key``, else the client's connection) that an engine of several
        replicas keeps on one replica (docs/engine.md, "Replicas and routing"); one engine ignores it."""
        ...
