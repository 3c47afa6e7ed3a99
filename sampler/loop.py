"""The suspending sampling loop: an async generator, one per open response.

Each iteration is one *turn* (a sampling segment): the policy decides what the model says, the mock GPU
paces its tokens, the builder turns them into events. The loop never calls up into its owner; it *yields*
and its owner (``proto.server.driver``) decides what each step means:

* ``Emit(events)`` — frame and send these events, in order; resumed with ``None``.
* ``Boundary(final)`` — a turn boundary where items queued by the client may join the context (user
  messages appended while the model sampled); resumed with the items the owner ingested (scanned,
  rendered and tokenized once), possibly none. After the final answer (``final``) no items ends the loop.
* ``Suspend(calls)`` — the model called local tools. Hosted calls (``web_search``) ran in process
  already; local ones go to the *client*, just another service. Resumed with the items the owner
  ingested (the outputs, then any user messages), or ``None`` when the response ends here (HTTP and GA
  WebSocket end a response at its first local call).

* ``Wait(pacing, turn)`` — nothing is due before the engine's next deadline (a paced engine, the mock
  GPU: ``sampler.engine.PacedSequence``). The owner may wait for the tokens on the engine's timer and take
  the plain ones from there — ``turn.inside()`` of them at most, framed by ``turn.advance`` — with no task
  woken (docs/architecture.md, "The fast path"); resumed with ``None`` when the rest is the task's.

Every event of a turn's tokens is made by its ``proto.core.turn.TurnEncoder``, whichever way the tokens
went: here, for what the engine yields (in chunks of ``EMIT_CHUNK``), or by the owner at a ``Wait``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from proto.core.builder import ResponseBuilder
from proto.core.compaction import Compacted, compaction_content, summary_size
from proto.core.events import ServerEvent
from proto.core.items import (
    CALL_ITEMS,
    HOSTED_TOOL_NAMES,
    CallItem,
    CompactionTrigger,
    Item,
    WebSearchAction,
    WebSearchCall,
    WebSearchSource,
    async_tool_names,
    custom_tool_names,
    function_tool_names,
    namespace_of,
)
from proto.core.response import TurnReport
from proto.core.turn import PlannedItem, TurnEncoder
from sampler.engine import EngineSequence, PacedSequence, Pacing
from sampler.models import check_prompt
from sampler.policy import Policy, TurnPlan
from sampler.tokens import Conversation, TextStream, Tokenizer, reasoning_content, web_results_text
from sampler.tools import WebSearch, query_of

# Tokens per Emit at most. A wake-up that releases more (a late wake-up, a sub-µs ITL, the whole output of a
# `!tokens N` due at once) is handed over in chunks, with a loop iteration between them: framing 16 k tokens
# in one go would hold the loop for ~0.1 s, and a send cut midway bills at most one chunk not yet framed.
EMIT_CHUNK = 32


class MaxOutputTokens(Exception):
    """The response reached ``max_output_tokens``: it ends ``incomplete``."""


@dataclass(frozen=True)
class Emit:
    events: tuple[ServerEvent, ...]


@dataclass(frozen=True)
class Boundary:
    final: bool  # the model gave its final answer: no items now ends the loop


@dataclass(frozen=True)
class Suspend:
    calls: tuple[CallItem, ...]


@dataclass(frozen=True)
class Wait:
    pacing: Pacing  # the engine's schedule: when the next tokens fall due, and its timer
    turn: TurnEncoder  # the turn's events: what the owner frames the tokens it takes with


Step = Emit | Boundary | Suspend | Wait


@dataclass
class Rollout:
    builder: ResponseBuilder
    conversation: Conversation
    sequence: EngineSequence
    policy: Policy
    web_search: WebSearch
    script: str  # the first user message with directive lines: the directive script's source
    turn: int = 0  # index of the next sampling segment in the conversation (same count in every transport)
    max_output_tokens: int | None = None
    pending_phases: dict[str, float] = field(default_factory=dict)  # pipeline work to book on the next turn
    # --coalesce-ms: the GPU wakes at most this often and each wake-up's text becomes one delta per item
    # (0: one delta per token, as OpenAI streams).
    coalesce_s: float = 0.0
    # This response's own input items, in the order they entered the context (what the store keeps).
    input_items: list[Item] = field(default_factory=list)
    summary: bool = False  # reasoning.summary asked for summaries of reasoning items
    encrypted_reasoning: bool = False  # include asked for reasoning.encrypted_content
    # prompt_cache_options.prewarm: one turn that writes the prompt's prefix and generates nothing
    prewarm: bool = False
    # The turn in progress (its encoder) once it reached the engine; None between turns.
    encoder: TurnEncoder | None = None

    @property
    def streamed(self) -> int | None:
        """Output tokens emitted (made into events for the owner) in the turn in progress; None between
        turns. With the engine's live report it is what a turn cut short bills (``cut_turn``)."""
        encoder = self.encoder
        return None if encoder is None else encoder.sent


async def sample(rollout: Rollout) -> AsyncGenerator[Step, list[Item] | None]:
    """Sample until the model gives its final answer (see the module's steps); the owner frames the
    terminal event. Raises ``MaxOutputTokens``; the GPU sequence is the owner's to close."""
    while True:
        yield Boundary(final=False)  # items queued before this turn join now (the owner added them)
        prompt = rollout.conversation.prompt()
        room = _room(rollout, len(prompt))
        if _compacting(rollout):
            outputs = [_compaction(rollout, len(prompt))]
        else:
            plan = rollout.policy.plan(rollout.turn, rollout.script, _last_user_text(rollout.conversation))
            outputs = _materialize(rollout, plan, room)
        produced: list[Item] = []
        async with aclosing(_sample(rollout, prompt, outputs, room, produced)) as steps:
            async for step in steps:
                yield step
        rollout.turn += 1
        calls = [item for item in produced if isinstance(item, (*CALL_ITEMS, WebSearchCall))]
        if not calls:
            late = yield Boundary(final=True)
            if not late:
                return
            continue  # a user message arrived while the model was answering: it gets an answer too
        for call in calls:
            if isinstance(call, WebSearchCall):
                yield Emit(_run_hosted(rollout, call))
        # An ``async`` tool's call does not stop the model: it keeps working (the next turn runs) and the
        # call's output comes in a later request (docs/protocol.md, "Newer fields").
        later = async_tool_names(rollout.builder.response.tools)
        local = tuple(c for c in calls if isinstance(c, CALL_ITEMS) and c.name not in later)
        if local:
            rollout.sequence.suspend()
            resumed = yield Suspend(local)
            if resumed is None:
                return


async def prewarm(rollout: Rollout) -> None:
    """One engine turn that generates nothing (``prompt_cache_options.prewarm``): the prompt is looked up
    and its prefix written to the cache; the turn's report is recorded as any turn's is."""
    produced: list[Item] = []
    async with aclosing(_sample(rollout, rollout.conversation.prompt(), [], 0, produced)) as steps:
        async for step in steps:
            assert not isinstance(step, Emit) or not step.events, "a prewarm turn emits nothing"


def _compacting(rollout: Rollout) -> bool:
    """The context ends with a ``compaction_trigger``: this turn compacts it (docs/protocol.md,
    "Compaction"), whatever the script says."""
    items = rollout.conversation.items
    return bool(items) and isinstance(items[-1], CompactionTrigger)


def _compaction(rollout: Rollout, context_tokens: int) -> PlannedItem:
    """The one item of a compaction turn: a summary of one token per 8 of the context, written (decoded)
    like any output, standing for the segments the context held."""
    summary = rollout.conversation.tokenizer.model_tokens("", summary_size(context_tokens))
    content = compaction_content(Compacted(segments=rollout.turn, summary=summary))
    return PlannedItem("compaction", summary, encrypted=content)


def _last_user_text(conversation: Conversation) -> str:
    return conversation.user_texts[-1] if conversation.user_texts else ""


def _room(rollout: Rollout, prompt_tokens: int) -> int:
    """How many tokens this turn may generate: the model's max output per call, what is left of its
    context window after the prompt, and what is left of the response's ``max_output_tokens``."""
    limits = rollout.sequence.limits
    room = min(limits.max_output_tokens, limits.context_window - prompt_tokens)
    if rollout.max_output_tokens is not None:
        room = min(room, rollout.max_output_tokens - rollout.builder.usage.output_tokens)
    return max(0, room)


def cut_turn(rollout: Rollout) -> None:
    """The turn in progress ended early (cancel, disconnect, slow reader, shutdown, an engine failure):
    book what it delivered — its prompt and cached figures once its prefill started (the engine's live
    report), and the output tokens already emitted — so the terminal event and the ledger bill them.
    A no-op between turns; idempotent."""
    streamed, rollout.encoder = rollout.streamed, None
    live = rollout.sequence.live
    if streamed is None or (live is None and not streamed):
        return  # no turn in progress, or one that never reached the engine: nothing was spent on it
    rollout.builder.record_turn(
        TurnReport(
            turn=rollout.turn,
            prompt_tokens=live.prompt_tokens if live else 0,
            cached_tokens=live.cached_tokens if live else 0,
            prefill_ms=live.prefill_ms if live else 0.0,
            queue_wait_ms=live.queue_wait_ms if live else 0.0,
            decode_ms=live.decode_ms if live else 0.0,
            output_tokens=streamed,
            phases_ms=dict(rollout.pending_phases),
        )
    )
    rollout.pending_phases.clear()


def delivered(rollout: Rollout) -> tuple[int, int, int, int]:
    """(input, cached, output tokens, turns) delivered so far, the turn in progress included: what the
    crash trace (``UsageLedger.progress``) records."""
    usage = rollout.builder.usage
    live = rollout.sequence.live if rollout.streamed is not None else None
    turns = len(rollout.builder.lab.turns)
    prompt, cached = (live.prompt_tokens, live.cached_tokens) if live else (0, 0)
    return (
        usage.input_tokens + prompt,
        usage.input_tokens_details.cached_tokens + cached,
        usage.output_tokens + (rollout.streamed or 0),
        turns + (live is not None),
    )


def _capped(n: int | None, room: int) -> int | None:
    # One token past the room: enough to see that the plan was cut, never more built than can be sampled.
    return None if n is None else min(n, room + 1)


def _head(tok: Tokenizer, text: str, room: int) -> str:
    """The start of ``text`` that holds its first ``room`` + 1 tokens (all of it when shorter). The echo
    policy says the user's message back: a 4 MB message would otherwise be tokenized on the loop (0.3 s)
    to sample 16 k tokens of it. Cut where a slice ends (``sampler.tokens.slices``: the tokens before are
    those of the whole text), tokenizing one slice past what is needed."""
    return tok.head(text, room)


def _materialize(rollout: Rollout, plan: TurnPlan, room: int) -> list[PlannedItem]:
    """The token ids the mock model samples this turn, item by item; a script-driven size (``!tokens N``)
    is built only up to ``room`` (+1, so that ``_sample`` sees the cut)."""
    tok = rollout.conversation.tokenizer
    tools = rollout.builder.response.tools
    local, custom = function_tool_names(tools), custom_tool_names(tools)
    outputs: list[PlannedItem] = []
    for call in plan.calls:
        call_id = "call_" + secrets.token_hex(12)
        namespace = namespace_of(tools, call.name)
        if call.name in HOSTED_TOOL_NAMES and call.name not in local and not call.custom:
            query = query_of(call.arguments)
            outputs.append(
                PlannedItem("web_search", tok.model_tokens(json.dumps({"query": query})), query=query)
            )
        elif call.custom or call.name in custom:
            outputs.append(
                PlannedItem(
                    "custom",
                    tok.model_tokens(_head(tok, call.arguments, room)),
                    call.name,
                    call_id,
                    namespace=namespace,
                )
            )
        else:
            arguments = _head(tok, call.arguments, room)
            outputs.append(
                PlannedItem("call", tok.model_tokens(arguments), call.name, call_id, namespace=namespace)
            )
    # Hosted calls go last in a turn: their result closes the segment in every transport's rendering.
    outputs.sort(key=lambda out: out.kind == "web_search")
    if not plan.calls:
        outputs.append(
            PlannedItem(
                "message", tok.model_tokens(_head(tok, plan.text, room), _capped(plan.output_tokens, room))
            )
        )
    elif plan.output_tokens is not None:
        # `!tokens N` on a call line: the model says a preamble before its calls, as real models do.
        spent = sum(len(o.ids) for o in outputs)
        if plan.output_tokens > spent:
            outputs.insert(
                0, PlannedItem("message", tok.model_tokens("", _capped(plan.output_tokens - spent, room)))
            )
    if plan.reasoning_tokens:
        # `!reason N`: the turn opens with N reasoning tokens (filler the model "thinks"), summarised in
        # one sentence that names what follows (deterministic, so every transport says the same). Bounded
        # by the same room as every other script-driven size.
        then = "calling " + ", ".join(c.name for c in plan.calls) if plan.calls else "answering"
        summary = f"Reasoned for {plan.reasoning_tokens} tokens before {then}." if rollout.summary else None
        outputs.insert(
            0,
            PlannedItem(
                "reasoning", tok.model_tokens("", _capped(plan.reasoning_tokens, room)), summary=summary
            ),
        )
    return outputs


async def _sample(
    rollout: Rollout, prompt: Sequence[int], outputs: list[PlannedItem], room: int, produced: list[Item]
) -> AsyncGenerator[Emit | Wait, None]:
    """One turn on the engine: the events of each wake-up's tokens (``TurnEncoder``), and a ``Wait`` where
    the engine is paced; fill ``produced``, record the engine's report. ``rollout.streamed`` counts the
    tokens made into events."""
    builder, conversation, sequence = rollout.builder, rollout.conversation, rollout.sequence
    check_prompt(sequence.limits, len(prompt))  # before the engine sees it, whichever engine it is
    if rollout.encrypted_reasoning:
        at = 0
        for out in outputs:
            if out.kind == "reasoning":  # what include asks back: the tokens it said (``reasoning_content``)
                out.encrypted = reasoning_content(out.ids[: max(0, room - at)])
            at += len(out.ids)
    coalesce = rollout.coalesce_s > 0
    turn = rollout.encoder = TurnEncoder(builder, outputs, room, TextStream(conversation.tokenizer), coalesce)
    ticks: AsyncGenerator[int | Pacing, None]
    if not coalesce and isinstance(sequence, PacedSequence):
        ticks = sequence.run_paced(prompt, turn.ids)
    else:
        ticks = sequence.run_turn(prompt, turn.ids, rollout.coalesce_s)
    async with aclosing(ticks) as ticks:
        async for due in ticks:
            if not isinstance(due, int):
                yield Wait(due, turn)  # the owner may take the next tokens from the engine's timer
                continue
            burst = turn.sent + due
            while True:
                # counted before the owner sends them
                yield Emit(turn.advance(min(EMIT_CHUNK, burst - turn.sent)))
                if turn.sent >= burst:
                    break
                await asyncio.sleep(0)  # a burst (a late wake-up, a very fast model): other streams go first
    report = sequence.last_report
    assert report is not None
    rollout.encoder = None
    phases = dict(rollout.pending_phases)
    if report.lookup_ms is not None and report.first_late_ms is not None:  # the in-process mock GPU's own
        phases["engine_lookup"], phases["clock_late"] = report.lookup_ms, report.first_late_ms
    for name, ms in report.phases_ms.items():  # the API → engine hop, when the engine is elsewhere
        phases[name] = phases.get(name, 0.0) + ms
        builder.lab.phases_ms[name] = builder.lab.phases_ms.get(name, 0.0) + ms
    builder.record_turn(
        TurnReport(
            turn=rollout.turn,
            prompt_tokens=report.prompt_tokens,
            cached_tokens=report.cached_tokens,
            prefill_ms=report.prefill_ms,
            queue_wait_ms=report.queue_wait_ms,
            decode_ms=report.decode_ms,
            output_tokens=report.output_tokens,
            phases_ms=phases,
            written_tokens=report.written_tokens,
            written_by_ttl=dict(report.written_by_ttl),
            expired_tokens=report.expired_tokens,
            block_size=report.block_size,
        )
    )
    rollout.pending_phases.clear()
    for item, ids in turn.outputs():
        produced.append(item)
        conversation.add_model_output(item, ids)
    if turn.truncated:
        raise MaxOutputTokens


def _run_hosted(rollout: Rollout, call: WebSearchCall) -> tuple[ServerEvent, ...]:
    """A hosted call, inside the loop: the service runs in process, its result joins the context."""
    started = time.perf_counter()
    query = (call.action.query or "") if isinstance(call.action, WebSearchAction) else ""
    sources = [
        WebSearchSource(url=s["url"], title=s["title"], snippet=s["snippet"])
        for s in rollout.web_search.search(query)
    ]
    rollout.pending_phases["hosted_tools"] = (
        rollout.pending_phases.get("hosted_tools", 0.0) + (time.perf_counter() - started) * 1e3
    )
    index = rollout.builder.response.output.index(call)
    rollout.conversation.add_hosted_result("web_search to=assistant", web_results_text(sources))
    return tuple(rollout.builder.web_search_done(call, index, sources))
