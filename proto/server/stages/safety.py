"""The safety stage: a deterministic scanner for leaked secrets and prompt-injection phrases.

It stands in for the classifiers the seed names as per-turn work, so its cost must follow the text it is
given: every call reads every character of it (a lowercase copy, then one Aho–Corasick pass that finds
every rule's trigger words at once, a regex tried at each hit). The transports differ only in *what* they hand
it: HTTP
re-scans the whole history each turn, GA WebSocket and the long-lived response scan each new item once.

Outcome policy (``mode``):
- ``"annotate"`` (default): the response goes ahead; the caller reports the flag (``annotation()`` gives
  OpenAI-shaped ``metadata`` strings: rule names only).
- ``"block"``: the caller refuses the turn with the ``content_policy`` error (``enforce()`` raises it).
- ``"off"``: nothing is read, nothing is counted.

Findings keep offsets, never the matched text, so a result can be logged or returned to a client without
repeating the secret. Limits: regexes and one entropy heuristic, not a trained classifier; a secret split
across two items is not seen (each item is scanned on its own, as the real classifiers see messages).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import ahocorasick

from proto.core.errors import ClientError

Mode = Literal["annotate", "block", "off"]
MODES: tuple[Mode, ...] = ("annotate", "block", "off")


@dataclass(frozen=True)
class Finding:
    kind: str  # "secret" | "prompt_injection"
    rule: str
    start: int  # offsets into the text at ``text_index`` of the scan (0 for ``scan``)
    end: int
    text_index: int = 0


@dataclass(frozen=True)
class ScanResult:
    findings: tuple[Finding, ...]
    chars_scanned: int

    @property
    def flagged(self) -> bool:
        return bool(self.findings)

    @property
    def rules(self) -> tuple[str, ...]:
        """Distinct rule names, in first-seen order."""
        return tuple(dict.fromkeys(f.rule for f in self.findings))


@dataclass(frozen=True)
class _Rule:
    kind: str
    name: str
    # Every match starts with one of these (lowercase) literals. One Aho–Corasick pass over the text
    # (pyahocorasick, in C) finds every rule's triggers at once and the regex is only tried there: ~8x
    # faster on mixed prose and code than a regex attempt at every position
    # (docs/decisions/0003-aho-corasick-safety-scan.md),
    # and one pass instead of one ``str.find`` pass per trigger (39 of them).
    triggers: tuple[str, ...]
    regex: re.Pattern[str]


def _rule(kind: str, name: str, triggers: str, pattern: str, flags: int = 0) -> _Rule:
    return _Rule(kind, name, tuple(triggers.split()), re.compile(pattern, flags))


# Lookarounds instead of \b where the key alphabet holds "-" or "_", so a key glued to an identifier is
# not split midway.
_EDGE = r"(?<![A-Za-z0-9_\-])"
_TAIL = r"(?![A-Za-z0-9_\-])"
_SECRET_RULES = (
    _rule(
        "secret",
        "private_key_block",
        "-----begin",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[\s\S]{0,16384}?-----END (?:[A-Z0-9]+ )*PRIVATE "
        r"KEY-----)?",
    ),
    # Real keys are random base62, so they hold a digit; "sk-learn-compatible-estimators" does not.
    _rule(
        "secret",
        "openai_api_key",
        "sk-",
        _EDGE + r"sk-(?=[A-Za-z_\-]*\d)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}" + _TAIL,
    ),
    _rule("secret", "stripe_secret_key", "sk_live_ rk_live_", _EDGE + r"[sr]k_live_[A-Za-z0-9]{20,}" + _TAIL),
    _rule("secret", "aws_access_key", "akia asia", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    _rule(
        "secret",
        "github_token",
        "ghp_ gho_ ghu_ ghs_ ghr_ github_pat_",
        _EDGE + r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})" + _TAIL,
    ),
    _rule("secret", "slack_token", "xox", _EDGE + r"xox[abposr]-[A-Za-z0-9\-]{10,}" + _TAIL),
    _rule("secret", "google_api_key", "aiza", _EDGE + r"AIza[A-Za-z0-9_\-]{35}" + _TAIL),
    _rule(
        "secret",
        "jwt",
        "eyj",
        _EDGE + r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}" + _TAIL,
    ),
)

# A long token assigned to (or quoted after) a name that says it is a credential: `api_key = "..."`,
# `"password": "..."`, `SECRET_TOKEN=...`, `Authorization: Bearer ...`. The value is only flagged if it
# also looks random (entropy and character mix below), which keeps `token = tokenizer.encode(text)` and
# `max_tokens: 2048` quiet.
_GENERIC_RULE = _rule(
    "secret",
    "generic_high_entropy_secret",
    "key secret token passw pwd auth credential",
    r"(?:key|secret|token|passw(?:or)?d|pwd|auth|credential)s?[A-Za-z0-9_]{0,20}[\"']?\s*(?::|=|:=|=>)\s*"
    r"[\"'`]?(?:bearer\s+|basic\s+)?(?P<value>[A-Za-z0-9+/_\-=]{20,})",
    re.IGNORECASE,
)
_ENTROPY_BITS_PER_CHAR = 3.5
_MIN_DIGITS = 2

# Curated injection phrases (after the public jailbreak corpora's most common openers). Written with
# `\s+` between words so padding with spaces/newlines does not evade them; matched case-insensitively.
_ANY = r"(?:all\s+|any\s+|the\s+|your\s+|everything\s+)*"
_PRIOR = r"(?:(?:previous|prior|above|earlier|preceding|former)\s+)"
_INJECTION_RULES = tuple(
    _rule("prompt_injection", name, triggers, pattern, re.IGNORECASE)
    for name, triggers, pattern in (
        (
            "ignore_previous_instructions",
            "ignore",
            rf"\bignore\s+{_ANY}{_PRIOR}(?:instructions?|directions|prompts?|rules)\b",
        ),
        (
            "disregard_instructions",
            "disregard",
            rf"\bdisregard\s+{_ANY}{_PRIOR}?(?:instructions?|system\s+prompt|rules|guidelines)\b",
        ),
        ("forget_instructions", "forget", rf"\bforget\s+{_ANY}{_PRIOR}?(?:instructions?|rules|guidelines)\b"),
        (
            "reveal_system_prompt",
            "reveal print show repeat output leak tell",
            r"\b(?:reveal|print|show|repeat|output|leak|tell\s+me)\s+(?:me\s+)?(?:your|the)\s+"
            r"(?:(?:full|entire|original|hidden|secret)\s+)?"
            r"(?:system\s+prompt|system\s+message|hidden\s+instructions|initial\s+instructions)\b",
        ),
        (
            "jailbreak_persona",
            "you do",
            r"\byou\s+are\s+now\s+(?:DAN|in\s+developer\s+mode|jailbroken|unrestricted|unfiltered)\b"
            r"|\bdo\s+anything\s+now\b",
        ),
        (
            "override_safety",
            "bypass disable ignore override",
            rf"\b(?:bypass|disable|ignore|override)\s+{_ANY}"
            r"(?:safety|content|moderation)\s+(?:filters?|guidelines|policies|policy|restrictions|rules)\b",
        ),
        ("chat_template_injection", "<|", r"<\|(?:im_start|im_end|system|endoftext)\|>"),
    )
)


def _automaton(rules: Iterable[_Rule]) -> ahocorasick.Automaton:
    automaton = ahocorasick.Automaton()
    for trigger in {t for rule in rules for t in rule.triggers}:
        automaton.add_word(trigger, trigger)
    automaton.make_automaton()
    return automaton


# The automaton walks a text in C without releasing the GIL: a chunk at a time, so the loop's thread gets
# it back between chunks (docs/decisions/0015-bounded-work-on-the-loop.md) while a large input is scanned
# on a worker thread.
_HIT_CHUNK = 64 * 1024


def _hits(lowered: str) -> dict[str, list[int]]:
    """Start offsets of every trigger in ``lowered``, overlapping ones included, ascending per trigger."""
    hits: dict[str, list[int]] = defaultdict(list)
    n = len(lowered)
    for chunk in range(0, n, _HIT_CHUNK):
        # A trigger starting in this chunk ends within it or the next _LONGEST - 1 characters. A slice, not
        # iter's start and end: the automaton converts the whole string it is given, on every call.
        for end, trigger in _TRIGGERS.iter(lowered[chunk : chunk + _HIT_CHUNK + _LONGEST - 1]):
            start = end - len(trigger) + 1
            if start < _HIT_CHUNK:  # one starting later is the next chunk's
                hits[trigger].append(chunk + start)
    return hits


def _matches(rule: _Rule, text: str, hits: dict[str, list[int]] | None) -> Iterator[re.Match[str]]:
    if hits is None:  # lower() changed the length (rare scripts): offsets would not line up
        yield from rule.regex.finditer(text)
        return
    for trigger in rule.triggers:
        resume = 0  # after a match the next attempt starts past it (as a scan with str.find from its end)
        for at in hits.get(trigger, ()):
            if at < resume:
                continue
            m = rule.regex.match(text, at)
            if m is not None:
                yield m
            resume = m.end() if m is not None and m.end() > at else at + 1


_TRIGGERS = _automaton((*_SECRET_RULES, *_INJECTION_RULES, _GENERIC_RULE))
_LONGEST = max(len(t) for rule in (*_SECRET_RULES, *_INJECTION_RULES, _GENERIC_RULE) for t in rule.triggers)


def shannon_entropy(text: str) -> float:
    """Bits per character of ``text`` as a sample of its own character distribution."""
    n = len(text)
    if n == 0:
        return 0.0
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def _looks_random(value: str) -> bool:
    digits = sum(ch.isdigit() for ch in value)
    letters = sum(ch.isalpha() for ch in value)
    return digits >= _MIN_DIGITS and letters > 0 and shannon_entropy(value) >= _ENTROPY_BITS_PER_CHAR


def _find(text: str, index: int) -> list[Finding]:
    lowered = text.lower()
    hits = _hits(lowered) if len(lowered) == len(text) else None
    found = {
        Finding(rule.kind, rule.name, m.start(), m.end(), index)
        for rule in (*_SECRET_RULES, *_INJECTION_RULES)
        for m in _matches(rule, text, hits)
    }
    known = [(f.start, f.end) for f in found if f.kind == "secret"]
    for m in _matches(_GENERIC_RULE, text, hits):
        start, end = m.span("value")
        # A known format already reported under its own name wins over the generic rule.
        if any(s < end and start < e for s, e in known) or not _looks_random(m.group("value")):
            continue
        found.add(Finding("secret", _GENERIC_RULE.name, start, end, index))
    return sorted(found, key=lambda f: (f.start, f.end, f.rule))


class SafetyScanner:
    """One per server; safe to share across tasks and threads (counters are updated under a lock)."""

    def __init__(self, mode: Mode = "annotate") -> None:
        if mode not in MODES:
            raise ValueError(f"safety mode must be one of {MODES}, not {mode!r}")
        self.mode: Mode = mode
        self.chars_scanned = 0
        self.texts_scanned = 0
        self.findings = 0
        self._lock = threading.Lock()

    def scan(self, text: str) -> ScanResult:
        return self.scan_many((text,))

    def scan_many(self, texts: Iterable[str]) -> ScanResult:
        """Scan each text on its own; findings carry the index of their text in ``texts``."""
        if self.mode == "off":
            return ScanResult((), 0)
        findings: list[Finding] = []
        chars = count = 0
        for index, text in enumerate(texts):
            findings.extend(_find(text, index))
            chars += len(text)
            count += 1
        with self._lock:
            self.chars_scanned += chars
            self.texts_scanned += count
            self.findings += len(findings)
        return ScanResult(tuple(findings), chars)

    def annotation(self, result: ScanResult) -> dict[str, str]:
        """Response ``metadata`` entries for a flagged result (rule names only; empty when clean)."""
        if not result.flagged:
            return {}
        kinds = sorted({f.kind for f in result.findings})
        return {"safety_flagged": ",".join(kinds), "safety_rules": ",".join(result.rules)[:512]}

    def enforce(self, result: ScanResult) -> ScanResult:
        """Raise the ``content_policy`` error when blocking a flagged result; otherwise hand it back."""
        if self.mode == "block" and result.flagged:
            raise ClientError(
                "content_policy",
                f"The input was refused by the safety policy (rules: {', '.join(result.rules)}).",
                param="input",
            )
        return result
