"""What a client sends in one rollout of a session, fixed before the clock starts, to the token.

Every transport replays the same plan. The first user message opens with a nonce and the directive script
(one line per round: ``!tokens N !call NAME {args}`` or ``!tokens N !say …``), then code-like padding; each
later round sends the tool outputs answering the last round's calls (or, after a message, a user message),
of sizes chosen here. The server renders every item as ``<|im_start|>header\\n body <|im_end|>`` and adds an
assistant header to the prompt (``sampler/tokens.py``), so the plan knows, before anything is sent, the
prompt tokens the server will count each round: a trace's ``input_tokens`` are met exactly (the tests check
it on every shipped trace), and a synthetic workload's sizes are its own.

A **history rewrite** is a round whose prompt is not the last prompt plus its output plus the new items: a
real agent dropped or rewrote part of its context in between (reasoning dropped between user turns,
compaction, truncation, a rewritten system message). The plan rebuilds it from the trace's own evidence
(docs/lab.md, "History rewrites"): the kept prefix (``Round.keep``, the CSV's ``prefix_len``: the context is
cut there; ``Round.cached_tokens``, the JSONL's ``prefix_tokens``: at least that much was kept unchanged),
the round's total, and the items after the prefix, which are dropped or shortened the way agents do —
first the model's preamble messages (the lab's stand-in for reasoning and commentary), oldest first; then
tool outputs, user messages and final answers, oldest first, to one token each; last the first message down
to its script and the kept prefix. Calls are never touched (their outputs must still answer them), and no
model turn disappears, so the directive script keeps its place. The round's new items take the rest. A
round that cannot be met that way — the kept prefix and the calls alone exceed its prompt — is a
:class:`PlanError` naming the round. What each transport does with a rewrite is the client's business
(``proto/lab/run/clients.py``).

Text is generated and sized here, once per rollout, so the client's own cost never lands inside a measured
interval.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from dataclasses import dataclass
from typing import Any

import msgspec

from proto.client import messages
from proto.core.items import Tool
from proto.lab.workload.traces import Round, Session
from sampler.tokens import Tokenizer, tools_text

# Code-shaped filler: tokenizes like the sources a coding agent reads (~4 characters per token), so the
# server's scan and tokenization work per token is realistic rather than that of one repeated word.
_NAMES = (
    "session",
    "cache",
    "tenant",
    "token",
    "user",
    "request",
    "handler",
    "store",
    "key",
    "value",
    "logout",
    "route",
    "config",
    "result",
    "error",
    "record",
    "client",
    "server",
    "buffer",
    "index",
)
_LINES = (
    "def {a}_{b}(self, {c}):",
    "    return self._{a}.get({c})",
    "    if {c} is None:",
    '        raise {A}Error(f"no {a} for {{{c}!r}}")',
    "    {a}_{b} = {c}.{b}({a}, timeout={n})",
    "class {A}{B}:",
    "    # {a} {b} is keyed by {c}; see {n}",
    "    self._{b}[{c}] = {a}",
    "assert {a}_{b}({c}) == {n}",
    "",
)
CLEARED = "ok"  # a rewritten item's body: one token
PAD_WORD = " the"  # one token after any text that does not end in a space


class PlanError(ValueError):
    """A session the server cannot be made to see exactly (names the round and the shortfall)."""


class _NoRoom(Exception):
    """A rewrite's least history (``history`` tokens, ``calls`` of them the calls') exceeds the room."""

    def __init__(self, history: int, calls: int) -> None:
        super().__init__(history, calls)
        self.history, self.calls = history, calls


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer()


@functools.lru_cache(maxsize=4096)
def filler(tokens: int, seed: int) -> str:
    """ASCII code-like text of about ``tokens`` cl100k tokens (exact to a token or two at the cut)."""
    if tokens <= 0:
        return ""
    rng = random.Random(seed)
    lines: list[str] = []
    # ~8 tokens per line: generate a margin, then cut the ids and decode.
    for _ in range(tokens // 6 + 8):
        a, b, c = rng.sample(_NAMES, 3)
        lines.append(
            rng.choice(_LINES).format(a=a, b=b, c=c, A=a.title(), B=b.title(), n=rng.randint(0, 9999))
        )
    tok = tokenizer()
    return tok.decode(tok.model_tokens("\n".join(lines), tokens))


def fit(text: str, tokens: int) -> str:
    """``text`` cut or padded (with one-token words) to exactly ``tokens`` tokens."""
    tok = tokenizer()
    for _ in range(64):
        n = tok.count(text)
        if n == tokens:
            return text
        if n < tokens:
            text = text.rstrip(" ") + PAD_WORD * (tokens - n)
        else:
            text = tok.decode(tok.model_tokens(text, max(tokens - (n - tokens > 2), 0)))
    raise PlanError(f"cannot fit a text to {tokens} tokens")  # never seen: each step converges


@functools.lru_cache(maxsize=4096)
def exact_text(tokens: int, seed: int) -> str:
    return fit(filler(tokens, seed), tokens) if tokens > 0 else ""


# ---- the plan -------------------------------------------------------------------------------------


@dataclass
class Item:
    """One item of the conversation as the server renders it: ``kind`` user | message (the model's) |
    call | output; ``text`` is the body (a call's is its arguments)."""

    kind: str
    text: str
    tokens: int  # body tokens
    name: str = ""  # call and output items: the tool

    def header(self) -> str:
        return {
            "user": "user",
            "message": "assistant",
            "call": f"assistant to={self.name}",
            "output": f"{self.name} to=assistant",
        }[self.kind]

    def size(self) -> int:
        return len(tokenizer().header(self.header())) + self.tokens + 1


@dataclass(frozen=True)
class Send:
    """Round k's request, as the client sends it after ``wait_s``: ``new`` items (the first message; the
    outputs answering round k−1's calls, in call order; or a user message), after replacing the bodies of
    earlier history items (``rewrite``: (index into the history, new text)) and then removing the items at
    ``drop`` (indices into the same history, before any removal), and what the server will count.
    """

    kind: str  # first | outputs | user | rewrite
    new: tuple[str, ...]
    rewrite: tuple[tuple[int, str], ...]
    wait_s: float
    prompt_tokens: int
    output_tokens: int
    appended_tokens: int  # the items' tokens after what the previous context kept unchanged
    drop: tuple[int, ...] = ()  # a rewrite's removed items, ascending


@dataclass(frozen=True)
class RolloutPlan:
    model: str
    first_message: str
    tools: tuple[dict[str, Any], ...]
    sends: tuple[Send, ...]  # one per round
    calls: tuple[tuple[str, ...], ...]  # each round's call names ((): a message)
    session: str = ""

    @property
    def turns(self) -> int:
        return len(self.sends)

    def request(self) -> dict[str, Any]:
        """The first request's body (every transport): the user message and the tool definitions."""
        return messages.body(self.model, [messages.user_message(self.first_message)], tools=self.tools)


def script_line(r: Round, index: int) -> str:
    if r.calls:
        return f"!tokens {r.output_tokens} " + " | ".join(
            f"!call {c.name} {_compact(c.arguments)}" for c in r.calls
        )
    return f"!tokens {r.output_tokens} !say " + " ".join((r.text or f"Round {index} done.").split())


def _compact(arguments: str) -> str:
    return json.dumps(json.loads(arguments), separators=(",", ":"), ensure_ascii=False)


def build_plan(session: Session, model: str, nonce: str, tool_time_scale: float = 1.0) -> RolloutPlan:
    """``nonce`` opens the first message so no two rollouts share a KV prefix (each pays its own prefill,
    the same in every mode); the content otherwise stays identical across rollouts."""
    tok = tokenizer()
    rounds = session.rounds
    if not rounds:
        raise PlanError(f"{session.name}: no rounds")
    names = sorted({c.name for r in rounds for c in r.calls})
    tools = tuple({"type": "function", "name": n, "parameters": {"type": "object"}} for n in names)
    # The server renders the tool definitions first (``Conversation.add_tools``) and the assistant header
    # after the context: both are in every prompt, before and after everything the rounds change.
    fixed = tools_tokens(tools)  # the tool definitions head every prompt
    assistant = len(tok.header("assistant")) + fixed
    head = f"[session {nonce}]\n" + "\n".join(script_line(r, i) for i, r in enumerate(rounds)) + "\n\n"
    # Round 0: the first message's body makes the prompt.
    if session.first_tokens is not None:
        body = max(session.first_tokens, tok.count(head) + 1)
    else:
        assert rounds[0].input_tokens is not None
        body = rounds[0].input_tokens - assistant - Item("user", "", 0).size()
    if body < tok.count(head) + 1:
        raise PlanError(
            f"{session.name} round 0: {rounds[0].input_tokens} prompt tokens cannot hold the script "
            f"({tok.count(head)} tokens)"
        )
    first = fit(head + exact_text(body - tok.count(head), 0), body)
    items = [Item("user", first, body)]
    sends = [
        Send("first", (first,), (), 0.0, _prompt(items, tools), _output(rounds[0]), _prompt(items, tools))
    ]
    # Every rollout's tool outputs are its own text: no two rollouts share an item (a content-keyed cache,
    # http-cached's, would otherwise serve one session's reads to the next).
    salt = int(nonce) * 7919 if nonce.isdigit() else 0
    for k in range(1, len(rounds)):
        last, this = rounds[k - 1], rounds[k]
        items += model_items(last, k - 1)
        before = sum(i.size() for i in items)  # the previous context: its prompt and output, rendered
        new = [Item("output", "", 0, c.name) for c in last.calls] if last.calls else [Item("user", "", 0)]
        framing = sum(i.size() for i in new)  # with empty bodies
        wait = last.tool_wait_s * tool_time_scale
        if this.input_tokens is None:  # synthetic: the sizes are the workload's
            sizes = list(last.result_tokens) if last.result_tokens else [1]
            _fill(new, sizes, salt + 1000 * k)
            items += new
            sends.append(
                Send(
                    "outputs" if last.calls else "user",
                    tuple(i.text for i in new),
                    (),
                    wait,
                    _prompt(items, tools),
                    _output(this),
                    sum(i.size() for i in new),
                )
            )
            continue
        target = this.input_tokens - assistant  # the items' total this round
        # A trace's kept prefix counts the tool definitions (``fixed``), the items do not.
        previous_total = sends[-1].prompt_tokens + last.output_tokens
        # CSV: the trace cut the context at ``keep`` (TraceLab's replayer keeps exactly that much).
        cut_here = this.keep is not None and this.keep < previous_total
        edits: list[tuple[int, str]] = []
        drops: list[int] = []
        kept = before
        if cut_here or target - before - framing < len(new):
            evidence = this.keep if this.keep is not None else this.cached_tokens or 0
            try:
                edits, drops, kept = _rewrite(
                    items,
                    max(min(evidence - fixed, before), 0),
                    cut_here,
                    target - framing - len(new),
                    tok.count(head),
                )
            except _NoRoom as short:
                least = short.history + this.input_tokens - (target - framing - len(new))
                raise PlanError(
                    f"{session.name} round {k}: {this.input_tokens} prompt tokens cannot hold the {evidence} "
                    f"tokens the trace kept unchanged, the calls after them ({short.calls} tokens) and "
                    f"{len(new)} new item(s): the least such a prompt can be is {least}"
                ) from None
        room = target - sum(i.size() for i in items) - framing
        _fill(new, _split(room, last.result_weights if last.calls else (1.0,)), salt + 1000 * k)
        items += new
        kind = "rewrite" if edits or drops else "outputs" if last.calls else "user"
        prompt = _prompt(items, tools)
        assert prompt == this.input_tokens, (session.name, k, prompt, this.input_tokens)
        sends.append(
            Send(
                kind,
                tuple(i.text for i in new),
                tuple(edits),
                wait,
                prompt,
                _output(this),
                sum(i.size() for i in items) - kept,
                tuple(drops),
            )
        )
    return RolloutPlan(
        model, first, tools, tuple(sends), tuple(tuple(c.name for c in r.calls) for r in rounds), session.name
    )


def _prompt(items: list[Item], tools: tuple[dict[str, Any], ...]) -> int:
    return sum(i.size() for i in items) + len(tokenizer().header("assistant")) + tools_tokens(tools)


@functools.lru_cache(maxsize=256)
def _tools_tokens(encoded: str) -> int:
    tok = tokenizer()
    tools = msgspec.convert(json.loads(encoded), list[Tool])
    return len(tok.header("system tools")) + tok.count(tools_text(tools)) + 1


def tools_tokens(tools: tuple[dict[str, Any], ...]) -> int:
    """The tool definitions' segment, as the server renders it (``sampler.tokens.tools_text``); 0 for none."""
    return _tools_tokens(json.dumps(list(tools))) if tools else 0


def _output(r: Round) -> int:
    spent = sum(tokenizer().count(c.arguments) for c in r.calls)
    return max(r.output_tokens, spent)


def model_items(r: Round, index: int) -> list[Item]:
    """What the server adds for the model's turn: a preamble message padded to the output size (when the
    calls' arguments leave room), then the calls; or the final message (``sampler/loop.py``)."""
    tok = tokenizer()
    if not r.calls:
        text = r.text or f"Round {index} done."
        return [
            Item(
                "message",
                tok.decode(tok.model_tokens(" ".join(text.split()), r.output_tokens)),
                r.output_tokens,
            )
        ]
    calls = [Item("call", c.arguments, tok.count(c.arguments), c.name) for c in r.calls]
    spent = sum(c.tokens for c in calls)
    if r.output_tokens > spent:
        pre = r.output_tokens - spent
        return [Item("message", tok.decode(tok.model_tokens("", pre)), pre), *calls]
    return calls


def _split(total: int, weights: tuple[float, ...]) -> list[int]:
    """``total`` tokens over ``len(weights)`` bodies in proportion, each ≥ 1, summing exactly."""
    n = len(weights)
    spare = total - n
    w = sum(weights) or 1.0
    sizes = [1 + int(spare * x / w) for x in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def _fill(new: list[Item], sizes: list[int], seed: int) -> None:
    for j, (item, n) in enumerate(zip(new, sizes, strict=True)):
        item.tokens = n
        item.text = exact_text(n, seed + j)


def _rewrite(
    items: list[Item],
    kept: int,
    cut_here: bool,
    budget: int,
    script_tokens: int,
) -> tuple[list[tuple[int, str]], list[int], int]:
    """Shrink ``items`` in place to at most ``budget`` tokens, keeping the first ``kept`` unchanged, by the
    module's rule (``cut_here``: a CSV's cut, so every item after ``kept`` shrinks as far as it can).
    Returns the edits (index before removal, new text), the removed indices, and the length of the prefix
    left unchanged; :class:`_NoRoom` when even the least history is larger."""
    tok = tokenizer()
    sizes = [i.size() for i in items]
    starts = [0, *itertools.accumulate(sizes)][:-1]
    # The first item reaching past the kept prefix: everything before it stays as it was.
    first = next((j for j in range(len(items)) if starts[j] + sizes[j] > kept), len(items))

    def floor(j: int) -> int:
        """The least body item ``j`` may shrink to: one token; the tokens before ``kept`` in the item that
        holds it; the script and a token of the first message."""
        item = items[j]
        header = sizes[j] - item.tokens - 1
        least = max(kept - starts[j] - header, 1) if j == first else 1
        return max(least, script_tokens + 1) if j == 0 else least

    def preamble(j: int) -> bool:  # the model's message before its calls: its turn stays without it
        return items[j].kind == "message" and j + 1 < len(items) and items[j + 1].kind == "call"

    droppable = [j for j in range(first, len(items)) if preamble(j) and (j > first or starts[j] >= kept)]
    dropped = set(droppable)
    texts = [j for j in range(max(first, 1), len(items)) if items[j].kind != "call" and j not in dropped]
    order = droppable + texts + ([0] if first == 0 else [])
    total = sum(sizes)
    bodies: dict[int, int] = {}  # new body size per shrunk item; 0: removed
    for j in order:
        if total <= budget and not cut_here:
            break
        body = 0 if j in dropped else min(floor(j), items[j].tokens)
        total -= sizes[j] - (0 if body == 0 else sizes[j] - items[j].tokens + body)
        bodies[j] = body
    if total > budget:
        calls = sum(sizes[j] for j in range(first, len(items)) if items[j].kind == "call")
        raise _NoRoom(total, calls)
    edits: list[tuple[int, str]] = []
    drops: list[int] = []
    unchanged = sum(sizes)
    for j in sorted(bodies):
        body = bodies[j]
        if body == 0:
            drops.append(j)
            unchanged = min(unchanged, starts[j])
            continue
        if body == items[j].tokens:
            continue
        item = items[j]
        text = fit(tok.decode(tok.model_tokens(item.text, body)), body) if body > 1 else CLEARED
        unchanged = min(unchanged, starts[j] + sizes[j] - item.tokens - 1 + body)
        item.text, item.tokens = text, body
        edits.append((j, text))
    for j in reversed(drops):
        del items[j]
    return edits, drops, unchanged
