"""Prompt caching as OpenAI reports and bills it, on the mock GPU's own prefix cache (docs/protocol.md,
"Prompt caching"): the settings a cached prefix is keyed on, the diagnostics that compare a request with
an earlier response, and the write rate the ledger bills.

Sources: OpenAI's prompt caching guide (developers.openai.com/api/docs/guides/prompt-caching: "For GPT-5.6
models and later model families, cache writes cost 1.25× the uncached input token rate") and its
diagnostics guide (…/prompt-caching/diagnostics: reuse "requires an exact prefix match and compatible
request settings, including the model, service tier, and tools"); the shapes are openai-python's
(``prompt_cache_options``, ``usage.input_tokens_details.cache_write_tokens``) and OpenAI's September 2026
reference for ``prompt_cache_diagnostics``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Final

import msgspec

from proto.core import openai_types as oa
from proto.core.response import (
    CacheHit,
    CacheMiss,
    ComparisonResponseNotFound,
    Diagnostics,
    MissReason,
    Response,
    TurnReport,
    Unavailable,
)

# The uncached input rate a written token costs, on GPT-5.6 and later (the guide above); earlier models
# write for free (1.0: a written token is an ordinary uncached input token).
WRITE_RATE: Final = 1.25
WRITE_RATE_FROM: Final = (5, 6)  # the first gpt-N.M family that pays it
# A write's rate by its lifetime, relative to ``WRITE_RATE``. The guide names one write rate, 1.25×, and no
# other for a 12 h write; no OpenAI source found gives one, so both lifetimes pay it (kept apart in the
# ledger, so a published rate is one number here).
WRITE_RATE_BY_TTL: Final[dict[str, float]] = {"30m": 1.0, "12h": 1.0}


def _digest(value: object) -> str:
    return hashlib.blake2b(msgspec.json.encode(value), digest_size=8).hexdigest()


# The request settings a cached prefix is keyed on, as the echoed Response carries them (so a stored
# response is its own record of them), in the order a miss is explained. Tools are rendered into the
# prompt's tokens and each model has its own GPU; the rest seed the prefix cache's keys (``salt``).
KEY_INPUTS: Final[tuple[tuple[MissReason, Callable[[Response], object]], ...]] = (
    ("model_changed", lambda r: r.model),
    ("prompt_cache_key_changed", lambda r: r.prompt_cache_key),
    ("service_tier_changed", lambda r: r.service_tier),
    ("tools_changed", lambda r: _digest(r.tools)),
    ("text_format_changed", lambda r: _digest(r.text.format)),
    ("reasoning_effort_changed", lambda r: r.reasoning.effort if r.reasoning else None),
    ("verbosity_changed", lambda r: r.text.verbosity),
)
_SALTED: Final = (
    "prompt_cache_key_changed",
    "service_tier_changed",
    "text_format_changed",
    "reasoning_effort_changed",
    "verbosity_changed",
)


def salt(response: Response) -> int:
    """The prefix cache's seed for a response's prompts: the keyed settings that are not in its tokens."""
    keyed = [get(response) for reason, get in KEY_INPUTS if reason in _SALTED]
    return int.from_bytes(hashlib.blake2b(msgspec.json.encode(keyed), digest_size=8).digest(), "big") >> 1


# The lifetimes a request may write under, in seconds (openai-python 3.63, ``PromptCacheOptions.ttl``:
# "The minimum lifetime applied to every implicit and explicit cache breakpoint written by the request.
# Supported values are `30m` (the default) and `12h`. The backend may retain cache entries for longer.").
# The mock keeps a block exactly its lifetime after its last use, the minimum promised, so a test can tell.
TTL_SECONDS: Final[dict[str, float]] = {"30m": 30 * 60.0, "12h": 12 * 3600.0}
DEFAULT_TTL: Final = "30m"
# "Each request can write up to four breakpoints"; implicit mode's own is one of them (the SDK's
# ``PromptCacheOptions``: "With `implicit`, OpenAI creates one implicit breakpoint and writes up to the latest
# three explicit breakpoints in the request. With `explicit`, … up to the latest four").
MAX_WRITTEN: Final = 4


def breakpoint_of(item: object) -> oa.PromptCacheBreakpoint | None:
    """The last ``prompt_cache_breakpoint`` on the item's content blocks (a message's ``content``, a tool
    output's ``output``): the breakpoint sits at the item's end, the granularity at which the mock renders
    an item's text."""
    found: oa.PromptCacheBreakpoint | None = None
    for name in ("content", "output"):
        parts = getattr(item, name, None)
        if isinstance(parts, list):
            for part in parts:
                found = getattr(part, "prompt_cache_breakpoint", None) or found
    return found


def written_breakpoints(
    options: oa.PromptCacheOptions | None, marks: list[tuple[int, oa.PromptCacheBreakpoint]]
) -> list[tuple[int | None, str]]:
    """The breakpoints the request writes, as ``(end, ttl)``: ``end`` the prompt position where an explicit
    one ends (``marks``, in prompt order), None for implicit mode's managed breakpoint at the prompt's end
    (past every explicit one: the whole prompt, and the turn's output for the sequence's next turn); ``ttl``
    its own, else the request's, else 30m. Implicit mode writes its own and the latest three explicit
    ones; explicit mode the latest four, none at all without one."""
    request_ttl = (options.ttl if options is not None else None) or DEFAULT_TTL
    explicit = options is not None and options.mode == "explicit"
    kept = marks[-MAX_WRITTEN:] if explicit else marks[-(MAX_WRITTEN - 1) :]
    written: list[tuple[int | None, str]] = [(end, mark.ttl or request_ttl) for end, mark in kept]
    if not explicit:
        written.append((None, request_ttl))
    return written


def diagnose(current: Response, compared: Response | None, first: TurnReport, compacted: bool) -> Diagnostics:
    """Compare the current response's first turn with the compared (earlier) response. A miss is what the
    mock GPU had: its cached tokens below the compared prompt's reusable prefix (its full blocks, at most
    the current prompt's last recomputed token); its reason is the first keyed setting that differs,
    else ``unavailable`` when the GPU found the prefix expired, else ``context_compacted`` when the input
    carries a compaction item, else ``input_changed``."""
    if compared is None:
        return ComparisonResponseNotFound()
    turns = compared.lab.turns if compared.lab is not None else []
    if not turns or first.block_size == 0:
        return Unavailable()  # nothing ran for it, or the engine does not report its blocks
    bs = first.block_size
    reusable = min(turns[-1].prompt_tokens, first.prompt_tokens - 1) // bs * bs
    missed = reusable - first.cached_tokens
    if missed <= 0:
        return CacheHit()
    changed = [reason for reason, get in KEY_INPUTS if get(current) != get(compared)]
    if not changed and first.expired_tokens:
        # The GPU found the prefix stored but past its lifetime: nothing in the request caused the miss,
        # and none of the nine reasons says so (docs/protocol.md, "Prompt caching", "Lifetimes").
        return Unavailable()
    reason: MissReason = changed[0] if changed else "context_compacted" if compacted else "input_changed"
    return CacheMiss(cache_missed_tokens=missed, reason=reason, comparison_reusable_tokens=reusable)


def write_rate(model: str) -> float:
    """What one written token costs in uncached input tokens, for ``model`` (``gpt-5.6`` and later: 1.25)."""
    name = model.removeprefix("gpt-")
    head = name.split("-", 1)[0].split(".")
    if name == model or not 1 <= len(head) <= 2 or not all(part.isdigit() for part in head):
        return 1.0
    family = (int(head[0]), int(head[1]) if len(head) == 2 else 0)
    return WRITE_RATE if family >= WRITE_RATE_FROM else 1.0


def billed_input(
    model: str, input_tokens: int, cached_tokens: int, write_tokens: int, write_12h_tokens: int = 0
) -> float:
    """Input tokens at the uncached rate the response is billed for, cached reads apart (their own
    discount is the price list's): written tokens at their lifetime's rate (``WRITE_RATE_BY_TTL`` times
    ``write_rate``), the rest at 1. ``write_12h_tokens`` is the part of ``write_tokens`` written for 12 h."""
    rate = write_rate(model)
    return (
        (input_tokens - cached_tokens - write_tokens)
        + (write_tokens - write_12h_tokens) * rate * WRITE_RATE_BY_TTL["30m"]
        + write_12h_tokens * rate * WRITE_RATE_BY_TTL["12h"]
    )
