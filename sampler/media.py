"""What images and files cost in the model's context, as OpenAI documents it, and the token ids they take.

Images (the vision guide, "Calculating costs", platform.openai.com/docs/guides/vision#calculating-costs,
GPT-4o / o-series family): ``detail: low`` costs 85 tokens; otherwise the image is scaled to fit 2048 x 2048,
then so that its shortest side is 768 px, and each 512 px tile covering it costs 170 tokens, plus 85. The
guide's own examples: 1024 x 1024 → 765 tokens, 2048 x 4096 → 1105. ``auto`` and ``original`` are counted as
``high``. The size is read from the image's own header (PNG, JPEG, GIF, WebP) when the image is inline
(a ``data:`` URL or base64); the lab fetches nothing, so a remote URL or a ``file_id`` whose size it cannot
know is counted at the low-detail cost.

Files (the file inputs guide, developers.openai.com/api/docs/guides/file-inputs): a PDF puts "both the
extracted text and an image of each page" into the context; other files their text only. Here: a non-PDF
file's bytes decoded as UTF-8 are its text; a PDF's text is the string operands of its ``Tj``/``TJ`` text
operators in uncompressed content streams (no PDF library: compressed streams contribute no text), and each
page (``/Type /Page`` objects) is counted as a high-detail image of a US-letter page rendered 1024 px wide
(1024 x 1325 → 765 tokens; the guide does not say at what size pages are rendered). A ``file_id`` or a
``file_url`` is not fetched: its name or URL is its only text.

The ids an image or a page takes are derived from a hash of its bytes (or URL): the same image gives the
same ids in every transport, so it renders identically and the prefix cache matches; they are never decoded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
import struct

LOW_DETAIL_TOKENS = 85
TILE_TOKENS = 170
PAGE_SIZE = (1024, 1325)  # a US-letter page (8.5 x 11 in) rendered 1024 px wide
VOCAB = 100_000  # ids are drawn below cl100k's special tokens


def decode_data(url_or_b64: str) -> bytes | None:
    """The bytes of a ``data:...;base64,`` URL or of bare base64; None for a remote URL or bad base64."""
    text = url_or_b64
    if text.startswith("data:"):
        head, sep, text = text.partition(",")
        if not sep or ";base64" not in head:
            return None
    elif text.startswith(("http://", "https://")):
        return None
    try:
        return base64.b64decode(text, validate=False)
    except (binascii.Error, ValueError):
        return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG, JPEG, GIF or WebP header; None when the format is not one of those."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return width, height
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 < len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        length = struct.unpack(">H", data[at + 2 : at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start-of-frame segment
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def image_tokens(size: tuple[int, int] | None, detail: str | None) -> int:
    """The guide's tile formula (module docstring)."""
    if detail == "low" or size is None:
        return LOW_DETAIL_TOKENS
    width, height = (float(max(1, side)) for side in size)
    scale = min(1.0, 2048 / max(width, height))
    width, height = width * scale, height * scale
    scale = min(1.0, 768 / min(width, height))
    width, height = width * scale, height * scale
    return TILE_TOKENS * math.ceil(width / 512) * math.ceil(height / 512) + LOW_DETAIL_TOKENS


_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_TEXT_OP = re.compile(rb"\((?P<s>(?:[^()\\]|\\.)*)\)\s*Tj|\[(?P<a>[^\]]*)\]\s*TJ")
_STRING = re.compile(rb"\(((?:[^()\\]|\\.)*)\)")


def pdf_pages_and_text(data: bytes) -> tuple[int, str]:
    pages = len(_PAGE.findall(data))
    parts: list[bytes] = []
    for match in _TEXT_OP.finditer(data):
        if match.group("s") is not None:
            parts.append(match.group("s"))
        else:
            parts.extend(_STRING.findall(match.group("a")))
    return pages, b" ".join(parts).decode("latin-1")


def page_tokens() -> int:
    return image_tokens(PAGE_SIZE, "high")


def media_ids(key: bytes, count: int) -> list[int]:
    """``count`` token ids standing for the media identified by ``key`` (its bytes or its URL)."""
    ids: list[int] = []
    block = 0
    while len(ids) < count:
        digest = hashlib.sha256(key + block.to_bytes(4, "big")).digest()
        ids.extend(int.from_bytes(digest[i : i + 4], "big") % VOCAB for i in range(0, 32, 4))
        block += 1
    return ids[:count]
