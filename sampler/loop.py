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
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from proto.builder import CallStream, CustomCallStream, MessageStream, ReasoningStream, ResponseBuilder
from proto.events import ServerEvent
from proto.items import (
    CALL_ITEMS,
    HOSTED_TOOL_NAMES,
    CallItem,
    Item,
    WebSearchAction,
    WebSearchCall,
    WebSearchSource,
    custom_tool_names,
    function_tool_names,
    namespace_of,
)
from proto.response import TurnReport
from sampler.engine import EngineSequence
from sampler.policy import Policy, TurnPlan
from sampler.tokens import Conversation, TextStream, reasoning_content, web_results_text
from sampler.tools import WebSearch, query_of


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


Step = Emit | Boundary | Suspend


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
    # This response's own input items, in the order they entered the context (what the store keeps).
    input_items: list[Item] = field(default_factory=list)
    summary: bool = False  # reasoning.summary asked for summaries of reasoning items
    encrypted_reasoning: bool = False  # include asked for reasoning.encrypted_content


@dataclass
class _Output:
    kind: str  # "reasoning" | "message" | "call" | "custom" | "web_search"
    ids: list[int]
    name: str = ""
    call_id: str = ""
    query: str = ""
    namespace: str | None = None
    summary: str | None = None  # reasoning: its summary text, when one is asked for


async def sample(rollout: Rollout) -> AsyncGenerator[Step, list[Item] | None]:
    """Sample until the model gives its final answer (see the module's steps); the owner frames the
    terminal event. Raises ``MaxOutputTokens``; the GPU sequence is the owner's to close."""
    while True:
        yield Boundary(final=False)  # items queued before this turn join now (the owner added them)
        plan = rollout.policy.plan(rollout.turn, rollout.script, _last_user_text(rollout.conversation))
        outputs = _materialize(rollout, plan)
        produced: list[Item] = []
        async with aclosing(_sample(rollout, outputs, produced)) as batches:
            async for batch in batches:
                yield Emit(batch)
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
        local = tuple(c for c in calls if isinstance(c, CALL_ITEMS))
        if local:
            rollout.sequence.suspend()
            resumed = yield Suspend(local)
            if resumed is None:
                return


def _last_user_text(conversation: Conversation) -> str:
    return conversation.user_texts[-1] if conversation.user_texts else ""


def _materialize(rollout: Rollout, plan: TurnPlan) -> list[_Output]:
    """The token ids the mock model samples this turn, item by item."""
    tok = rollout.conversation.tokenizer
    tools = rollout.builder.response.tools
    local, custom = function_tool_names(tools), custom_tool_names(tools)
    outputs: list[_Output] = []
    for call in plan.calls:
        call_id = "call_" + secrets.token_hex(12)
        namespace = namespace_of(tools, call.name)
        if call.name in HOSTED_TOOL_NAMES and call.name not in local and not call.custom:
            query = query_of(call.arguments)
            outputs.append(_Output("web_search", tok.model_tokens(json.dumps({"query": query})), query=query))
        elif call.custom or call.name in custom:
            outputs.append(_Output("custom", tok.model_tokens(call.arguments), call.name, call_id, namespace=namespace))
        else:
            outputs.append(_Output("call", tok.model_tokens(call.arguments), call.name, call_id, namespace=namespace))
    # Hosted calls go last in a turn: their result closes the segment in every transport's rendering.
    outputs.sort(key=lambda out: out.kind == "web_search")
    if not plan.calls:
        outputs.append(_Output("message", tok.model_tokens(plan.text, plan.output_tokens)))
    elif plan.output_tokens is not None:
        # `!tokens N` on a call line: the model says a preamble before its calls, as real models do.
        spent = sum(len(o.ids) for o in outputs)
        if plan.output_tokens > spent:
            outputs.insert(0, _Output("message", tok.model_tokens("", plan.output_tokens - spent)))
    if plan.reasoning_tokens:
        # `!reason N`: the turn opens with N reasoning tokens (filler the model "thinks"), summarised in
        # one sentence that names what follows (deterministic, so every transport says the same).
        then = "calling " + ", ".join(c.name for c in plan.calls) if plan.calls else "answering"
        summary = f"Reasoned for {plan.reasoning_tokens} tokens before {then}." if rollout.summary else None
        outputs.insert(0, _Output("reasoning", tok.model_tokens("", plan.reasoning_tokens), summary=summary))
    return outputs


async def _sample(rollout: Rollout, outputs: list[_Output], produced: list[Item]) -> AsyncGenerator[tuple[ServerEvent, ...], None]:
    """One turn on the GPU: yield each wake-up's events (every output item token by token), fill
    ``produced``, record the engine's report."""
    builder, conversation = rollout.builder, rollout.conversation
    ids = [token for out in outputs for token in out.ids]
    limit = rollout.max_output_tokens
    truncated = limit is not None and builder.usage.output_tokens + len(ids) > limit
    if truncated:
        assert limit is not None
        ids = ids[: max(0, limit - builder.usage.output_tokens)]
    spans: list[tuple[_Output, int, int]] = []  # (output, first token index, end)
    at = 0
    for out in outputs:
        spans.append((out, at, at + len(out.ids)))
        at += len(out.ids)
    streams: dict[int, _Stream] = {}
    text = TextStream(conversation.tokenizer)
    due = 0
    span_index = 0
    prompt = conversation.prompt()
    async with aclosing(rollout.sequence.run_turn(prompt, ids)) as ticks:
        async for count in ticks:
            batch: list[ServerEvent] = []
            for token_index in range(due, due + count):
                while spans[span_index][2] <= token_index:
                    span_index += 1
                out, first, end = spans[span_index]
                if token_index == first:
                    batch.extend(_open_item(builder, out, streams, span_index))
                stream = streams[span_index]
                if isinstance(stream, _TEXT_STREAMS):
                    piece = text.push(ids[token_index])
                    if piece:
                        batch.append(stream.delta(piece))
                if token_index == end - 1 or token_index == len(ids) - 1:
                    if isinstance(stream, _TEXT_STREAMS):
                        tail = text.flush()
                        if tail:
                            batch.append(stream.delta(tail))
                    if isinstance(stream, tuple):
                        produced.append(stream[0])
                    else:
                        if isinstance(stream, ReasoningStream):
                            _reasoned(rollout, stream, ids[first:end])
                        batch.extend(stream.done())
                        produced.append(stream.item)
            due += count
            yield tuple(batch)
    report = rollout.sequence.last_report
    assert report is not None
    phases = dict(rollout.pending_phases)
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
        )
    )
    rollout.pending_phases.clear()
    for item, (_out, first, end) in zip(produced, spans, strict=False):
        conversation.add_model_output(item, ids[first:end])
    if truncated:
        raise MaxOutputTokens


_Stream = MessageStream | CallStream | CustomCallStream | ReasoningStream | tuple[WebSearchCall, int]
_TEXT_STREAMS = (MessageStream, CallStream, CustomCallStream)


def _open_item(builder: ResponseBuilder, out: _Output, streams: dict[int, _Stream], key: int) -> list[ServerEvent]:
    stream: _Stream
    if out.kind == "message":
        stream = builder.message()
    elif out.kind == "call":
        stream = builder.function_call(out.name, out.call_id, out.namespace)
    elif out.kind == "custom":
        stream = builder.custom_call(out.name, out.call_id, out.namespace)
    elif out.kind == "reasoning":
        stream = builder.reasoning(out.summary)
    else:
        item, index, events = builder.web_search(out.query)
        streams[key] = (item, index)
        return events
    streams[key] = stream
    return stream.added()


def _reasoned(rollout: Rollout, stream: ReasoningStream, ids: list[int]) -> None:
    """A reasoning item's tokens are done: they count as reasoning tokens, and ``include`` may ask for
    them back as ``encrypted_content`` (``sampler.tokens.reasoning_content``)."""
    rollout.builder.usage.output_tokens_details.reasoning_tokens += len(ids)
    if rollout.encrypted_reasoning:
        stream.set_encrypted(reasoning_content(ids))


def _run_hosted(rollout: Rollout, call: WebSearchCall) -> tuple[ServerEvent, ...]:
    """A hosted call, inside the loop: the service runs in process, its result joins the context."""
    started = time.perf_counter()
    query = (call.action.query or "") if isinstance(call.action, WebSearchAction) else ""
    sources = [WebSearchSource(url=s["url"], title=s["title"], snippet=s["snippet"]) for s in rollout.web_search.search(query)]
    rollout.pending_phases["hosted_tools"] = rollout.pending_phases.get("hosted_tools", 0.0) + (time.perf_counter() - started) * 1e3
    index = rollout.builder.response.output.index(call)
    rollout.conversation.add_hosted_result("web_search to=assistant", web_results_text(sources))
    return tuple(rollout.builder.web_search_done(call, index, sources))

