"""The prefix cache is scoped by tenant (docs/mock-gpu.md, "Prefix cache per tenant"): a key sending
another key's prompt gets 0 cached tokens, so ``cached_tokens`` confirms nothing about what others sent;
the same key still gets its hits. In process and through the engine protocol's ``cache_salt``."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from helpers import GUARD, MODEL, SETTINGS, auth

from proto.processes import ChildEngine
from proto.server.serve import ThreadedServer
from sampler.gpu import MockGPU
from sampler.kvcache import salt_key
from sampler.models import MODELS

pytestmark = pytest.mark.process

KEY_A = "sk-tenant-a-0123456789abcdef"
KEY_B = "sk-tenant-b-fedcba9876543210"
BLOCK = 16  # the catalogue's block size


@contextlib.contextmanager
def keyed_server(engine: str = "") -> Iterator[ThreadedServer]:
    server = ThreadedServer(replace(SETTINGS, api_key=[KEY_A, KEY_B], engine=engine))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def cached(http: httpx.AsyncClient, key: str, text: str) -> tuple[int, int]:
    reply = await http.post(
        "/v1/responses", headers=auth(key), json={"model": MODEL, "input": text, "store": False}
    )
    assert reply.status_code == 200, reply.text
    (turn,) = reply.json()["lab"]["turns"]
    return turn["prompt_tokens"], reply.json()["usage"]["input_tokens_details"]["cached_tokens"]


async def assert_scoped_per_key(url: str) -> None:
    text = f"Ticket {uuid.uuid4().hex}. " + "Summarise the incident report and list who was paged. " * 20
    async with httpx.AsyncClient(base_url=url, timeout=GUARD) as http:
        prompt, first = await cached(http, KEY_A, text)
        assert prompt > 10 * BLOCK and first == 0
        full = (prompt - 1) // BLOCK * BLOCK  # every block but the one holding the last prompt token
        assert await cached(http, KEY_B, text) == (prompt, 0)  # A's prompt, sent by B: nothing to confirm
        assert await cached(http, KEY_A, text) == (prompt, full)  # A still hits its own
        assert await cached(http, KEY_B, text) == (prompt, full)  # and B its own, once it computed it


async def test_another_keys_prompt_gets_no_cached_tokens_in_process() -> None:
    with keyed_server() as srv:
        await assert_scoped_per_key(srv.http_url)


async def test_another_keys_prompt_gets_no_cached_tokens_through_the_engine_protocol() -> None:
    override = f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0"
    with ChildEngine(["--model-override", override]) as engine, keyed_server(engine.http_url) as srv:
        await assert_scoped_per_key(srv.http_url)


@pytest.mark.parametrize("salt", ["", "key_a"])
async def test_a_salt_moves_every_block_key_and_none_is_the_unsalted_chain(salt: str) -> None:
    """The engine side: a salt is the parent of the chain's first block, nothing else changes."""
    gpu = MockGPU(MODELS[MODEL])
    tokens = list(range(5 * BLOCK + 3))
    for other in ("", "key_b"):
        if other == salt:
            continue
        first, second = gpu.open(salt=salt), gpu.open(salt=other)
        try:
            assert [n async for n in first.run_turn(tokens, [1, 2])] and first.last_report is not None
            assert [n async for n in second.run_turn(tokens, [1, 2])] and second.last_report is not None
            assert second.last_report.cached_tokens == 0
        finally:
            first.close()
            second.close()
    again = gpu.open(salt=salt)
    try:
        assert [n async for n in again.run_turn(tokens, [1, 2])] and again.last_report is not None
        assert again.last_report.cached_tokens == 5 * BLOCK
    finally:
        again.close()
    assert salt_key("") == 0 and salt_key("key_a") != salt_key("key_b")
