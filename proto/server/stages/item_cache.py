"""``http-cached``: the seed's first step, a server-side cache of what the pipeline made of an item's text.

Before WebSockets, the seed's sprint kept one independent HTTP request per turn but cached across requests
the rendered tokens and the resolved model configuration, which cut hops and the safety classifier's work
(TTFT ≈ −45 %). This is that design on this server's pipeline: a client that sends the request header
``X-Responses-Lab-Cache: items`` re-sends its whole history as ``http`` does, and every item body the
server has already seen is neither scanned nor tokenized again.

* **Key**: (API key id, a 128-bit BLAKE2b digest of the body text). Content-keyed, so the same text hits in
  any conversation; scoped by key, so one tenant cannot time another's texts (a hit answers faster).
* **Value**: the body's token ids (``array('I')``, 4 bytes a token) and its safety findings.
* **Bound**: ``--item-cache-tokens`` token ids held in all (default 4 M ≈ 16 MiB of ids); least recently
  used entries go first. A text larger than the whole bound is processed and not kept.
* **Counted**: per request in ``response.lab.work`` (``item_cache_hits`` / ``item_cache_misses``: body
  segments whose scan and tokens came from the cache, or were made), summed on ``/metrics``
  (``responses_lab_work``), with the cache's size (``responses_lab_item_cache_*``).
* **Resolved model**: also kept per key, so only the first request of a key for a model resolves it (and
  pays ``--resolve-hop-ms``). The remote safety classifier (``--safety-hop-ms``) is called only when a
  request carries a text the cache has not seen (an agent's new tool output: every turn, in practice).

What stays per request, as in the seed: the HTTP request itself, decoding and validating the whole body,
rebuilding the conversation's token list, the store write. Nothing is shared with ``http``: a plain request
never reads or fills the cache.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proto.core.work import WorkCounters
from proto.server.stages.safety import Finding, SafetyScanner, ScanResult
from sampler.tokens import Tokenizer


@dataclass
class _Entry:
    findings: tuple[Finding, ...]  # text_index 0: this text's own
    ids: array[int] | None = None  # filled at tokenization (scanning comes first in the pipeline)


class ItemCache:
    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError("--item-cache-tokens must be >= 0")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[str, bytes], _Entry] = OrderedDict()
        self._models: dict[tuple[str, str], Any] = {}  # (scope, model) -> the resolved engine
        self.tokens = 0  # token ids held
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(scope: str, text: str) -> tuple[str, bytes]:
        return scope, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def scan(
        self, scanner: SafetyScanner, scope: str, texts: Sequence[str], work: WorkCounters
    ) -> tuple[ScanResult, bool]:
        """The findings of ``texts`` as one ``scan_many`` would report them; only unseen texts are scanned.
        Returns (result, whether any text was new: the remote classifier is needed)."""
        findings: list[Finding] = []
        fresh: list[tuple[int, str, tuple[str, bytes]]] = []
        for index, text in enumerate(texts):
            key = self.key(scope, text)
            entry = self._entries.get(key)
            if entry is None:
                fresh.append((index, text, key))
                continue
            self._entries.move_to_end(key)
            findings.extend(_reindex(f, index) for f in entry.findings)
        result = scanner.scan_many(text for _, text, _ in fresh)
        work.chars_scanned += result.chars_scanned
        for position, (index, _text, key) in enumerate(fresh):
            own = tuple(_reindex(f, 0) for f in result.findings if f.text_index == position)
            findings.extend(_reindex(f, index) for f in own)
            self._entries[key] = _Entry(own)
        findings.sort(key=lambda f: f.text_index)
        return ScanResult(tuple(findings), result.chars_scanned), bool(fresh)

    def tokenizer(self, base: Tokenizer, scope: str) -> CachedTokenizer:
        return CachedTokenizer(base, self, scope)

    def resolved(self, scope: str, model: str) -> Any:
        return self._models.get((scope, model))

    def remember_model(self, scope: str, model: str, engine: Any) -> None:
        if (
            len(self._models) > 4096
        ):  # model names are client-chosen but validated; keys are few: stay bounded
            self._models.clear()
        self._models[(scope, model)] = engine

    # ---------------------------------------------------------------------------------- internals
    def _ids(self, key: tuple[str, bytes]) -> array[int] | None:
        entry = self._entries.get(key)
        if entry is None or entry.ids is None:
            return None
        self._entries.move_to_end(key)
        return entry.ids

    def _store_ids(self, key: tuple[str, bytes], ids: list[int]) -> None:
        if len(ids) > self.max_tokens:
            return
        entry = self._entries.get(key)
        if (
            entry is None
        ):  # tokenized without a scan first (a hosted tool's result): findings unknown, not kept
            return
        if entry.ids is not None:
            return
        entry.ids = array("I", ids)
        self.tokens += len(ids)
        self._entries.move_to_end(key)
        while self.tokens > self.max_tokens and self._entries:
            _, old = self._entries.popitem(last=False)
            self.tokens -= len(old.ids) if old.ids is not None else 0
            self.evictions += 1


def _reindex(finding: Finding, index: int) -> Finding:
    return Finding(finding.kind, finding.rule, finding.start, finding.end, index)


class CachedTokenizer(Tokenizer):
    """The pipeline's tokenizer for one ``http-cached`` request: a body the cache holds is not tokenized."""

    def __init__(self, base: Tokenizer, cache: ItemCache, scope: str) -> None:
        # The base tokenizer's state, shared (not copied): its memos stay one, whatever it keeps.
        self.__dict__.update(base.__dict__)
        self._cache = cache
        self._scope = scope
        # Each body's cache key, once per request: a large body is asked about by ``prepare`` (``_holds``),
        # then ``encode``, then stored on a miss — one digest, not three.
        self._keys: dict[str, tuple[str, bytes]] = {}

    def _key(self, text: str) -> tuple[str, bytes]:
        key = self._keys.get(text)
        if key is None:
            key = self._keys[text] = ItemCache.key(self._scope, text)
        return key

    def _holds(self, text: str) -> bool:
        return self._cache._ids(self._key(text)) is not None

    def encode(self, text: str, work: WorkCounters) -> list[int]:
        key = self._key(text)
        cached = self._cache._ids(key)
        if cached is not None:
            self._cache.hits += 1
            work.item_cache_hits += 1
            return cached.tolist()
        ids = super().encode(text, work)
        self._cache.misses += 1
        work.item_cache_misses += 1
        self._cache._store_ids(key, ids)
        return ids
