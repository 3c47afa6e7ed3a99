"""Large inputs are tokenized a slice at a time on the loop (``sampler.tokens.slices``): the pieces' ids,
concatenated, must be the whole text's ids, or a large input would cost a different token count than the
same text sent small — and the long-lived response's appended ids would differ from HTTP's re-rendering."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.core.items import FunctionCallOutput, Message
from proto.core.work import WorkCounters
from sampler.tokens import RUN_CHARS, SLICE_CHARS, Conversation, Tokenizer, _encoding, prepared, slices

ROOT = Path(__file__).resolve().parent.parent
ENC = _encoding()


def sliced_ids(text: str, size: int) -> list[int]:
    """Cut only where it is safe (no forced cut)."""
    ids: list[int] = []
    for start, end in slices(text, size, reach=None):
        ids.extend(ENC.encode_ordinary(text[start:end]))
    return ids


def test_slices_cover_the_text_in_order_and_each_but_the_last_is_at_least_the_size() -> None:
    text = (ROOT / "sampler" / "tokens.py").read_text()
    pieces = list(slices(text, 500))
    assert len(pieces) > 10
    assert pieces[0][0] == 0 and pieces[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert all(end - start >= 500 for start, end in pieces[:-1])


def test_sliced_ids_equal_whole_ids_on_the_repos_own_code_and_notes() -> None:
    texts = [p.read_text() for p in sorted((ROOT / "proto").rglob("*.py"))[:40]] + [
        (ROOT / "NOTES.md").read_text()
    ]
    whole = "\n".join(texts)
    for size in (64, 1000, SLICE_CHARS):
        assert sliced_ids(whole, size) == ENC.encode_ordinary(whole), size


def test_sliced_ids_equal_whole_ids_on_minified_json_and_text_without_newlines() -> None:
    json_text = '{"path":"src/a.py","lines":[' + ",".join(f'"l{i}:x=y+{i}"' for i in range(5000)) + "]}"
    prose = " ".join(f"word{i % 7}" if i % 3 else "the" for i in range(20000))
    for text in (json_text, prose, "a" * 50_000, "é" * 50_000 + "b"):
        assert sliced_ids(text, 256) == ENC.encode_ordinary(text)


# Letters, digits, ASCII and non-ASCII punctuation, apostrophes (contractions), every kind of space and
# newline, combining marks and non-Latin scripts: the pattern's alternatives and their boundaries.
ALPHABET = st.sampled_from(list("abcXYZ09'’ \t\n\r\n\u00a0\u3000.,;:-_{}()[]\"/\\+*#éßΩжこ漢\u0301😀\x00"))


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(ALPHABET, min_size=0, max_size=400).map("".join), st.integers(min_value=1, max_value=40))
def test_sliced_ids_equal_whole_ids_on_random_text(text: str, size: int) -> None:
    assert sliced_ids(text, size) == ENC.encode_ordinary(text)


def test_prepare_yields_to_the_loop_between_slices_and_encode_takes_its_ids_counted_once() -> None:
    # The project's own code: prose, identifiers and punctuation, far longer than eight slices.
    text = "".join(path.read_text() for path in sorted((ROOT / "proto").rglob("*.py")))[: 8 * SLICE_CHARS]
    tokenizer = Tokenizer()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def main() -> dict[str, list[int]]:
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        try:
            return await tokenizer.prepare([text, text])
        finally:
            task.cancel()

    ready = asyncio.run(main())
    assert ticks >= 6  # the loop ran between slices (~8 of them)
    assert ready == {text: ENC.encode_ordinary(text)}
    items = [Message(role="user", content=text), FunctionCallOutput(call_id="c", output=text)]
    direct, taken = WorkCounters(), WorkCounters()
    a = Conversation(tokenizer, direct)
    a.add_input(items)
    b = Conversation(tokenizer, taken)
    with prepared(ready):
        b.add_input(items)
    assert list(a.log.ids) == list(b.log.ids)
    assert (
        (taken.tokenize_calls, taken.tokens_tokenized)
        == (direct.tokenize_calls, direct.tokens_tokenized)
        == (2, 2 * len(ready[text]))
    )


# Texts with no safe cut point for thousands of characters: one word, punctuation, spaces, digits, CJK and
# emoji without a space, and a long word inside prose.
UNCUT = {
    "word": "a" * 20_000,
    "letters": "".join(chr(97 + (i * 7) % 26) for i in range(20_000)),
    "punctuation": "!#$%&*+-/<=>?@^_|~" * 1_000,
    "spaces": " " * 20_000,
    "digits": "".join(str(i * 7 % 10) for i in range(20_000)),
    "cjk": "".join(chr(0x4E00 + i * 37 % 20_000) for i in range(20_000)),
    "emoji": "😀" * 20_000,
    "a long word in prose": "Some prose. " * 500 + "x" * 9_000 + " and more prose." * 500,
}


def test_no_slice_passes_its_bound_whatever_the_text() -> None:
    for name, text in UNCUT.items():
        pieces = list(slices(text))
        assert pieces[0][0] == 0 and pieces[-1][1] == len(text), name
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces)), name
        assert max(end - start for start, end in pieces) <= SLICE_CHARS + RUN_CHARS, name


def test_a_text_has_the_same_ids_on_every_path_and_digits_keep_their_pieces() -> None:
    tokenizer = Tokenizer()
    for name, text in UNCUT.items():
        ready = asyncio.run(tokenizer.prepare([text]))
        assert ready[text] == tokenizer.ids(text), name  # prepare (large inputs) and encode (small) agree
    # Forced cuts in a run of digits fall where a 3-digit piece ends: the whole text's ids.
    assert tokenizer.ids(UNCUT["digits"]) == ENC.encode_ordinary(UNCUT["digits"])
