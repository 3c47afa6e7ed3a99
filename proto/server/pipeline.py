"""The API pipeline every transport runs: the same stages on the same engines, each timed per turn.

    authenticate → parse + validate → safety scan → render + tokenize → resolve model → sample → bill

What each design redoes per turn is its row in ``proto.server.designs`` (a transport hands ``prepare`` one
``Context`` naming it); the stages themselves are here, once, and the safety rules (what the classifier
sees, where its hop sits) are settings every design obeys alike (docs/lab.md, "Equal rules"). Latency
knobs (``resolve_hop_ms``, ``safety_hop_ms``, ``store_hop_ms``, ``api_cost_ms`` + ``api_cost_ms_per_1k``)
model the remote services the seed removed and a real Python Responses server's own per-request work;
they are 0 by default, documented in docs/lab.md, "Profiles", and slept on the precise clock
(``sampler.clock.RealClock``) so a modelled 20 ms is 20 ms, not uvloop's nearest millisecond. The work a
hop stands for is counted whatever its configured latency (``work.safety_hops``,
``work.model_resolutions``, ``work.store_reads``), so the lab's fast model can price any hop profile.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec
import structlog

from proto.core import openai_types as oa
from proto.core.builder import ResponseBuilder
from proto.core.caching import TTL_SECONDS, breakpoint_of, written_breakpoints
from proto.core.caching import salt as cache_salt
from proto.core.create import configured
from proto.core.errors import ClientError
from proto.core.events import CreateBody
from proto.core.items import (
    CALL_ITEMS,
    HOSTED_TOOL_NAMES,
    Compaction,
    CustomTool,
    FunctionTool,
    Item,
    Message,
    NamespaceFunction,
    NamespaceTool,
    Tool,
    WebSearchCall,
    WebSearchTools,
    async_tool_names,
    earlier_reasoning,
    message_text,
)
from proto.core.response import Response, Usage, withheld
from proto.core.work import WorkCounters
from proto.engine.client import RemoteEngine
from proto.engine.routing import Replicas
from proto.server.admission import Admission, Ticket
from proto.server.config import Settings
from proto.server.designs import Design
from proto.server.metrics import PipelineMetrics
from proto.server.stages.item_cache import ItemCache
from proto.server.stages.safety import SafetyScanner
from proto.server.storage.conversations import ConversationStore
from proto.server.storage.ledger import LedgerRow, UsageLedger
from proto.server.storage.store import ResponseStore, StoreUnavailable
from proto.server.tiers import serve
from sampler.clock import Clock, RealClock
from sampler.engine import Breakpoint, Engine
from sampler.gpu import MockGPU
from sampler.loop import Rollout
from sampler.models import ContextLengthExceeded, ModelLimits, ModelSpec, context_message
from sampler.overrides import model_specs
from sampler.policy import OfferedTool, Rules, has_directives, select_policy
from sampler.position import script_position
from sampler.tokens import SLICE_CHARS, Conversation, Tokenizer, prepared, text_segments
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


# Input text past which its scan runs on a worker thread, not in one go on the loop (its tokenization goes
# a slice at a time past one slice, ``tokenized``): below it the work (~8 ms for 64 KiB: tiktoken ~65
# ms/MB, the safety regexes as much) costs less than stalling nobody is worth a hop. Above it, in one go on
# the loop, a 10 MB message held every stream for ~1.1 s.
OFF_LOOP_CHARS = 64 * 1024


async def off_loop(chars: int, work: Callable[[], T]) -> T:
    """Work proportional to ``chars`` of a client's input: inline when small, on a worker thread when large.
    The regex scan does not release the GIL, but the loop gets it back every switch interval (5 ms) instead
    of waiting for the whole scan. The caller's objects are its own meanwhile."""
    return work() if chars <= OFF_LOOP_CHARS else await asyncio.to_thread(work)


async def tokenized(
    tokenizer: Tokenizer,
    chars: int,
    texts: Callable[[], Iterable[str]],
    work: Callable[[], T],
    limits: ModelLimits | None = None,
    start: int = 0,
) -> T:
    """``work`` (a rendering that tokenizes ``texts``, ``chars`` of them) inline when at most one slice;
    when larger, the texts are tokenized first a slice at a time on the loop (``Tokenizer.prepare``; not on
    a thread: see ``sampler.tokens.SLICE_CHARS``) and ``work`` takes their ids. With the model's
    ``limits``, an input whose tokens pass its context window is refused (``context_length_exceeded``,
    before a response starts) as soon as that is certain, without tokenizing the rest; ``start``: the tokens
    the prompt holds already (an append's conversation)."""
    if chars <= SLICE_CHARS:
        return work()
    try:
        ready = await tokenizer.prepare(texts(), limits, start)
    except ContextLengthExceeded as exc:
        raise ClientError("context_length_exceeded", context_message(exc), "input") from exc
    with prepared(ready):
        return work()


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
    """The routing table: model name → the engine that serves it. In process (the default): one mock GPU
    per model, shared by everything this process serves. With ``--engine URL``: the models that engine
    lists, all behind one ``RemoteEngine`` (read at start-up, ``start``); with several URLs, the replicas
    and their router (``proto.engine.routing.Replicas``)."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.remote: RemoteEngine | Replicas | None = None
        self.gpus: dict[str, MockGPU] = {}  # the in-process ones (none with --engine)
        self.by_name: dict[str, Engine] = {}
        self.specs: dict[str, ModelSpec] = {}
        urls = [url.strip() for url in settings.engine.split(",") if url.strip()]
        if urls:
            remotes = [
                RemoteEngine(
                    url,
                    clock,
                    timeout_s=settings.engine_timeout_s,
                    # A suspended response waits at most --tool-timeout-s, then it is closed (and
                    # unpinned); the TTL only matters if this process dies first.
                    pin_ttl_s=settings.tool_timeout_s + 60.0,
                    connections=settings.engine_connections,
                    api_key=settings.engine_api_key or None,
                    retry_s=settings.retry_after_ms / 1e3,
                )
                for url in urls
            ]
            seed = settings.engine_routing_seed if settings.engine_routing_seed >= 0 else None
            # a bad --engine-routing fails at start-up, even with one URL
            replicas = Replicas(remotes, settings.engine_routing, seed)
            self.remote = remotes[0] if len(remotes) == 1 else replicas
            return
        self.specs = model_specs(settings.model_override)
        self.gpus = {name: MockGPU(spec) for name, spec in self.specs.items()}
        self.by_name = dict(self.gpus)

    async def start(self) -> None:
        if self.remote is not None:
            await self.remote.start()
            self.by_name = dict(self.remote.models)

    async def aclose(self) -> None:
        if self.remote is not None:
            await self.remote.aclose()

    def names(self) -> frozenset[str]:
        return frozenset(self.by_name)

    def cards(self) -> list[dict[str, object]]:
        """``GET /v1/models``' entries: the catalogue's, or the engine's own (its address is not shown)."""
        if self.remote is not None:
            return [dict(card) for card in self.remote.cards]
        return [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "responses-lab",
                "settings": spec.public(),
                **spec.provenance(),
            }
            for name, spec in sorted(self.specs.items())
        ]

    def resolve(self, name: str, work: WorkCounters) -> Engine:
        work.model_resolutions += 1
        engine = self.by_name.get(name)
        if engine is None:
            raise ClientError("model_not_found", f"the model {name!r} does not exist", "model")
        return engine


# Where a create's ``history`` came from: its safety scan depends on it. A stored chain and the connection's
# previous response were classified when they were new; a conversation's items are classified with the input
# (items may join a conversation through its own API).
Source = Literal["none", "chain", "conversation", "connection"]
Classify = Literal["user", "new", "all"]
CLASSIFY: tuple[Classify, ...] = ("user", "new", "all")
Placement = Literal["before", "beside"]
PLACEMENTS: tuple[Placement, ...] = ("before", "beside")


@dataclass(frozen=True)
class Context:
    """What a transport hands ``Pipeline.prepare`` for one response."""

    response_id: str
    request: CreateBody
    design: Design  # the mode's row of ``proto.server.designs``
    new_items: list[Item]  # what the request adds (HTTP without a chain: its whole input)
    work: WorkCounters
    phases: dict[str, float]  # the transport's own timed work so far (``store_load``)
    history: list[Item] = field(default_factory=list)  # context it continues from, rendered before
    source: Source = "none"
    # A GA WebSocket cache hit: the previous response's rendering (only ``new_items`` are tokenized onto
    # it; handed over, it is mutated) and its resolved engine (None: resolved again).
    conversation: Conversation | None = None
    gpu: Engine | None = None
    api_key_id: str = ""  # the caller's key: the item cache's scope and the prefix cache's salt
    # The client's connection (a WebSocket session, an HTTP request's TCP peer): sticky routing's key
    # when the request names no prompt_cache_key.
    connection: str = ""
    # The caller's place in admission, taken before it touched state a refusal must leave as it was;
    # without one, the response is admitted in ``prepare`` (docs/protocol.md, "Admission").
    ticket: Ticket | None = None


@dataclass
class Prepared:
    rollout: Rollout
    gpu: Engine
    ticket: Ticket  # its place in admission: given back when the response ends (ResponseDriver.run)
    # The classifier hop owed beside the first prefill (``--safety-placement beside``): the driver runs it
    # as a task its first token waits for.
    beside_ms: float = 0.0


class Pipeline:
    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        # a bad rule fails at start-up (before anything is opened), not per request
        if settings.safety_classify not in CLASSIFY:
            raise ValueError(f"--safety-classify must be one of {CLASSIFY}, not {settings.safety_classify!r}")
        if settings.safety_placement not in PLACEMENTS:
            raise ValueError(
                f"--safety-placement must be one of {PLACEMENTS}, not {settings.safety_placement!r}"
            )
        self.classify: Classify = settings.safety_classify
        self.placement: Placement = settings.safety_placement
        self.settings = settings
        # The clock of the server's own limits (idle, age, tool and send timeouts): tests run them on
        # virtual time. The mock GPU keeps its own real clock.
        self.clock: Clock = clock or RealClock()
        self.tokenizer = Tokenizer()
        self.scanner = SafetyScanner(settings.safety)  # type: ignore[arg-type]
        self.engines = Engines(settings, self.clock)
        self.admission = Admission(settings, self.engines)
        self.web_search = WebSearch()
        self.ledger = UsageLedger(settings.db, busy_timeout=settings.db_busy_timeout_s)
        self.store = ResponseStore(settings.db, busy_timeout=settings.db_busy_timeout_s)
        self.conversations = ConversationStore(self.store)
        # a bad --default-policy fails at start-up, not per request
        select_policy("", settings.default_policy)
        self.item_cache = ItemCache(settings.item_cache_tokens)
        self.totals = WorkCounters()
        self.metrics = PipelineMetrics()

    async def start(self) -> None:
        self.ledger.start()
        await self.engines.start()

    async def aclose(self) -> None:
        await self.engines.aclose()
        await self.ledger.aclose()
        await self.store.aclose()

    # ---------------------------------------------------------------------------------- stages
    def classified(self, items: list[Item], context: Sequence[Item], instructions: str | None) -> list[str]:
        """The texts the classifier sees of a turn that adds ``items`` to ``context`` (what the response
        holds already), under ``--safety-classify`` (docs/lab.md, "Equal rules"): ``user`` — the user
        messages among ``items``; ``new`` — all of ``items`` (tool outputs too) and the instructions;
        ``all`` — the whole input, ``context`` included."""
        chosen: Sequence[Item]
        if self.classify == "user":
            chosen = [item for item in items if isinstance(item, Message) and item.role == "user"]
        elif self.classify == "all":
            chosen = [*context, *items]
        else:
            chosen = items
        texts = [text for item in chosen for text in text_segments(item)]
        if instructions and self.classify != "user":
            texts.append(instructions)
        return texts

    async def scan(
        self,
        texts: list[str],
        work: WorkCounters,
        phases: dict[str, float],
        cache_scope: str | None = None,
    ) -> tuple[list[str], float]:
        """``texts`` through the safety stage: the local rules (``content_policy`` when blocking), then the
        remote classifier's hop when any text is new to it. Returns the rules found and the hop owed beside
        the prefill (ms; 0 when it was paid here, before it)."""
        if not texts:
            return [], 0.0
        with timed(phases, "safety"):
            # Under ``all`` the classifier judges the whole input each turn: no verdict is per body, so
            # the item cache does not stand in for it.
            if cache_scope is None or self.classify == "all":
                result = await off_loop(
                    sum(map(len, texts)), lambda: self.scanner.enforce(self.scanner.scan_many(texts))
                )
                work.chars_scanned += result.chars_scanned
                remote = True
            else:
                result, remote = self.item_cache.scan(self.scanner, cache_scope, texts, work)
                self.scanner.enforce(result)
        owed = 0.0
        if remote:  # http-cached: texts the cache has classified already need no remote call
            work.safety_hops += 1
            if self.placement == "beside":
                owed = self.settings.safety_hop_ms
            else:
                await knob(phases, "safety_hop", self.settings.safety_hop_ms)
        return list(result.rules), owed

    async def beside(self, rollout: Rollout, ms: float) -> None:
        """The classifier's hop beside the prefill (``--safety-placement beside``): run by the response's
        driver as a task that its next turn's first token waits for; booked on that turn."""
        phases: dict[str, float] = {}
        await knob(phases, "safety_hop", ms)
        for name, spent in phases.items():
            rollout.pending_phases[name] = rollout.pending_phases.get(name, 0.0) + spent
            lab = rollout.builder.lab
            lab.phases_ms[name] = lab.phases_ms.get(name, 0.0) + spent

    async def resolve(
        self, model: str, work: WorkCounters, phases: dict[str, float], cache_scope: str | None = None
    ) -> Engine:
        if cache_scope is not None:
            known = self.item_cache.resolved(cache_scope, model)
            if known is not None:
                engine: Engine = known
                return engine
        with timed(phases, "resolve_model"):
            gpu = self.engines.resolve(model, work)
        await knob(phases, "resolve_hop", self.settings.resolve_hop_ms)
        if cache_scope is not None:
            self.item_cache.remember_model(cache_scope, model, gpu)
        return gpu

    async def prepare(self, context: Context) -> Prepared:
        """Pre-inference work for one response, as its design (``context.design``) says: the store round
        trips its context cost, the safety stage on what ``--safety-classify`` selects, the model resolved
        (unless a cache hit hands its engine over) on the engine the request's ``service_tier`` maps to
        ("Service tiers"), the rendering (onto a cache hit's ``conversation``, or through the item cache),
        the API cost, then admission unless the caller holds a ``ticket``."""
        request, work, phases, design = context.request, context.work, context.phases, context.design
        history, new_items = context.history, context.new_items
        conversation, gpu, ticket = context.conversation, context.gpu, context.ticket
        served = serve(request.model, request.service_tier, self.engines.names())  # the tier's engine
        if ticket is None:  # a caller with a ticket checked the ledger when it took it
            self.check_ledger()
            self.admission.check(served.engine)
        # One modelled round trip per store read the context made (a chain's links, a conversation).
        await knob(phases, "store_hop", self.settings.store_hop_ms * work.store_reads)
        cache_scope = context.api_key_id if design.reuse == "item-cache" else None
        held = conversation.items if conversation is not None else history
        scanned = history + new_items if context.source == "conversation" else new_items
        flags, beside_ms = await self.scan(
            self.classified(scanned, held, request.instructions), work, phases, cache_scope
        )
        if gpu is None:
            gpu = await self.resolve(served.engine, work, phases, cache_scope)
        tokenizer = (
            self.tokenizer if cache_scope is None else self.item_cache.tokenizer(self.tokenizer, cache_scope)
        )

        # the input's explicit cache breakpoints, each with where it ends in the prompt
        breakpoints: list[tuple[int, oa.PromptCacheBreakpoint]] = []
        # Reasoning of earlier turns is withheld (``reasoning.context``): left out of a fresh rendering; on
        # one continued (a GA cache hit) ``start_turn`` cuts it.
        mode = request.reasoning.context if request.reasoning else None

        def render(conversation: Conversation | None) -> Conversation:
            if conversation is None:
                earlier = earlier_reasoning([*history, *new_items], mode)
                conversation = render_context(
                    tokenizer, work, request, history, [p for p in earlier if p < len(history)]
                )
            conversation.work = work
            for item in conversation.start_turn(new_items, mode):
                conversation.add_input([item])
                if (mark := breakpoint_of(item)) is not None:
                    breakpoints.append((len(conversation.log), mark))
            return conversation

        # The bodies the rendering tokenizes (instructions, and the history unless continuing a rendered
        # conversation): how large the work is, and what ``tokenized`` prepares when it is large.
        texts = [request.instructions] if request.instructions and conversation is None else []
        for item in history + new_items if conversation is None else new_items:
            texts.extend(text_segments(item))
        chars = sum(map(len, texts))
        with timed(phases, "render_tokenize"):
            conversation = await tokenized(
                conversation.tokenizer if conversation is not None else tokenizer,
                chars,
                lambda: texts,
                functools.partial(render, conversation),
                gpu.limits,
            )
        await self.api_cost(design, len(conversation.log), phases)
        request = configured(request, conversation.items)  # configuration_update items in effect
        builder = ResponseBuilder(context.response_id, request, design.mode, work)
        builder.response.input_transformations = withheld(conversation.withheld)
        builder.lab.safety_flags = flags
        builder.response.service_tier = served.tier
        if context.api_key_id:  # whose stored responses the diagnostics may compare with
            await self.cache_comparison(builder, request, new_items, context.api_key_id)
        script = script_source(conversation.items)
        turn = script_position(conversation.items, script, request.parallel, async_tool_names(request.tools))
        newest = conversation.items[-1] if conversation.items else None
        answers_user = isinstance(newest, Message) and newest.role == "user"
        rollout = Rollout(
            builder=builder,
            conversation=conversation,
            # Only a design that resumes a response after a tool call pins its prefix. The prefix cache is
            # the key's own (docs/mock-gpu.md, "Prefix cache per tenant"), and within it keyed on the request
            # settings prompt caching keys on (docs/protocol.md, "Prompt caching").
            sequence=gpu.open(
                keep_warm=design.keep_warm,
                salt=f"{context.api_key_id}\x1f{cache_salt(builder.response)}",
                # sticky routing's key among engine replicas (docs/engine.md, "Replicas and routing")
                affinity=request.prompt_cache_key or context.connection,
            ),
            policy=select_policy(
                script,
                self.settings.default_policy,
                parallel=request.parallel,
                offered=offered_tools(request.tools),
                answers_user_turn=turn if answers_user else None,
                rules=guarantees(request),
            ),
            web_search=self.web_search,
            script=script,
            turn=turn,
            max_output_tokens=request.max_output_tokens,
            pending_phases=dict(phases),
            coalesce_s=self.settings.coalesce_ms / 1e3,
            input_items=list(new_items),
            summary=request.reasoning is not None and request.reasoning.summary is not None,
            encrypted_reasoning=request.includes("reasoning.encrypted_content"),
            prewarm=bool(request.prompt_cache_options and request.prompt_cache_options.prewarm),
        )
        rollout.sequence.retention = tuple(
            Breakpoint(end, ttl, TTL_SECONDS[ttl])
            for end, ttl in written_breakpoints(request.prompt_cache_options, breakpoints)
        )
        builder.lab.phases_ms = dict(phases)
        if ticket is None:
            try:  # last, so that no failure of the work above holds a place
                ticket = self.admission.admit(served.engine)
            except ClientError:
                rollout.sequence.close()
                raise
        return Prepared(rollout, gpu, ticket, beside_ms)

    def check_ledger(self) -> None:
        """No response starts while the ledger cannot write (docs/operations.md, "Databases"): refused at
        the door, typed, on every transport — not served and left unbilled. Reads a flag; never waits."""
        why = self.ledger.unwritable
        if why is not None:
            raise ClientError(
                "ledger_unavailable",
                f"usage cannot be recorded ({why}); no response is served until the database takes writes",
            )

    async def cache_comparison(
        self, builder: ResponseBuilder, request: CreateBody, new_items: list[Item], api_key_id: str
    ) -> None:
        """The response prompt cache diagnostics compare with: ``prompt_cache_options``'s
        ``comparison_response_id``, else ``previous_response_id`` when that one is stored; none, no
        diagnostics."""
        options = request.prompt_cache_options
        chosen = options.comparison_response_id if options else None
        named = chosen or request.previous_response_id
        if named is None:
            return
        stored = await self.store.get(named, api_key_id)
        if stored is None and chosen is None:
            return  # a chain held only in memory (GA WebSocket, store false): nothing was asked, none said
        compared = _stored_response.decode(stored.response_json) if stored is not None else None
        compacted = any(isinstance(item, Compaction) for item in new_items)
        builder.cache_comparison = (compared, compacted)

    async def api_cost(self, design: Design, history_tokens: int, phases: dict[str, float]) -> None:
        """The modelled per-request work of a real Python Responses server (``--api-cost-ms`` +
        ``--api-cost-ms-per-1k`` per 1 000 history tokens; vLLM 0.32's figures in docs/lab.md, "Profiles"),
        as the design's row says: in full (``http``, ``http-prev``), the base only (``http-cached``: its
        cache does the per-token rendering vLLM spends that part on), or not at all (the WebSocket designs:
        this is what a per-request server costs, which is what they remove)."""
        if design.api_cost == "full":
            ms = self.settings.api_cost_ms + self.settings.api_cost_ms_per_1k * history_tokens / 1000.0
        elif design.api_cost == "base":
            ms = self.settings.api_cost_ms
        else:
            return
        await knob(phases, "api_cost", ms)

    async def ingest(self, rollout: Rollout, items: list[Item], limits: ModelLimits | None = None) -> float:
        """Items appended to an open response: through the safety stage under the same rules as a create
        (an append of tool outputs pays the classifier's hop as a GA WebSocket create of them does), then
        rendered and tokenized once, on arrival (when large, the scan on a worker thread, ``off_loop``, and
        the tokenization a slice at a time, ``tokenized``). With the model's ``limits``, items that take the
        conversation past its window are refused as a create's input is, as soon as that is certain (the
        response fails with ``context_length_exceeded``). Returns the hop owed beside the next prefill
        (ms; ``--safety-placement beside``)."""
        phases = rollout.pending_phases
        lab = rollout.builder.lab
        work = lab.work
        if lab.input_positions is None:
            lab.input_positions = [0] * len(rollout.input_items)
        lab.input_positions.extend([len(rollout.builder.response.output)] * len(items))
        rollout.input_items.extend(items)
        conversation = rollout.conversation
        flags, owed = await self.scan(self.classified(items, conversation.items, None), work, phases)
        lab.safety_flags.extend(flags)
        texts = [text for item in items for text in text_segments(item)]
        chars = sum(map(len, texts))
        # A user message starts a turn: under ``reasoning.context: current_turn`` the reasoning before it
        # leaves the context (the rendering is cut at the first withheld item and the rest rendered again).
        mode = rollout.builder.response.reasoning
        context = mode.context if mode else None

        def render() -> None:
            conversation.add_input(conversation.start_turn(items, context))

        with timed(phases, "render_tokenize"):
            await tokenized(
                conversation.tokenizer, chars, lambda: texts, render, limits, len(conversation.log)
            )
        rollout.builder.response.input_transformations = withheld(conversation.withheld)
        for name, ms in phases.items():
            rollout.builder.lab.phases_ms[name] = rollout.builder.lab.phases_ms.get(name, 0.0) + ms
        return owed

    def bill(self, builder: ResponseBuilder, api_key_id: str, created: float, delivered: bool = True) -> None:
        """Post-inference, once per response: one ledger row (written off the hot path). ``delivered``
        False: the client got none of it (a JSON reply answered by an error body): the row records how it
        ended, with no tokens (docs/decisions/0012-bill-what-was-delivered.md)."""
        response = builder.response
        usage = builder.usage if delivered else Usage()
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
            calls=_call_names(response.output),
            call_ids=[item.call_id for item in response.output if isinstance(item, CALL_ITEMS)],
            **text,
            **_lab_report(builder),
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
                cache_write_tokens=usage.input_tokens_details.cache_write_tokens,
                cache_write_12h_tokens=usage.input_tokens_details.written_12h,
            )
        )


def _lab_report(builder: ResponseBuilder) -> dict[str, Any]:
    """The per-turn report and phases a terminal event carries as ``response.lab``, for the log at info
    level: a gateway in front drops that field, and the lab reads them from the log instead (docs/lab.md,
    "Peers"). Built only when the line is written."""
    if not log.is_enabled_for(logging.INFO):
        return {}
    return {"lab_turns": msgspec.to_builtins(builder.lab.turns), "phases_ms": dict(builder.lab.phases_ms)}


_stored_response = msgspec.json.Decoder(Response)
_KNOB_CLOCK = RealClock()  # precise sleeps for the latency knobs (the limits' clock may be virtual)


async def knob(phases: dict[str, float], name: str, ms: float) -> None:
    """A documented latency knob: sleep ``ms`` on the precise clock, timed as phase ``name``; nothing at 0."""
    if ms <= 0:
        return
    with timed(phases, name):
        await _KNOB_CLOCK.sleep_until(_KNOB_CLOCK.now() + ms / 1e3)


def end_reason(response: Response) -> str:
    """Why a response ended other than completed: its ``incomplete_details.reason`` or its error's code."""
    if response.incomplete_details is not None:
        return response.incomplete_details.reason
    return response.error.code if response.error is not None else ""


def _call_names(items: list[Item]) -> list[str]:
    """The tools a response called, in order: names only (a hosted search is ``web_search``)."""
    return [
        item.name if isinstance(item, CALL_ITEMS) else "web_search"
        for item in items
        if isinstance(item, (*CALL_ITEMS, WebSearchCall))
    ]


def _output_text(items: list[Item]) -> str:
    return "".join(message_text(item) for item in items if isinstance(item, Message))


def script_source(items: list[Item]) -> str:
    """The directive script's source (docs/protocol.md, "The directive script"): the first user message that
    contains directive lines.
    Agents put context first (Codex's first user message is its ``<environment_context>``); without any
    directive line, the first user message (what the default policy reads)."""
    users = [message_text(item) for item in items if isinstance(item, Message) and item.role == "user"]
    return next((text for text in users if has_directives(text)), users[0] if users else "")


def offered_tools(tools: Sequence[Tool]) -> list[OfferedTool]:
    """What the mock model may call (docs/protocol.md, "The directive script"): function and custom tools,
    those inside a namespace by
    their own name, and the hosted tools it runs (``web_search``)."""
    offered: list[OfferedTool] = []
    for tool in tools:
        inner = tool.tools if isinstance(tool, NamespaceTool) else [tool]
        for one in inner:
            if isinstance(one, (FunctionTool, NamespaceFunction)):
                offered.append(OfferedTool(one.name, "function", one.description or "", one.parameters))
            elif isinstance(one, CustomTool):
                offered.append(OfferedTool(one.name, "custom", one.description or ""))
        if isinstance(tool, WebSearchTools):
            offered.extend(OfferedTool(name, "hosted") for name in sorted(HOSTED_TOOL_NAMES))
    return offered


def render_context(
    tokenizer: Tokenizer,
    work: WorkCounters,
    request: CreateBody,
    items: list[Item],
    withhold: Sequence[int] = (),
) -> Conversation:
    """The model's context for a create: instructions, tool definitions, then the items but those at the
    ``withhold`` positions (reasoning ``reasoning.context`` withholds: kept in ``Conversation.withheld``)
    (what ``Pipeline.prepare`` renders, and what ``POST /v1/responses/input_tokens`` counts)."""
    conversation = Conversation(tokenizer, work)
    if request.instructions:
        conversation.add_instructions(request.instructions)
    conversation.add_tools(request.tools)
    conversation.add_input(conversation.keep(items, withhold))
    return conversation


async def count_input_tokens(
    tokenizer: Tokenizer, work: WorkCounters, request: CreateBody, items: list[Item]
) -> int:
    """The input tokens a create of ``request`` over ``items`` (its stored chain, then its input) reports
    for its first turn: the rendered context and the tokens that open the assistant's turn."""
    context = request.reasoning.context if request.reasoning else None
    texts = [request.instructions] if request.instructions else []
    for item in items:
        texts.extend(text_segments(item))
    conversation = await tokenized(
        tokenizer,
        sum(map(len, texts)),
        lambda: texts,
        functools.partial(render_context, tokenizer, work, request, items, earlier_reasoning(items, context)),
    )
    return len(conversation.prompt())


def guarantees(request: CreateBody) -> Rules:
    """What the request promises about the model's output (docs/protocol.md, "Guarantees"): its
    ``tool_choice``, ``max_tool_calls`` and ``text.format``, the same on every transport."""
    choice = request.tool_choice
    tool_choice: Literal["auto", "none", "required"] = "auto"
    forced: str | None = None
    allowed: frozenset[str] | None = None
    if choice in ("none", "auto", "required"):
        tool_choice = choice
    elif isinstance(choice, oa.ToolChoiceAllowed):
        tool_choice = choice.mode
        allowed = frozenset(name for tool in choice.tools if (name := _choice_name(tool)) is not None)
        if "web_search" in allowed:  # the hosted search answers to either of its names
            allowed |= HOSTED_TOOL_NAMES
    elif choice is not None:
        tool_choice, forced = "required", _choice_name(msgspec.to_builtins(choice))
    text_format: Literal["text", "json_schema", "json_object"] = "text"
    schema = None
    fmt = request.text.format if request.text is not None else None
    if isinstance(fmt, oa.ResponseFormatTextJSONSchemaConfig):
        text_format, schema = "json_schema", fmt.schema
    elif isinstance(fmt, oa.ResponseFormatJSONObject):
        text_format = "json_object"
    return Rules(
        tool_choice=tool_choice,
        forced=forced,
        allowed=allowed,
        max_tool_calls=request.max_tool_calls,
        text_format=text_format,
        schema=schema,
    )


def _choice_name(tool: Any) -> str | None:
    """The tool a ``tool_choice`` (or an ``allowed_tools`` entry) names: a function's or custom tool's
    name, ``web_search`` for the hosted search types, an MCP entry's tool name."""
    if not isinstance(tool, dict):
        return None
    kind = tool.get("type")
    if kind in ("function", "custom", "mcp") and isinstance(tool.get("name"), str):
        return str(tool["name"])
    if isinstance(kind, str) and kind.startswith(("web_search", "web_search_preview")):
        return "web_search"
    return kind if isinstance(kind, str) else None
