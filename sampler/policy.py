"""What the mock model says: the directive script, trace replay of a workload, echo, seeded random.

A policy is asked once per turn (the k-th sampling segment of the conversation, counted the same way
in every transport) and must answer the same for the same inputs: a rollout replays identically
over HTTP, GA WebSocket and the long-lived protocol.

Whatever a policy says, the request's promises hold (docs/protocol.md, "Guarantees"): ``decide`` applies
its ``Rules`` to every turn's plan, last, in this one place —

* ``tool_choice: "none"``: no call; a scripted one is the final message ``(not calling NAME: tool_choice
  is "none")``, and the tool rule does not fire.
* ``required`` / a forced tool (function, custom, MCP, hosted): a call — the script's when it names an
  allowed tool, else one generated call (``forced_call``: a function's arguments from its schema via
  ``sampler.schema_args``, seeded by sha256; a custom tool's input and a search's query the message).
  A turn that only follows the model's own hosted calls is not held to it (no endless forced search).
* ``allowed_tools``: only those tools are called; the rest are dropped (``(not calling NAME: tool_choice
  does not allow it)`` when none is left).
* ``max_tool_calls``: calls past the cap are dropped (``(not calling NAME: max_tool_calls reached)``);
  ``Guaranteed`` counts them over the life of its response (a long-lived response's whole life); the cap
  wins over ``required``. ``parallel_tool_calls: false``: one call per turn (``serial``).
* ``text.format`` ``json_schema``: the final message is a `!json` reply valid against the schema, else a
  value generated from it (``json_text``); ``json_object``: a `!json` object, else ``{"answer": TEXT}``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from sampler.schema_args import value_for

WORKLOADS = Path(__file__).parent / "workloads"  # package data; installs are never zipped
FALLBACK_TEXT = "Done."  # what the model says once its script or trace has run out


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: str  # JSON text; a custom tool call's input (any text) when ``custom``
    custom: bool = False  # `!call NAME "text"`: a call of a custom (freeform) tool


@dataclass(frozen=True, kw_only=True)
class TurnPlan:
    calls: tuple[PlannedCall, ...] = ()  # empty → a final message
    text: str = ""  # the final message ("" when calls)
    output_tokens: int | None = None  # pad/trim the turn's output to this many tokens
    reasoning_tokens: int | None = None  # `!reason N`: the turn starts with a reasoning item of N tokens
    final: bool  # this turn ends the rollout
    tool_output_tokens: int | None = None  # trace only: tokens in each call's output
    client_tool_time_s: float | None = (
        None  # trace only: how long each call's tool runs (parallel calls overlap)
    )
    json: bool = False  # `!json {…}`: ``text`` is the JSON value the script gave


def say(text: str, output_tokens: int | None = None, reasoning_tokens: int | None = None) -> TurnPlan:
    return TurnPlan(text=text, output_tokens=output_tokens, reasoning_tokens=reasoning_tokens, final=True)


class Policy(Protocol):
    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan: ...


# ---- the directive script (docs/protocol.md) -------------------------------------------------------------
#
# A line is a directive when its first word is exactly `!call`, `!say`, `!json`, `!tokens` or `!reason`. Any
# other line — `!important`, prose, code — is ordinary text and is not a turn. A directive line that
# does not parse still takes its turn, as a final message naming the line and the fault: a typo
# must neither shift the following turns nor replay something the author did not write.
# `!tokens N` and `!reason N` are prefixes, in either order, before the line's `!call` or `!say`.

_DIRECTIVES = frozenset({"!call", "!say", "!json", "!tokens", "!reason"})
_TOKENS = re.compile(r"!tokens\s+(\d+)(?:\s+|$)")
_REASON = re.compile(r"!reason\s+(\d+)(?:\s+|$)")
_CALL = re.compile(r"\s*!call\s+([A-Za-z_][A-Za-z0-9_.\-]*)\s*")
_JSON = json.JSONDecoder()
_MAX_DIGITS = 9  # `!tokens N` is capped by the model's max output tokens when it runs (sampler/loop.py)


class ScriptError(ValueError):
    pass


def is_directive(line: str) -> bool:
    words = line.strip().split(maxsplit=1)
    return bool(words) and words[0] in _DIRECTIVES


def has_directives(text: str) -> bool:
    """Whether a message holds the directive script (the first user message that does is it: docs/protocol.md,
    "The directive script")."""
    return any(is_directive(line) for line in text.splitlines())


def parse_script(first_user_text: str) -> list[TurnPlan] | None:
    """One plan per directive line; None when the text has no directive line at all."""
    plans: list[TurnPlan] = []
    for lineno, raw in enumerate(first_user_text.splitlines(), 1):
        line = raw.strip()
        if is_directive(line):
            try:
                plans.append(parse_directive(line))
            except ScriptError as e:
                plans.append(say(f"[script error on line {lineno}: {e}]"))
    return plans or None


def parse_directive(line: str) -> TurnPlan:
    prefixes: dict[str, int] = {}
    while line.startswith(("!tokens", "!reason")):
        word = line.split(maxsplit=1)[0]
        m = (_TOKENS if word == "!tokens" else _REASON).match(line)
        if m is None or word in prefixes:
            example = "`!tokens 200 !say done`" if word == "!tokens" else "`!reason 50 !call grep {}`"
            raise ScriptError(f"{word} needs a whole number, once, before a !call or !say, e.g. {example}")
        if len(m[1]) > _MAX_DIGITS:  # the script is user input: int() of 10 MB of digits is a CPU sink
            raise ScriptError(
                f"{word} N: N has more than {_MAX_DIGITS} digits (the model's limits bound it anyway)"
            )
        prefixes[word], line = int(m[1]), line[m.end() :]
        if not line:
            raise ScriptError(f"{word} N must prefix a !call or !say on the same line")
    output_tokens, reasoning = prefixes.get("!tokens"), prefixes.get("!reason")
    if line == "!say" or line.startswith(("!say ", "!say\t")):
        return say(line[4:].strip(), output_tokens, reasoning)
    if line == "!json" or line.startswith(("!json ", "!json\t")):
        try:
            value = json.loads(line[5:])
        except json.JSONDecodeError as e:
            raise ScriptError(f"bad JSON after !json: {e.msg} at column {e.pos + 6}") from None
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return TurnPlan(
            text=text, output_tokens=output_tokens, reasoning_tokens=reasoning, final=True, json=True
        )
    if line.startswith("!call"):
        return TurnPlan(
            calls=_parse_calls(line), output_tokens=output_tokens, reasoning_tokens=reasoning, final=False
        )
    raise ScriptError(f"expected !call, !say or !json, got {line.split()[0]!r}")


def _parse_calls(line: str) -> tuple[PlannedCall, ...]:
    # Scanned, not split on " | ": the JSON arguments may themselves contain " | ".
    calls, pos = [], 0
    while True:
        m = _CALL.match(line, pos)
        if not m:
            raise ScriptError(f"expected `!call NAME {{json}}` at column {pos + 1}")
        name, pos = m[1], m.end()
        args: Any = {}
        if line.startswith(("{", '"'), pos):
            try:
                args, pos = _JSON.raw_decode(line, pos)
            except json.JSONDecodeError as e:
                raise ScriptError(f"bad JSON arguments for {name}: {e.msg} at column {e.pos + 1}") from None
        if isinstance(args, str):  # `!call NAME "text"`: a custom tool's freeform input
            calls.append(PlannedCall(name, args, custom=True))
        else:
            calls.append(PlannedCall(name, json.dumps(args, separators=(",", ":"), ensure_ascii=False)))
        rest = line[pos:].strip()
        if not rest:
            return tuple(calls)
        if not rest.startswith("|"):
            raise ScriptError(f"unexpected text after {name}'s arguments: {rest[:30]!r}")
        pos = line.index("|", pos) + 1


class ScriptPolicy:
    def __init__(self, plans: Sequence[TurnPlan]) -> None:
        self.plans = tuple(plans)

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        return self.plans[turn] if 0 <= turn < len(self.plans) else say(FALLBACK_TEXT)


# ---- workloads: recorded agent rollouts, replayed turn by turn ----------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    first_user_text: str  # the task, without directives
    first_user_tokens: int  # system prompt + tool schemas + task: what the client pads the first message to
    turns: tuple[TurnPlan, ...]
    # "tracelab": the tool times are one draw from TraceLab's fit (proto/lab/workload/synthetic.py), the lab
    # draws them again per rollout seed (docs/lab.md, "Statistics"); "fixed" (the default): as written.
    tool_times: str = "fixed"

    def prompt_tokens_by_turn(self) -> list[int]:
        """The prompt size before each turn (and after the last): history grows by the model's output
        and every call's tool output. Excludes the chat template's few tokens per item."""
        sizes = [self.first_user_tokens]
        for t in self.turns:
            sizes.append(sizes[-1] + (t.output_tokens or 0) + len(t.calls) * (t.tool_output_tokens or 0))
        return sizes

    @property
    def client_tool_time_s(self) -> float:
        return sum(t.client_tool_time_s or 0.0 for t in self.turns)


def _turn_from_json(d: dict[str, Any]) -> TurnPlan:
    out = int(d["output_tokens"])
    if "say" in d:
        return say(str(d["say"]), out)
    calls = tuple(
        PlannedCall(c["name"], json.dumps(c.get("arguments", {}), separators=(",", ":"))) for c in d["calls"]
    )
    if not calls:
        raise ValueError("a turn needs `calls` (non-empty) or `say`")
    return TurnPlan(
        calls=calls,
        output_tokens=out,
        final=False,
        tool_output_tokens=int(d["tool_output_tokens"]),
        client_tool_time_s=float(d["client_tool_time_s"]),
    )


def workload_from_json(d: dict[str, Any]) -> Workload:
    if d.get("format") != 1:
        raise ValueError(f"unsupported workload format {d.get('format')!r} (expected 1)")
    w = Workload(
        name=str(d["name"]),
        description=str(d.get("description", "")),
        first_user_text=str(d["first_user_text"]),
        first_user_tokens=int(d["first_user_tokens"]),
        turns=tuple(_turn_from_json(t) for t in d["turns"]),
        tool_times=str(d.get("tool_times", "fixed")),
    )
    if w.tool_times not in ("fixed", "tracelab"):
        raise ValueError(f"workload {w.name!r}: tool_times must be fixed or tracelab, not {w.tool_times!r}")
    if parse_script(w.first_user_text) is not None:
        raise ValueError(f"workload {w.name!r}: first_user_text must not contain directive lines")
    return w


def workload_names() -> list[str]:
    return sorted(p.stem for p in WORKLOADS.glob("*.json"))


@functools.cache
def load_workload(name_or_path: str) -> Workload:
    """A shipped workload by name (``coding-agent``, ``long-context``) or a JSON file by path."""
    shipped = WORKLOADS / f"{name_or_path}.json"
    if "/" not in name_or_path and shipped.is_file():
        text = shipped.read_text(encoding="utf-8")
    elif Path(name_or_path).is_file():
        text = Path(name_or_path).read_text(encoding="utf-8")
    else:
        raise KeyError(f"unknown workload {name_or_path!r}; shipped: {', '.join(workload_names())}")
    return workload_from_json(json.loads(text))


def workload_to_script(w: Workload) -> str:
    """The rollout as a first user message: the task, then one directive line per turn. Tool
    output sizes and tool times are the client's part and stay in the workload."""
    lines = [w.first_user_text, ""]
    for t in w.turns:
        prefix = f"!tokens {t.output_tokens} " if t.output_tokens is not None else ""
        if t.calls:
            lines.append(
                prefix
                + " | ".join(
                    f"!call {c.name} {json.dumps(c.arguments) if c.custom else c.arguments}" for c in t.calls
                )
            )
        else:
            lines.append(prefix + "!say " + " ".join(t.text.split()))
    return "\n".join(lines)


class TracePolicy:
    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        turns = self.workload.turns
        return turns[turn] if 0 <= turn < len(turns) else say(FALLBACK_TEXT)


# ---- policies without a script ------------------------------------------------------------------


class EchoPolicy:
    """Answers every turn by repeating the latest user message."""

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        return say(last_user_text or first_user_text or "(empty message)")


_WORDS = (
    "latency",
    "socket",
    "token",
    "cache",
    "prefix",
    "stream",
    "tool",
    "frame",
    "batch",
    "queue",
    "response",
    "model",
    "agent",
    "turn",
    "delta",
    "buffer",
    "kernel",
    "decode",
    "prefill",
    "block",
)


class RandomPolicy:
    """Seeded: the same seed and first user message give the same rollout, in any transport and
    process (seeds are derived with sha256, never Python's salted ``hash``)."""

    def __init__(self, seed: int = 0, tools: Sequence[str] = ("web_search",)) -> None:
        self.seed = seed
        self.tools = tuple(tools)

    def _rng(self, *parts: object) -> random.Random:
        digest = hashlib.sha256("\x00".join(map(str, (self.seed, *parts))).encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        tool_turns = self._rng("rollout", first_user_text).randint(0, 4)
        rng = self._rng("turn", turn, first_user_text)
        if turn < tool_turns and self.tools:
            calls = tuple(
                PlannedCall(rng.choice(self.tools), json.dumps({"query": " ".join(rng.sample(_WORDS, 3))}))
                for _ in range(rng.randint(1, 2))
            )
            return TurnPlan(calls=calls, output_tokens=rng.randint(20, 120), final=False)
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 25))).capitalize() + "."
        return say(text, rng.randint(30, 300))


CACHED_SCRIPT_CHARS = 1 << 16  # scripts up to this size are remembered (sent again every turn)


def script_plans(script: str, parallel: bool) -> tuple[TurnPlan, ...] | None:
    """The script's turns as the model plays them: ``parse_script``'s, one call a turn under
    ``parallel_tool_calls: false`` (``serial``); None without a directive line. Remembered for scripts up
    to ``CACHED_SCRIPT_CHARS``: every request of a rollout reads the same script."""
    if len(script) <= CACHED_SCRIPT_CHARS:
        return _cached_plans(script, parallel)
    return _plans(script, parallel)


@functools.lru_cache(maxsize=64)
def _cached_plans(script: str, parallel: bool) -> tuple[TurnPlan, ...] | None:
    return _plans(script, parallel)


def _plans(script: str, parallel: bool) -> tuple[TurnPlan, ...] | None:
    plans = parse_script(script)
    if plans is None:
        return None
    return tuple(plans if parallel else serial(plans))


def serial(plans: Sequence[TurnPlan]) -> list[TurnPlan]:
    """``parallel_tool_calls: false``: the model makes one call per turn, so a line of parallel calls
    becomes that many turns, in order (the line's `!tokens` / `!reason` go with its first call)."""
    out: list[TurnPlan] = []
    for plan in plans:
        if len(plan.calls) <= 1:
            out.append(plan)
            continue
        out.append(replace(plan, calls=plan.calls[:1]))
        out.extend(
            replace(plan, calls=(call,), output_tokens=None, reasoning_tokens=None) for call in plan.calls[1:]
        )
    return out


class _OneCallPerTurn:
    """A policy without a script under ``parallel_tool_calls: false``: its first call of each turn."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        plan = self.inner.plan(turn, first_user_text, last_user_text)
        return replace(plan, calls=plan.calls[:1]) if len(plan.calls) > 1 else plan


# ---- the tools a request offers ---------------------------------------------------------------------
#
# The model only ever calls a tool the request offers: a scripted call of anything else is said as text
# instead (the turn is a final message naming the call). Offered a function tool and no script, the model
# follows the tool rule below.


@dataclass(frozen=True)
class OfferedTool:
    name: str
    kind: Literal["function", "custom", "hosted"]
    description: str = ""
    parameters: Any = None  # the function's JSON schema (None: no parameters)


def only_offered(plan: TurnPlan, offered: Sequence[OfferedTool]) -> TurnPlan:
    """``plan`` without its calls of tools the request does not offer; a turn left with none is a final
    message that says what was not called."""
    names = {tool.name for tool in offered}
    kept = tuple(call for call in plan.calls if call.name in names)
    if len(kept) == len(plan.calls):
        return plan
    if kept:
        return replace(plan, calls=kept)
    missing = ", ".join(dict.fromkeys(call.name for call in plan.calls))
    return say(
        f"(not calling {missing}: this request offers no such tool)",
        plan.output_tokens,
        plan.reasoning_tokens,
    )


class _OfferedOnly:
    def __init__(self, inner: Policy, offered: Sequence[OfferedTool]) -> None:
        self.inner, self.offered = inner, tuple(offered)

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        return only_offered(self.inner.plan(turn, first_user_text, last_user_text), self.offered)


# The tool rule (docs/protocol.md, "The directive script"): without directives, on the turn that answers a
# user message, the
# model calls the offered function tool sharing the most words with that message (a word of the tool's
# name counts twice, one of its description once; ties go to the tool offered first); its arguments are
# generated from the tool's ``parameters`` schema, seeded by the tool's name and the message. No tool
# sharing a word, or a turn that answers tool output: the server's default policy answers.
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "can",
        "for",
        "from",
        "get",
        "how",
        "into",
        "its",
        "like",
        "me",
        "my",
        "of",
        "on",
        "or",
        "please",
        "set",
        "that",
        "the",
        "this",
        "to",
        "was",
        "what",
        "whats",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text).lower()
    return {w for w in _WORD.findall(spaced) if len(w) > 1 and w not in _STOPWORDS}


_RULE_CHARS = (
    2000  # the rule reads the message's first 2 000 characters: a 4 MB prompt must not stall the loop
)


def matching_tool(message: str, offered: Sequence[OfferedTool]) -> OfferedTool | None:
    said = _words(message[:_RULE_CHARS].replace("'", ""))
    best, best_score = None, 0
    for tool in offered:
        if tool.kind != "function":
            continue
        score = 2 * len(said & _words(tool.name)) + len(said & (_words(tool.description) - _words(tool.name)))
        if score > best_score:
            best, best_score = tool, score
    return best


def rule_call(tool: OfferedTool, message: str) -> PlannedCall:
    digest = hashlib.sha256("\x00".join(("tool-rule", tool.name, message[:_RULE_CHARS])).encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    args = value_for(tool.parameters, rng) if tool.parameters is not None else {}
    return PlannedCall(tool.name, json.dumps(args, separators=(",", ":"), ensure_ascii=False))


class ToolRulePolicy:
    """The tool rule on ``answers_user_turn`` (the first turn of this response when the conversation's
    newest item is a user message); every other turn, ``inner``."""

    def __init__(self, inner: Policy, offered: Sequence[OfferedTool], answers_user_turn: int | None) -> None:
        self.inner, self.offered, self.answers_user_turn = inner, tuple(offered), answers_user_turn

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        if (
            turn == self.answers_user_turn
            and (tool := matching_tool(last_user_text, self.offered)) is not None
        ):
            return TurnPlan(calls=(rule_call(tool, last_user_text),), final=False)
        return self.inner.plan(turn, first_user_text, last_user_text)


def select_policy(
    first_user_text: str,
    default: str,
    parallel: bool = True,
    offered: Sequence[OfferedTool] | None = None,
    answers_user_turn: int | None = None,
    rules: Rules | None = None,
) -> Policy:
    """Directives in the first user message win; else ``default``: ``echo``, ``random[:SEED]`` or
    ``trace:NAME|PATH``. ValueError/KeyError for a bad default (call once at start-up to check it).
    ``parallel=False`` (the request's ``parallel_tool_calls``): at most one call per turn. ``offered`` (the
    request's tools; None: not checked): calls of anything else become text, and without a script the
    tool rule answers the turn ``answers_user_turn``. ``rules`` (the request's ``tool_choice``,
    ``max_tool_calls`` and ``text.format``): the guarantees, applied last, whatever the script says."""
    rules = rules or Rules()
    rule_tools = () if rules.tool_choice == "none" else [t for t in offered or () if rules.may_call(t.name)]
    policy = _select(first_user_text, default, parallel, rule_tools, answers_user_turn)
    policy = policy if offered is None else _OfferedOnly(policy, offered)
    return policy if rules == Rules() else Guaranteed(policy, rules, offered or ())


def _select(
    first_user_text: str,
    default: str,
    parallel: bool,
    offered: Sequence[OfferedTool],
    answers_user_turn: int | None,
) -> Policy:
    plans = script_plans(first_user_text, parallel)
    if plans is not None:
        return ScriptPolicy(plans)
    kind, _, arg = default.partition(":")
    policy: Policy
    if kind == "echo" and not arg:
        policy = EchoPolicy()
    elif kind == "random":
        policy = RandomPolicy(int(arg) if arg else 0)
    elif kind == "trace" and arg:
        policy = TracePolicy(load_workload(arg))
    else:
        raise ValueError(f"unknown policy {default!r}; expected echo, random[:SEED] or trace:NAME")
    if any(tool.kind == "function" for tool in offered):
        policy = ToolRulePolicy(policy, offered, answers_user_turn)
    return policy if parallel else _OneCallPerTurn(policy)


# ---- the guarantees (docs/protocol.md, "Guarantees") ---------------------------------------------------
#
# What the API promises holds whatever the script (or the default policy) says: ``tool_choice``,
# ``max_tool_calls`` and ``text.format`` are applied last, to every turn's plan, in this one place.


@dataclass(frozen=True)
class Rules:
    """The request's promises about the model's output; the defaults promise nothing."""

    tool_choice: Literal["auto", "none", "required"] = "auto"  # a forced tool is "required" + ``forced``
    forced: str | None = None  # the one tool a forced ``tool_choice`` names
    allowed: frozenset[str] | None = None  # ``allowed_tools``: the only tools the model may call
    max_tool_calls: int | None = None  # calls in the whole response (hosted and local), at most
    text_format: Literal["text", "json_schema", "json_object"] = "text"
    schema: Any = None  # ``json_schema``'s schema

    def may_call(self, name: str) -> bool:
        if self.tool_choice == "none":
            return False
        if self.forced is not None:
            return name == self.forced
        return self.allowed is None or name in self.allowed


def _rng(*parts: str) -> random.Random:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def forced_call(tool: OfferedTool, message: str) -> PlannedCall:
    """The call a ``required`` or forced ``tool_choice`` makes when the script names no allowed tool:
    a function's arguments generated from its schema (the tool rule's seed), a custom tool's input the
    message, a hosted search's query the message."""
    head = message[:_RULE_CHARS]
    if tool.kind == "function":
        return rule_call(tool, message)
    if tool.kind == "custom":
        return PlannedCall(tool.name, head or tool.name, custom=True)
    return PlannedCall(tool.name, json.dumps({"query": " ".join(head.split()) or tool.name}))


def json_text(rules: Rules, plan: TurnPlan, turn: int, message: str) -> str:
    """The final message's text under a JSON ``text.format``: the script's `!json` when it is valid
    (against the schema; an object for ``json_object``), else generated."""
    value: Any = json.loads(plan.text) if plan.json else None
    if rules.text_format == "json_object":
        if isinstance(value, dict):
            return plan.text
        generated: Any = {"answer": plan.text if not plan.json else message[:_RULE_CHARS]}
    else:
        if plan.json and _validates(value, rules.schema):
            return plan.text
        seed = json.dumps(rules.schema, sort_keys=True, default=str)
        generated = value_for(rules.schema, _rng("json-schema", seed, str(turn), message[:_RULE_CHARS]))
    return json.dumps(generated, separators=(",", ":"), ensure_ascii=False)


def _validates(value: Any, schema: Any) -> bool:
    import jsonschema  # only a `!json` under a strict schema needs it

    try:
        jsonschema.validate(value, schema if isinstance(schema, dict) else {})
    except (jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


class Guaranteed:
    """``inner`` under the request's ``Rules``. Keeps the count of calls made for ``max_tool_calls``: one
    instance lives as long as its response (a long-lived response's whole life), asked once per turn (a
    turn asked again answers what it answered). A turn that follows the model's own hosted calls (their
    results, inside the response) is not held to ``required``: a forced search would search forever."""

    def __init__(self, inner: Policy, rules: Rules, offered: Sequence[OfferedTool]) -> None:
        self.inner, self.rules, self.offered = inner, rules, tuple(offered)
        self.calls_made = 0
        self.answered: dict[int, TurnPlan] = {}
        self.local = {tool.name for tool in offered if tool.kind != "hosted"}
        self.after_hosted = False

    def plan(self, turn: int, first_user_text: str, last_user_text: str) -> TurnPlan:
        if turn not in self.answered:
            plan = decide(
                self.rules,
                self.offered,
                self.inner.plan(turn, first_user_text, last_user_text),
                turn,
                last_user_text,
                self.calls_made,
                after_hosted=self.after_hosted,
            )
            self.calls_made += len(plan.calls)
            self.after_hosted = bool(plan.calls) and all(call.name not in self.local for call in plan.calls)
            self.answered[turn] = plan
        return self.answered[turn]


def decide(
    rules: Rules,
    offered: Sequence[OfferedTool],
    plan: TurnPlan,
    turn: int,
    message: str,
    calls_made: int = 0,
    after_hosted: bool = False,
) -> TurnPlan:
    """The turn the model takes under ``rules``: ``plan`` (what the script or the default policy says)
    with the guarantees applied — tool_choice, then max_tool_calls, then text.format. ``calls_made``: the
    response's calls so far; ``after_hosted``: the turn follows hosted calls only (``required`` is off)."""
    left = None if rules.max_tool_calls is None else max(0, rules.max_tool_calls - calls_made)
    if plan.calls:
        kept = tuple(call for call in plan.calls if rules.may_call(call.name))
        if not kept:
            names = ", ".join(dict.fromkeys(call.name for call in plan.calls))
            why = 'tool_choice is "none"' if rules.tool_choice == "none" else "tool_choice does not allow it"
            plan = say(f"(not calling {names}: {why})", plan.output_tokens, plan.reasoning_tokens)
        elif len(kept) < len(plan.calls):
            plan = replace(plan, calls=kept)
    if rules.tool_choice == "required" and not after_hosted and not plan.calls and left != 0:
        tool = next((t for t in offered if rules.may_call(t.name)), None)
        if rules.forced is None:
            functions = [t for t in offered if t.kind == "function" and rules.may_call(t.name)]
            tool = matching_tool(message, functions) or tool
        if tool is not None:
            plan = TurnPlan(
                calls=(forced_call(tool, message),), reasoning_tokens=plan.reasoning_tokens, final=False
            )
    if left is not None and len(plan.calls) > left:
        if left:
            plan = replace(plan, calls=plan.calls[:left])
        else:
            names = ", ".join(dict.fromkeys(call.name for call in plan.calls))
            plan = say(f"(not calling {names}: max_tool_calls reached)", None, plan.reasoning_tokens)
    if not plan.calls and rules.text_format != "text":
        plan = replace(plan, text=json_text(rules, plan, turn, message), output_tokens=None, json=True)
    return plan
