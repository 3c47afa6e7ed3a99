"""Compressed request bodies on ``POST /v1/responses`` (docs/protocol.md, "Compressed bodies"): gzip and zstd
accepted and
answered as the plain body would be; a bad stream, an unknown coding and a body that inflates past the
limit each get their typed error, and the server serves on."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import zstandard
from helpers import MODEL, TOOLS, running

from proto.core.errors import ERROR_CODES
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server or a process

LIMIT = 2**20
BODY = {"model": MODEL, "input": 'Go.\n!call grep {"q": 1}\n!say done', "tools": TOOLS}


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running(max_frame_bytes=LIMIT) as server:
        yield server


@pytest.fixture
async def http(srv: ThreadedServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as client:
        yield client


def raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


CODERS = {
    "gzip": gzip.compress,
    "zstd": zstandard.ZstdCompressor().compress,
    "deflate": zlib.compress,
    "gzip, zstd": lambda data: zstandard.ZstdCompressor().compress(gzip.compress(data)),
}


async def post(http: httpx.AsyncClient, content: bytes, encoding: str | None) -> httpx.Response:
    headers = {"content-type": "application/json", **({"content-encoding": encoding} if encoding else {})}
    return await http.post("/v1/responses", content=content, headers=headers)


@pytest.mark.parametrize("encoding", list(CODERS))
async def test_compressed_body_is_the_body(http: httpx.AsyncClient, encoding: str) -> None:
    plain = (await post(http, raw(BODY), None)).json()
    reply = await post(http, CODERS[encoding](raw(BODY)), encoding)
    assert reply.status_code == 200, reply.text
    response = reply.json()
    assert (
        [i["type"] for i in response["output"]] == [i["type"] for i in plain["output"]] == ["function_call"]
    )
    assert response["usage"]["input_tokens"] == plain["usage"]["input_tokens"]


async def test_compressed_stream(http: httpx.AsyncClient) -> None:
    content = zstandard.ZstdCompressor().compress(raw({**BODY, "stream": True}))
    headers = {"content-type": "application/json", "content-encoding": "zstd"}
    async with http.stream("POST", "/v1/responses", content=content, headers=headers) as reply:
        kinds = [
            json.loads(line[6:])["type"] async for line in reply.aiter_lines() if line.startswith("data: ")
        ]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"


@pytest.mark.parametrize(
    ("content", "encoding", "code"),
    [
        (b"not gzip at all", "gzip", "invalid_encoding"),
        (gzip.compress(raw(BODY))[:-6], "gzip", "invalid_encoding"),
        (b"\x28\xb5\x2f\xfd garbage", "zstd", "invalid_encoding"),
        (zstandard.ZstdCompressor().compress(raw(BODY))[:-3], "zstd", "invalid_encoding"),
        (raw(BODY), "br", "unsupported_encoding"),
        # a bomb: far under the limit on the wire, far over it decoded
        (
            zstandard.ZstdCompressor().compress(raw({**BODY, "instructions": "a" * (8 * LIMIT)})),
            "zstd",
            "message_too_large",
        ),
        (gzip.compress(raw({**BODY, "instructions": "a" * (8 * LIMIT)})), "gzip", "message_too_large"),
        (zstandard.ZstdCompressor().compress(b"{oops"), "zstd", "invalid_json"),
    ],
    ids=[
        "gzip-garbage",
        "gzip-truncated",
        "zstd-garbage",
        "zstd-truncated",
        "brotli",
        "zstd-bomb",
        "gzip-bomb",
        "zstd-bad-json",
    ],
)
async def test_bad_encoding_is_typed(
    http: httpx.AsyncClient, content: bytes, encoding: str, code: str
) -> None:
    assert len(content) < LIMIT
    reply = await post(http, content, encoding)
    assert reply.status_code == ERROR_CODES[code][0], reply.text
    assert reply.json()["error"]["code"] == code
    again = await post(http, gzip.compress(raw(BODY)), "gzip")  # the server serves on
    assert again.status_code == 200
