"""What the perf suite asks the mock model for: the model, a 1 ms prefill, exact-size texts and scripts, and
the creates that carry them (built with ``proto.client.messages``, as every client of the project does)."""

from __future__ import annotations

import proto.client.messages as messages
from proto.client.messages import Item

MODEL = "mock-4000tps"
FAST = "prefill-overhead=1,prefill-time-per-token=0"  # a 1 ms prefill
TOOLS = [{"type": "function", "name": "grep"}]
# One token each with its leading space (sampler/tokens.py pads the model's output with the same words):
# a text of N of them is exactly N tokens.
WORDS = (" the", " code", " and", " then", " check", " file", " test", " we", " will", " run")


def filler(tokens: int, salt: int = 0) -> str:
    """Exactly ``tokens`` tokens of text; a different ``salt`` gives a different text (no shared KV
    prefix)."""
    if salt:
        return "".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(tokens))
    return "".join(WORDS[i % len(WORDS)] for i in range(tokens))


def turn_script(turns: int) -> str:
    """A directive script of ``turns`` tool calls, then a last answer."""
    return "\n".join(
        ["Work on the repository.", *(f'!call grep {{"turn": {k}}}' for k in range(turns)), "!say done"]
    )


def rollout_input(script: str, context: int, salt: int = 0) -> list[Item]:
    """A tool-calling rollout's first input: the directive ``script``, then a ``context``-token history of
    its own (``salt``), as two user messages."""
    return [messages.user_message(script), messages.user_message(filler(context, salt))]


def rollout_body(script: str, context: int, salt: int = 0) -> Item:
    """The body of that rollout, with the one tool the scripts call."""
    return messages.body(MODEL, rollout_input(script, context, salt), TOOLS)


def stream_body(tokens: int, first_line: str = "stream", last: str = "go") -> Item:
    """The body of a response that streams exactly ``tokens`` tokens, then says ``last`` and completes."""
    return messages.body(MODEL, f"{first_line}\n!tokens {tokens} !say {last}")


def say_tokens(tokens: int) -> Item:
    """A long-lived create whose response streams exactly ``tokens`` tokens, then completes."""
    return messages.create(stream_body(tokens))
