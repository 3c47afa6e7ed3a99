"""Prompt caching as OpenAI reports and bills it (docs/protocol.md, "Prompt caching"), over a real server on
every transport: a client that changes one cache-keyed input at a time against a baseline response gets the
matching ``cache_miss`` reason, and only where the mock GPU's prefix cache really missed (its
``cached_tokens`` below the baseline's reusable prefix); an unchanged request is a ``cache_hit``; writes are
counted as the GPU stored them and the ledger keeps them; ``prewarm`` writes without output.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import MODEL, SLOW_MODEL, running, state, wait_for

from proto.client.ga import GaClient
from proto.client.http import HttpClient
from proto.client.longlived import LongLivedClient
from proto.core.caching import KEY_INPUTS, billed_input
from proto.processes import ChildEngine
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server

BLOCK = 16  # the mock models' prefix-cache block (sampler.models.ModelSpec.block_size)


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


async def create(srv: ThreadedServer, transport: str, body: dict[str, Any]) -> dict[str, Any]:
    """One response over ``transport``, to its terminal Response."""
    if transport == "json":
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as http:
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            return dict(reply.json())
    if transport == "sse":
        async with HttpClient(srv.http_url) as client:
            return await client.create({**body, "stream": True})
    if transport == "ga":
        async with GaClient(srv.url, ping_interval=None) as ga:
            return await ga.create(body, timeout=30)
    async with LongLivedClient(srv.url, ping_interval=None) as longlived:
        return dict((await longlived.rollout(body, {})).response)


def base(transport: str, **fields: Any) -> dict[str, Any]:
    """A prompt of many blocks whose opening (instructions) is this transport's own: each transport's
    baseline writes its prefix fresh."""
    instructions = f"You answer for the {transport} transport. " + " ".join(
        f"Rule {i}: keep every answer short and plain." for i in range(40)
    )
    return {
        "model": MODEL,
        "instructions": instructions,
        # a user message of several blocks: a tool list (rendered after the instructions) moves all of it
        "input": [{"role": "user", "content": "!say cached\n" + "Here is the question at length. " * 30}],
        "prompt_cache_key": "team-a",
        "store": True,
        **fields,
    }


def details(response: dict[str, Any]) -> tuple[int, int]:
    usage = response["usage"]["input_tokens_details"]
    return usage["cached_tokens"], usage["cache_write_tokens"]


# One change at a time, each to one cache-keyed input (proto.core.caching.KEY_INPUTS), and the reason the
# diagnostics must name for it.
CHANGES: dict[str, dict[str, Any]] = {
    "model_changed": {"model": SLOW_MODEL},
    "prompt_cache_key_changed": {"prompt_cache_key": "team-b"},
    "service_tier_changed": {"service_tier": "flex"},
    "tools_changed": {"tools": [{"type": "function", "name": "grep"}]},
    "text_format_changed": {"text": {"format": {"type": "json_object"}}},
    "reasoning_effort_changed": {"reasoning": {"effort": "high"}},
    "verbosity_changed": {"text": {"verbosity": "high"}},
    "input_changed": {"instructions": "Other rules, from the first token on, for the transport: "},
}

TRANSPORTS = ["json", "sse", "ga", "longlived"]


def test_every_keyed_input_has_a_change() -> None:
    assert set(CHANGES) == {reason for reason, _ in KEY_INPUTS} | {"input_changed"}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_one_change_at_a_time_names_the_miss_the_gpu_had(srv: ThreadedServer, transport: str) -> None:
    baseline = await create(srv, transport, base(transport, prompt_cache_options={"ttl": "30m"}))
    assert baseline["prompt_cache_options"] == {"mode": "implicit", "ttl": "30m"}
    assert baseline["prompt_cache_diagnostics"] is None  # no response named to compare with
    prompt = baseline["usage"]["input_tokens"]
    assert details(baseline) == (0, prompt // BLOCK * BLOCK)  # a fresh prefix: every full block written
    reusable = prompt // BLOCK * BLOCK  # the baseline's full blocks, as the next prompt can match them
    compare = {"prompt_cache_options": {"comparison_response_id": baseline["id"]}}

    same = await create(srv, transport, base(transport, **compare))
    assert same["prompt_cache_diagnostics"] == {"type": "cache_hit"}
    assert details(same) == (reusable, 0)

    for reason, change in CHANGES.items():
        if reason == "input_changed":  # this transport's own: another one may have written the first
            change = {"instructions": change["instructions"] + transport}
        changed = await create(srv, transport, {**base(transport, **compare), **change})
        cached, written = details(changed)
        # what of the baseline's prefix this prompt could have matched (its last token is always computed)
        could = min(prompt, changed["usage"]["input_tokens"] - 1) // BLOCK * BLOCK
        assert cached < could, (reason, cached)  # the GPU missed: the diagnostics may say so
        assert written > 0, reason
        assert changed["prompt_cache_diagnostics"] == {
            "type": "cache_miss",
            "reason": reason,
            "cache_missed_tokens": could - cached,
            "comparison_reusable_tokens": could,
        }, reason

    missing = await create(
        srv, transport, base(transport, prompt_cache_options={"comparison_response_id": "resp_none"})
    )
    assert missing["prompt_cache_diagnostics"] == {"type": "comparison_response_not_found"}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_previous_response_id_is_the_default_comparison(srv: ThreadedServer, transport: str) -> None:
    first = await create(srv, transport, base(transport + " chain"))
    follow = base(transport + " chain", previous_response_id=first["id"])
    follow["input"] = [{"role": "user", "content": "!say again"}]
    second = await create(srv, transport, follow)
    assert second["prompt_cache_diagnostics"] == {"type": "cache_hit"}
    assert details(second)[0] >= first["usage"]["input_tokens"] // BLOCK * BLOCK


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_prewarm_writes_without_output_and_is_read_after(srv: ThreadedServer, transport: str) -> None:
    warm = await create(srv, transport, base(transport + " warm", prompt_cache_options={"prewarm": True}))
    assert warm["status"] == "completed"
    assert warm["output"] == [] and warm["usage"]["output_tokens"] == 0
    prompt = warm["usage"]["input_tokens"]
    assert details(warm) == (0, prompt // BLOCK * BLOCK)
    real = await create(srv, transport, base(transport + " warm"))
    assert details(real) == (prompt // BLOCK * BLOCK, 0)
    assert real["output"]


async def test_the_ledger_bills_writes_at_their_rate(srv: ThreadedServer) -> None:
    response = await create(srv, "json", base("ledger"))
    cached, written = details(response)
    ledger = state(srv).pipeline.ledger
    await wait_for(lambda: ledger.get(response["id"]) is not None, "the usage row")
    row = ledger.get(response["id"])
    assert row is not None
    assert (row.cached_tokens, row.cache_write_tokens) == (cached, written) and written > 0
    # mock models are not GPT-5.6 or later: a write costs what uncached input costs
    assert row.billed_input_tokens == response["usage"]["input_tokens"] - cached
    assert billed_input("gpt-5.6", 1000, 200, 400) == 400 + 400 * 1.25
    assert billed_input("gpt-6", 1000, 0, 1000) == 1250
    assert billed_input("gpt-5.5", 1000, 0, 1000) == 1000


async def test_a_compacted_window_is_named_as_such(srv: ThreadedServer) -> None:
    """The window ``/responses/compact`` returns, sent in place of the history, misses for that reason."""
    first = base("compacted")
    first["input"] = [*first["input"], {"role": "assistant", "content": "A long answer. " * 40}]
    baseline = await create(srv, "json", first)
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as http:
        reply = await http.post("/v1/responses/compact", json={"model": MODEL, "input": first["input"]})
        assert reply.status_code == 200, reply.text
        window = reply.json()["output"]
    assert any(item["type"] == "compaction" for item in window)
    compare = {"prompt_cache_options": {"comparison_response_id": baseline["id"]}}
    after = await create(srv, "json", {**base("compacted", **compare), "input": window})
    cached, _ = details(after)
    could = min(baseline["usage"]["input_tokens"], after["usage"]["input_tokens"] - 1) // BLOCK * BLOCK
    assert cached < could
    assert after["prompt_cache_diagnostics"] == {
        "type": "cache_miss",
        "reason": "context_compacted",
        "cache_missed_tokens": could - cached,
        "comparison_reusable_tokens": could,
    }


async def test_an_unstored_chain_gets_no_diagnostics(srv: ThreadedServer) -> None:
    """GA WebSocket mode's ``store: false`` chain lives in memory: ``previous_response_id`` names nothing
    stored, and nothing was asked for, so the Response says nothing."""
    async with GaClient(srv.url, ping_interval=None) as ga:
        first = await ga.create(base("unstored", store=False), timeout=30)
        follow = base("unstored", store=False, previous_response_id=first["id"])
        follow["input"] = [{"role": "user", "content": "!say again"}]
        second = await ga.create(follow, timeout=30)
    assert second["prompt_cache_diagnostics"] is None
    assert details(second)[0] > 0  # the chain's prefix was reused all the same


def explicit(transport: str, tail: str, breakpoint: bool = True) -> dict[str, Any]:
    """Explicit mode: a long first message (with a breakpoint on its text) and a long second one."""
    head: dict[str, Any] = {"type": "input_text", "text": "!say noted\n" + "The stable part of it. " * 30}
    if breakpoint:
        head["prompt_cache_breakpoint"] = {"mode": "explicit"}
    body = base(transport + " explicit", prompt_cache_options={"mode": "explicit"})
    body["input"] = [
        {"role": "user", "content": [head]},
        {"role": "user", "content": [{"type": "input_text", "text": f"{tail} " * 60}]},
    ]
    return body


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_explicit_mode_writes_up_to_its_breakpoint(srv: ThreadedServer, transport: str) -> None:
    unmarked = await create(srv, transport, explicit(transport, "first", breakpoint=False))
    assert unmarked["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}
    assert details(unmarked) == (0, 0)  # explicit mode without a breakpoint writes nothing
    assert details(await create(srv, transport, explicit(transport, "first", breakpoint=False))) == (0, 0)

    marked = await create(srv, transport, explicit(transport, "first"))
    cached, written = details(marked)
    full = marked["usage"]["input_tokens"] // BLOCK * BLOCK
    assert cached == 0 and 0 < written < full - 2 * BLOCK  # the second message is past the breakpoint
    other = await create(srv, transport, explicit(transport, "second"))
    assert details(other) == (written, 0)  # the prefix up to the breakpoint is read, nothing new written


def ttl_details(response: dict[str, Any]) -> dict[str, int]:
    return dict(response["usage"]["input_tokens_details"]["cache_write_tokens_details"])


class Aged:
    """The mock GPU's prefix cache seen ``hours`` later: its lifetimes run on the GPU's clock, moved on here
    (the scheduler keeps its own pace)."""

    def __init__(self, srv: ThreadedServer, model: str = MODEL) -> None:
        self.cache = state(srv).pipeline.engines.gpus[model].cache
        self.real = self.cache.now

    def by(self, hours: float) -> None:
        self.cache.now = lambda: self.real() + hours * 3600.0

    def restore(self) -> None:
        self.cache.now = self.real


async def test_a_prefix_lives_its_ttl_on_every_transport() -> None:
    """A prefix written under ``30m`` is read up to its lifetime after its last use and missed after it,
    and the diagnostics say ``unavailable`` for a miss nothing in the request caused; ``12h`` outlives it.
    The writes are reported by lifetime and sum to ``cache_write_tokens``."""
    with running() as srv:
        aged = Aged(srv)
        for transport in TRANSPORTS:
            for case, (ttl, late, lives) in enumerate(
                (("30m", 0.4, True), ("30m", 0.6, False), ("12h", 0.6, True))
            ):
                name = f"case{case} {transport}"  # a first block of its own
                options = {"ttl": ttl} if ttl != "30m" else {}  # 30m: the default
                first = await create(srv, transport, base(name, prompt_cache_options=options))
                prompt = first["usage"]["input_tokens"]
                written = prompt // BLOCK * BLOCK
                assert details(first) == (0, written)
                assert ttl_details(first) == {
                    "ttl_30m_tokens": written if ttl == "30m" else 0,
                    "ttl_12h_tokens": written if ttl == "12h" else 0,
                }
                compare = {**options, "comparison_response_id": first["id"]}
                aged.by(late)
                try:
                    again = await create(srv, transport, base(name, prompt_cache_options=compare))
                finally:
                    aged.restore()
                if lives:
                    assert details(again) == (written, 0), name
                    assert again["prompt_cache_diagnostics"] == {"type": "cache_hit"}, name
                else:
                    assert details(again) == (0, written), name  # missed, and written again
                    assert again["prompt_cache_diagnostics"] == {"type": "unavailable"}, name
        # 12 h, then 13: past even the longer lifetime
        first = await create(srv, "json", base("twelve", prompt_cache_options={"ttl": "12h"}))
        aged.by(13)
        try:
            late = await create(srv, "json", base("twelve", prompt_cache_options={"ttl": "12h"}))
        finally:
            aged.restore()
        assert details(late)[0] == 0 and details(first)[1] == details(late)[1] > 0


async def test_a_breakpoints_own_ttl_outlives_the_requests() -> None:
    """Implicit mode with a ``12h`` breakpoint on the first message: the blocks up to it are written for 12 h,
    the rest for the request's 30 m; 40 minutes later only the 12 h part is read."""
    with running() as srv:
        aged = Aged(srv)
        body = explicit("lifetimes", "tail")
        body["prompt_cache_options"] = {}
        body["input"][0]["content"][0]["prompt_cache_breakpoint"] = {"mode": "explicit", "ttl": "12h"}
        first = await create(srv, "json", body)
        cached, written = details(first)
        lives = ttl_details(first)
        assert cached == 0 and written == first["usage"]["input_tokens"] // BLOCK * BLOCK
        assert lives["ttl_12h_tokens"] > 0 and lives["ttl_30m_tokens"] > 2 * BLOCK
        assert lives["ttl_12h_tokens"] + lives["ttl_30m_tokens"] == written
        aged.by(40 / 60)
        try:
            again = await create(srv, "json", body)
        finally:
            aged.restore()
        assert details(again)[0] == lives["ttl_12h_tokens"]
        assert ttl_details(again) == {"ttl_12h_tokens": 0, "ttl_30m_tokens": lives["ttl_30m_tokens"]}
        ledger = state(srv).pipeline.ledger
        await wait_for(lambda: ledger.get(first["id"]) is not None, "the usage row")
        row = ledger.get(first["id"])
        assert row is not None and (row.cache_write_tokens, row.cache_write_12h_tokens) == (
            written,
            lives["ttl_12h_tokens"],
        )


async def cache_story(srv: ThreadedServer) -> list[Any]:
    """What prompt caching reports for one run of requests: writes by lifetime (a 12 h breakpoint in
    implicit mode), a hit, a miss for a changed tool list, and explicit mode's write limit."""
    body = explicit("story", "tail")
    body["prompt_cache_options"] = {}
    body["input"][0]["content"][0]["prompt_cache_breakpoint"] = {"mode": "explicit", "ttl": "12h"}
    story: list[Any] = []
    first = await create(srv, "json", body)
    compare = {"comparison_response_id": first["id"]}
    tools = [{"type": "function", "name": "grep"}]
    for sent in (
        body,
        {**body, "prompt_cache_options": compare},
        {**body, "prompt_cache_options": compare, "tools": tools},
        explicit("story", "other"),
    ):
        response = first if sent is body else await create(srv, "json", sent)
        story.append((details(response), ttl_details(response), response["prompt_cache_diagnostics"]))
    return story


async def test_an_engine_process_caches_and_diagnoses_as_the_gpu_in_process() -> None:
    """``serve --engine URL``: the breakpoints, their lifetimes and the write limit reach the engine in its
    request (``responses_lab.retention``), so the counts and diagnostics are the in-process ones."""
    with running() as srv:
        local = await cache_story(srv)
    with ChildEngine([]) as engine, running(engine=engine.http_url) as srv:
        remote = await cache_story(srv)
    assert remote == local
    (written, lives, _), (hit, _, same), (_, _, changed), (limited, _, _) = local
    assert lives["ttl_12h_tokens"] > 0 and lives["ttl_30m_tokens"] > 0 and written[1] > 0
    assert same == {"type": "cache_hit"} and hit == (written[1], 0)
    assert changed["type"] == "cache_miss" and changed["reason"] == "tools_changed"
    assert limited == (
        lives["ttl_12h_tokens"],
        0,
    )  # the prefix up to the breakpoint read, nothing past it written


async def test_writes_by_lifetime_only_for_a_request_that_uses_the_caching_surface() -> None:
    """@openai/agents 0.20 reads ``input_tokens_details`` as a record of numbers (its ``runState``'s zod
    schema): a request without ``prompt_cache_options`` or a breakpoint gets ``cache_write_tokens`` only,
    every write its default 30 minutes (docs/protocol.md, "Prompt caching"); one that uses them gets the
    split, on every transport."""
    with running() as srv:
        for transport in TRANSPORTS:
            plain = await create(srv, transport, base(f"plain {transport}"))
            details = plain["usage"]["input_tokens_details"]
            assert details["cache_write_tokens"] > 0 and "cache_write_tokens_details" not in details
            assert all(isinstance(v, int) for v in details.values())
            opted = await create(srv, transport, base(f"opted {transport}", prompt_cache_options={}))
            assert ttl_details(opted) == {
                "ttl_12h_tokens": 0,
                "ttl_30m_tokens": opted["usage"]["input_tokens_details"]["cache_write_tokens"],
            }
