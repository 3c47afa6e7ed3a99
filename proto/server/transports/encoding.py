"""Compressed request bodies: ``Content-Encoding: gzip`` and ``zstd`` on ``POST /v1/responses``.

Clients compress large bodies (Codex sends zstd; HTTP libraries gzip). The body is decoded in the order
its encodings were applied (RFC 9110 §8.4: listed in application order, so undone last to first), and
the size limit (``--max-frame-bytes``) applies to what comes out, not only to what came in: a small bomb
that inflates past the limit is refused ``message_too_large`` after reading at most limit + 1 bytes of
output. A stream that does not decode is ``invalid_encoding`` (400); an encoding we do not speak is
``unsupported_encoding`` (415, as RFC 9110 §15.5.16 says for an unsupported content coding).

zstd is python-zstandard (the binding of the reference libzstd); gzip is the stdlib's zlib. Decoding runs
on a worker thread past ``INLINE_BYTES`` of input, so a large body does not hold the event loop.
"""

from __future__ import annotations

import asyncio
import io
import zlib

import zstandard

from proto.core.errors import ClientError

INLINE_BYTES = 256 * 1024
SUPPORTED = ("gzip", "x-gzip", "zstd", "deflate", "identity")


def codings(header: str | None) -> list[str]:
    """The codings of a ``Content-Encoding`` header, in the order they were applied."""
    if not header:
        return []
    found = [part.strip().lower() for part in header.split(",") if part.strip()]
    for coding in found:
        if coding not in SUPPORTED:
            raise ClientError(
                "unsupported_encoding", f"Content-Encoding {coding!r} is not supported (gzip, zstd, deflate)"
            )
    return [coding for coding in found if coding != "identity"]


async def decode(body: bytes, header: str | None, limit: int) -> bytes:
    applied = codings(header)
    if not applied:
        return body
    if len(body) <= INLINE_BYTES:
        return _undo(body, applied, limit)
    return await asyncio.to_thread(_undo, body, applied, limit)


def _undo(body: bytes, applied: list[str], limit: int) -> bytes:
    for coding in reversed(applied):
        body = _zstd(body, limit) if coding == "zstd" else _zlib(body, coding, limit)
    return body


def _zlib(body: bytes, coding: str, limit: int) -> bytes:
    # wbits: 16 + MAX_WBITS reads a gzip member; MAX_WBITS a zlib stream (what "deflate" means in HTTP).
    wbits = 16 + zlib.MAX_WBITS if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ClientError("invalid_encoding", f"the {coding} body does not decode: {exc}") from None
    _check_size(out, limit)
    if not inflater.eof or inflater.unused_data:
        raise ClientError("invalid_encoding", f"the {coding} body is truncated or has trailing bytes")
    return out


def _zstd(body: bytes, limit: int) -> bytes:
    # The streaming reader bounds the output (a frame header may claim any content size: the one-shot
    # API would allocate it); it returns short, silently, on a truncated frame, so another read, frame by
    # frame, whose output is bounded by the first, checks that every frame ends.
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body), read_across_frames=True) as reader:
            out = reader.read(limit + 1)
        _check_size(out, limit)
        rest = body
        while rest:
            frame = zstandard.ZstdDecompressor().decompressobj()
            frame.decompress(rest)
            if not frame.eof:
                raise ClientError("invalid_encoding", "the zstd body is truncated")
            rest = frame.unused_data
    except zstandard.ZstdError as exc:
        raise ClientError("invalid_encoding", f"the zstd body does not decode: {exc}") from None
    return out


def _check_size(out: bytes, limit: int) -> None:
    if len(out) > limit:
        raise ClientError(
            "message_too_large", f"the decoded request body exceeds {limit} bytes (--max-frame-bytes)"
        )
