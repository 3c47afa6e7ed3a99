"""The API pipeline every transport runs: the same stages on the same engines, each timed per turn.

    authenticate → parse + validate → safety scan → render + tokenize → resolve model → sample → bill

What a transport *redoes* per turn is the transport's business (it decides what it hands to
``prepare``); the stages themselves are here, once. Latency knobs (``resolve_hop_ms``, ``safety_hop_ms``)
model the remote services the seed removed; they are 0 by default and documented in NOTES.md.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import structlog

from proto.builder import ResponseBuilder
from proto.errors import ClientError
from proto.events import CreateBody
from proto.items import FunctionCall, Item, Message, WebSearchCall
from proto.response import Mode, Response
from proto.server.config import Settings
from proto.server.ledger import LedgerRow, UsageLedger
from proto.server.metrics import PipelineMetrics
from proto.server.safety import SafetyScanner
from proto.server.store import ResponseStore, StoreUnavailable
from proto.work import WorkCounters
from sampler.clock import Clock, RealClock
from sampler.gpu import MockGPU
from sampler.loop import Rollout
from sampler.models import MODELS, ModelSpec
from sampler.policy import select_policy
from sampler.tokens import Conversation, Tokenizer, render_parts
from sampler.tools import WebSearch

log = structlog.get_logger("proto.server.pipeline")
T = TypeVar("T")


@contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + (time.perf_counter() - started) * 1e3


# Input text past which scanning and tokenizing run on a worker thread, not on the loop: below it the work
# (~8 ms for 64 KiB: tiktoken ~65 ms/MB, the safety regexes as much) costs less than stalling nobody is
# worth a thread hop (~0.1 ms). Above it, on the loop, a 10 MB message held every stream for ~1.1 s.
OFF_LOOP_CHARS = 64 * 1024


async def off_loop(chars: int, work: Callable[[], T]) -> T:
    """Work proportional to ``chars`` of a client's input: inline when small, on a worker thread when large.
    tiktoken releases the GIL; the regex scan does not, but then the loop gets it back every switch
    interval (5 ms) instead of waiting for the whole scan. The caller's objects are its own meanwhile."""
    return work() if chars <= OFF_LOOP_CHARS else await asyncio.to_thread(work)


def text_chars(items: list[Item], call_names: dict[str, str] | None = None) -> int:
    return sum(len(body) for item in items for _, body in render_parts(item, call_names or {}))


@contextmanager
def typed_faults() -> Iterator[None]:
    """Faults of the pre-inference work (a store read, a bug) as the typed error every transport answers
    with (``store_unavailable``, ``server_error``) instead of an exception that would leave a connection
    waiting for a response that never starts. The peer's own errors pass through."""
    try:
        yield
    except ClientError:
        raise
    except StoreUnavailable as exc:
        raise ClientError("store_unavailable", str(exc)) from exc
    except Exception as exc:
        log.exception("prepare_failed")
        raise ClientError("server_error", f"internal error: {type(exc).__name__}") from exc


class Engines:
    """The routing table: model name → the mock GPU that serves it (one per model, shared by all)."""

    def __init__(self, overrides: list[str] | None = None) -> None:
        specs = dict(MODELS)
        for text in overrides or []:
            name, _, knobs = text.partition(":")
            if name not in specs:
                raise ValueError(f"--model-override names an unknown model {name!r}")
            specs[name] = apply_knobs(specs[name], knobs)
        self.specs: dict[str, ModelSpec] = specs
        self.gpus = {name: MockGPU(spec) for name, spec in specs.items()}

    def names(self) -> frozenset[str]:
        return frozenset(self.gpus)

    def resolve(self, name: str, work: WorkCounters) -> MockGPU:
        work.model_resolutions += 1
        gpu = self.gpus.get(name)
        if gpu is None:
            raise ClientError("model_not_found", f"the model {name!r} does not exist", "model")
        return gpu


def apply_knobs(spec: ModelSpec, knobs: str) -> ModelSpec:
    """``inter-token-latency=0.5,max-num-seqs=8`` (llm-d knob names) over a model's settings."""
    public = spec.public()
    changes: dict[str, object] = {}
    for pair in filter(None, knobs.split(",")):
        key, _, value = pair.partition("=")
        if key not in public:
            raise ValueError(f"unknown model knob {key!r}; known: {', '.join(sorted(public))}")
        changes[key] = _knob_value(public[key], value)
    return spec.override(**changes)


def _knob_value(current: object, text: str) -> object:
    """A knob's text, converted to the type of the value it replaces (the flag is a string)."""
    if isinstance(current, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {text!r}")
    if isinstance(current, int):
        return int(text)
    return float(text)


@dataclass
class Prepared:
    rollout: Rollout
    gpu: MockGPU


class Pipeline:
    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        # The clock of the server's own limits (idle, age, tool and send timeouts): tests run them on
        # virtual time. The mock GPU keeps its own real clock.
        self.clock: Clock = clock or RealClock()
        self.tokenizer = Tokenizer()
        self.scanner = SafetyScanner(settings.safety)  # type: ignore[arg-type]
        self.engines = Engines(settings.model_override)
        self.web_search = WebSearch()
        self.ledger = UsageLedger(settings.db, busy_timeout=settings.db_busy_timeout_s)
        self.store = ResponseStore(settings.db, busy_timeout=settings.db_busy_timeout_s)
        select_policy("", settings.default_policy)  # a bad --default-policy fails at start-up, not per request
        self.totals = WorkCounters()
        self.metrics = PipelineMetrics()

    def start(self) -> None:
        self.ledger.start()

    async def aclose(self) -> None:
        await self.ledger.aclose()
        await self.store.aclose()

    # ---------------------------------------------------------------------------------- stages
    async def scan(self, items: list[Item], work: WorkCounters, phases: dict[str, float], instructions: str | None = None) -> list[str]:
        with timed(phases, "safety"):
            texts = [body for item in items for _, body in render_parts(item, {})]
            if instructions:
                texts.append(instructions)
            result = await off_loop(sum(map(len, texts)), lambda: self.scanner.enforce(self.scanner.scan_many(texts)))
            work.chars_scanned += result.chars_scanned
        if self.settings.safety_hop_ms > 0:
            with timed(phases, "safety_hop"):
                await asyncio.sleep(self.settings.safety_hop_ms / 1e3)  # documented latency knob
        return list(result.rules)

    async def resolve(self, model: str, work: WorkCounters, phases: dict[str, float]) -> MockGPU:
        with timed(phases, "resolve_model"):
            gpu = self.engines.resolve(model, work)
        if self.settings.resolve_hop_ms > 0:
            with timed(phases, "resolve_hop"):
                await asyncio.sleep(self.settings.resolve_hop_ms / 1e3)  # documented latency knob
        return gpu

    async def prepare(
        self,
        response_id: str,
        request: CreateBody,
        history: list[Item],
        new_items: list[Item],
        work: WorkCounters,
        mode: Mode,
        scan_history: bool,
        phases: dict[str, float] | None = None,
        conversation: Conversation | None = None,
        gpu: MockGPU | None = None,
    ) -> Prepared:
        """Pre-inference work for one response. ``history`` is context the response continues from
        (a stored chain, or HTTP's re-sent items); only what the transport says is new is scanned unless
        ``scan_history``. A GA WebSocket cache hit passes the previous response's ``conversation`` (its
        rendered tokens: only ``new_items`` are tokenized onto it; the caller hands it over, it is
        mutated) and its resolved ``gpu`` (no model resolution)."""
        phases = phases if phases is not None else {}
        flags = await self.scan(history + new_items if scan_history else new_items, work, phases, request.instructions)
        if gpu is None:
            gpu = await self.resolve(request.model, work, phases)
        def render(conversation: Conversation | None) -> Conversation:
            if conversation is None:
                conversation = Conversation(self.tokenizer, work)
                if request.instructions:
                    conversation.add_instructions(request.instructions)
                conversation.add_input(history)
            conversation.work = work
            conversation.add_input(new_items)
            return conversation

        chars = text_chars(new_items) + (0 if conversation is not None else text_chars(history) + len(request.instructions or ""))
        with timed(phases, "render_tokenize"):
            conversation = await off_loop(chars, functools.partial(render, conversation))
        builder = ResponseBuilder(response_id, request, mode, work)
        builder.lab.safety_flags = flags
        script = _first_user_text(conversation.items)
        rollout = Rollout(
            builder=builder,
            conversation=conversation,
            sequence=gpu.open(),
            policy=select_policy(script, self.settings.default_policy),
            web_search=self.web_search,
            script=script,
            turn=count_segments(conversation.items),
            max_output_tokens=request.max_output_tokens,
            pending_phases=dict(phases),
            input_items=list(new_items),
        )
        builder.lab.phases_ms = dict(phases)
        return Prepared(rollout, gpu)

    async def ingest(self, rollout: Rollout, items: list[Item]) -> None:
        """Items appended to an open response: scanned, rendered and tokenized once, on arrival (off the
        loop when large, ``off_loop``)."""
        phases = rollout.pending_phases
        lab = rollout.builder.lab
        work = lab.work
        if lab.input_positions is None:
            lab.input_positions = [0] * len(rollout.input_items)
        lab.input_positions.extend([len(rollout.builder.response.output)] * len(items))
        rollout.input_items.extend(items)
        with timed(phases, "safety"):
            texts = [body for item in items for _, body in render_parts(item, rollout.conversation.call_names)]
            chars = sum(map(len, texts))
            result = await off_loop(chars, lambda: self.scanner.enforce(self.scanner.scan_many(texts)))
            work.chars_scanned += result.chars_scanned
            rollout.builder.lab.safety_flags.extend(result.rules)
        with timed(phases, "render_tokenize"):
            await off_loop(chars, functools.partial(rollout.conversation.add_input, items))
        for name, ms in phases.items():
            rollout.builder.lab.phases_ms[name] = rollout.builder.lab.phases_ms.get(name, 0.0) + ms

    def bill(self, builder: ResponseBuilder, api_key_id: str, created: float) -> None:
        """Post-inference, once per response: one ledger row (written off the hot path)."""
        response = builder.response
        usage = builder.usage
        builder.lab.work.ledger_rows += 1
        self.totals.merge(builder.lab.work)
        self.metrics.observe(builder)
        # Counts and ids only: message text only under --log-text (a debugging aid), keys never.
        text = {"output_text": _output_text(response.output)} if self.settings.log_text else {}
        log.info(
            "response_ended",
            response_id=response.id,
            mode=builder.lab.mode,
            status=response.status,
            turns=len(builder.lab.turns),
            input_tokens=usage.input_tokens,
            cached_tokens=usage.input_tokens_details.cached_tokens,
            output_tokens=usage.output_tokens,
            **text,
        )
        self.ledger.record(
            LedgerRow(
                response_id=response.id,
                api_key_id=api_key_id,
                model=response.model,
                mode=builder.lab.mode,
                status=response.status,
                input_tokens=usage.input_tokens,
                cached_tokens=usage.input_tokens_details.cached_tokens,
                output_tokens=usage.output_tokens,
                turns=len(builder.lab.turns),
                created_at=created,
                completed_at=time.time(),
                reason=end_reason(response),
            )
        )


def end_reason(response: Response) -> str:
    """Why a response ended other than completed: its ``incomplete_details.reason`` or its error's code."""
    if response.incomplete_details is not None:
        return response.incomplete_details.reason
    return response.error.code if response.error is not None else ""


def _output_text(items: list[Item]) -> str:
    return "".join(item.text() for item in items if isinstance(item, Message))


def _first_user_text(items: list[Item]) -> str:
    for item in items:
        if isinstance(item, Message) and item.role == "user":
            return item.text()
    return ""


def count_segments(items: list[Item]) -> int:
    """How many sampling segments a history holds, counted as the long-lived loop counts turns: a run
    of the model's own items is one segment, and a hosted call's inline result closes one."""
    segments = 0
    inside = False
    for item in items:
        own = isinstance(item, FunctionCall | WebSearchCall) or (isinstance(item, Message) and item.role == "assistant")
        if own:
            if not inside:
                segments += 1
            inside = not isinstance(item, WebSearchCall)
        else:
            inside = False
    return segments

