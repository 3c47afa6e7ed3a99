"""Token ids → text deltas: the memoised fast path says exactly what the incremental UTF-8 decoder says,
delta by delta, including characters split over several tokens."""

from __future__ import annotations

import codecs

import pytest

from sampler.tokens import TextStream, Tokenizer

TEXTS = {
    "ascii": "plain ASCII, the code and then the test",
    "latin": "naïve café — “quoted” ünïcödé",
    "emoji": "emoji 🙂🚀👩‍💻 and flags 🇫🇷🇯🇵 between words",
    "cjk": "日本語のテキストと中文文本, 한국어",
    "astral": "mixed: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math, ™ ®, \u0301 combining",
}


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_deltas_are_the_decoders_and_join_to_the_text(text: str) -> None:
    tokenizer = Tokenizer()
    ids = tokenizer.model_tokens(text)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    expected = [decoder.decode(tokenizer.piece(token)) for token in ids] + [decoder.decode(b"", final=True)]
    for _ in range(2):  # the later rounds run on the memo
        stream = TextStream(tokenizer)
        got = [stream.push(token) for token in ids] + [stream.flush()]
        assert got == expected
        assert "".join(got) == text


def test_some_tokens_are_not_whole_characters() -> None:
    tokenizer = Tokenizer()
    ids = tokenizer.model_tokens(TEXTS["emoji"] + TEXTS["astral"])
    assert any(tokenizer.text(token) is None for token in ids)  # the split path is exercised above
    assert tokenizer.text(ids[0]) == tokenizer.piece(ids[0]).decode()
