"""Hosted tools: services the sampling loop calls itself, with no round-trip to the client.

``web_search`` is a real in-process search over a small shipped corpus (BM25 over title and text), so the
hosted case does real work of the same shape as the local one: the loop hands calls to a service and
awaits its result. The local case swaps the service for the client (``Suspend`` in the loop).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Doc:
    title: str
    url: str
    text: str


class WebSearch:
    name = "web_search"

    def __init__(self, docs: list[Doc] | None = None, k1: float = 1.5, b: float = 0.75) -> None:
        self.docs = docs if docs is not None else load_corpus()
        self._tf = [Counter(_WORD.findall(f"{d.title} {d.text}".lower())) for d in self.docs]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avg = sum(self._len) / max(1, len(self._len))
        df: Counter[str] = Counter()
        for tf in self._tf:
            df.update(tf.keys())
        n = len(self.docs)
        self._idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self._k1, self._b = k1, b
        self.queries = 0

    def search(self, query: str, top_k: int = 3) -> list[dict[str, str]]:
        """The ``top_k`` best documents as Responses-API-style sources (title, url, snippet)."""
        self.queries += 1
        terms = _WORD.findall(query.lower())
        scored: list[tuple[float, int]] = []
        for index, tf in enumerate(self._tf):
            norm = self._k1 * (1 - self._b + self._b * self._len[index] / self._avg)
            score = sum(
                self._idf.get(t, 0.0) * tf[t] * (self._k1 + 1) / (tf[t] + norm) for t in terms if t in tf
            )
            if score > 0:
                scored.append((score, index))
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        return [
            {
                "type": "url",
                "title": self.docs[i].title,
                "url": self.docs[i].url,
                "snippet": self.docs[i].text,
            }
            for _, i in scored[:top_k]
        ]


def load_corpus() -> list[Doc]:
    raw = (Path(__file__).parent / "corpus" / "docs.json").read_text(encoding="utf-8")
    return [Doc(**entry) for entry in json.loads(raw)]


def query_of(arguments: str) -> str:
    """A hosted call's query: ``{"query": ...}`` or, leniently, the raw argument text."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    query = value.get("query") if isinstance(value, dict) else None
    if isinstance(query, str):
        return query
    return arguments
