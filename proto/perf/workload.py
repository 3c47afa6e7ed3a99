"""What the perf suite asks the mock model for: the model, a 1 ms prefill, exact-size texts and scripts."""

from __future__ import annotations

from typing import Any

MODEL = "mock-4000tps"
FAST = "prefill-overhead=1,prefill-time-per-token=0"  # a 1 ms prefill
TOOLS = [{"type": "function", "name": "grep"}]
# One token each with its leading space (sampler/tokens.py pads the model's output with the same words):
# a text of N of them is exactly N tokens.
WORDS = (" the", " code", " and", " then", " check", " file", " test", " we", " will", " run")


def filler(tokens: int, salt: int = 0) -> str:
    """Exactly ``tokens`` tokens of text; a different ``salt`` gives a different text (no shared KV prefix)."""
    if salt:
        return "".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(tokens))
    return "".join(WORDS[i % len(WORDS)] for i in range(tokens))


def turn_script(turns: int) -> str:
    """A directive script of ``turns`` tool calls, then a last answer."""
    return "\n".join(["Work on the repository.", *(f'!call grep {{"turn": {k}}}' for k in range(turns)), "!say done"])


def say_tokens(tokens: int) -> dict[str, Any]:
    """A long-lived create whose response streams exactly ``tokens`` tokens, then completes."""
    return {"type": "response.create", "model": MODEL, "input": f"stream\n!tokens {tokens} !say go"}
