"""What a client sends in one rollout of a workload, fixed before the clock starts.

Every transport replays the same plan: the first user message (a nonce, padding to the workload's
``first_user_tokens``, then the directive script), and per turn the tool outputs (text of the recorded
``tool_output_tokens`` each) and the tool wait. Text is generated and sized here, once, so the client's own
cost never lands inside a measured interval.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass
from typing import Any

from sampler.policy import TurnPlan, Workload, say, workload_to_script
from sampler.tokens import Tokenizer

# Code-shaped filler: tokenizes like the sources a coding agent reads (~4 characters per token), so the
# server's scan and tokenization work per token is realistic rather than that of one repeated word.
_NAMES = ("session", "cache", "tenant", "token", "user", "request", "handler", "store", "key", "value",
          "logout", "route", "config", "result", "error", "record", "client", "server", "buffer", "index")
_LINES = (
    "def {a}_{b}(self, {c}):",
    "    return self._{a}.get({c})",
    "    if {c} is None:",
    "        raise {A}Error(f\"no {a} for {{{c}!r}}\")",
    "    {a}_{b} = {c}.{b}({a}, timeout={n})",
    "class {A}{B}:",
    "    # {a} {b} is keyed by {c}; see {n}",
    "    self._{b}[{c}] = {a}",
    "assert {a}_{b}({c}) == {n}",
    "",
)


@functools.cache
def _tokenizer() -> Tokenizer:
    return Tokenizer()


@functools.cache
def filler(tokens: int, seed: int) -> str:
    """ASCII code-like text of about ``tokens`` cl100k tokens (exact to a token or two at the cut)."""
    if tokens <= 0:
        return ""
    rng = random.Random(seed)
    lines: list[str] = []
    # ~8 tokens per line: generate a margin, then cut the ids and decode.
    for _ in range(tokens // 6 + 8):
        a, b, c = rng.sample(_NAMES, 3)
        lines.append(rng.choice(_LINES).format(a=a, b=b, c=c, A=a.title(), B=b.title(), n=rng.randint(0, 9999)))
    tok = _tokenizer()
    return tok.decode(tok.model_tokens("\n".join(lines), tokens))


@dataclass(frozen=True)
class TurnSend:
    """The client's answer to turn k's calls: one output per call (in call order) after ``tool_wait_s``."""

    outputs: tuple[str, ...]
    tool_wait_s: float


@dataclass(frozen=True)
class RolloutPlan:
    model: str
    first_message: str
    tools: tuple[dict[str, Any], ...]
    answers: tuple[TurnSend, ...]  # one per tool turn, in order
    turns: int  # sampling segments, the final message included

    def request(self) -> dict[str, Any]:
        """The first request's body (every transport): the user message and the tool definitions."""
        return {"model": self.model, "input": [{"role": "user", "content": self.first_message}], "tools": list(self.tools)}


def shorten(w: Workload, turns: int | None) -> Workload:
    """The first ``turns - 1`` tool turns, then a final message: a quicker rollout over the same sizes."""
    if turns is None or turns >= len(w.turns):
        return w
    kept = (*w.turns[: max(turns - 1, 0)], say("Stopping here (shortened run).", 20))
    return dataclasses.replace(w, name=f"{w.name}[:{turns}]", turns=kept)


def build_plan(w: Workload, model: str, nonce: str, tool_time_scale: float = 1.0) -> RolloutPlan:
    """``nonce`` opens the first message so no two rollouts share a KV prefix (each pays its own prefill,
    the same in every mode); the workload's content otherwise stays identical across rollouts."""
    tok = _tokenizer()
    script = workload_to_script(w)
    head = f"[session {nonce}]\nRepository context follows.\n"
    pad = max(w.first_user_tokens - tok.count(head + script) - 2, 0)
    first = head + filler(pad, 0) + "\n\n" + script
    names = sorted({c.name for t in w.turns for c in t.calls})
    tools: tuple[dict[str, Any], ...] = tuple({"type": "function", "name": n, "parameters": {"type": "object"}} for n in names)
    answers = tuple(_answers(i, t, tool_time_scale) for i, t in enumerate(w.turns) if t.calls)
    return RolloutPlan(model=model, first_message=first, tools=tools, answers=answers, turns=len(w.turns))


def _answers(index: int, t: TurnPlan, scale: float) -> TurnSend:
    size = t.tool_output_tokens or 0
    outputs = tuple(filler(size, 1000 * (index + 1) + j) for j in range(len(t.calls)))
    return TurnSend(outputs=outputs, tool_wait_s=(t.client_tool_time_s or 0.0) * scale)
