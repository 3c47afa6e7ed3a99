"""``service_tier`` as speed (docs/protocol.md, "Service tiers"; ``proto/server/tiers.py``): the table that
maps (model, tier) to an engine, the tier the Response echoes as OpenAI echoes it (``fast`` as
``priority``, ``auto`` as ``default``) on every transport, and the pace a tier buys, read from the
server's per-turn report (modelled decode time on the mock GPU's clock: no wall-clock bar)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import SLOW_MODEL, TERMINAL_OR_ERROR, until
from plain_server import srv  # noqa: F401  (the module's server)
from websockets.asyncio.client import connect

from proto.client import messages
from proto.server.serve import ThreadedServer
from proto.server.tiers import Served, serve
from sampler.models import MODELS

ALL = frozenset(MODELS)


# ------------------------------------------------------------------------------------ the table
@pytest.mark.parametrize(
    ("model", "tier", "expected"),
    [
        ("mock-65tps", None, Served("mock-65tps", "default")),
        ("mock-65tps", "auto", Served("mock-65tps", "default")),
        ("mock-65tps", "default", Served("mock-65tps", "default")),
        ("mock-65tps", "flex", Served("mock-65tps", "flex")),
        ("mock-65tps", "scale", Served("mock-65tps", "scale")),
        ("mock-65tps", "fast", Served("mock-1000tps", "priority")),
        ("mock-65tps", "priority", Served("mock-1000tps", "priority")),
        ("mock-65tps", "ultrafast", Served("mock-4000tps", "ultrafast")),
        ("mock-h100-8b", "ultrafast", Served("mock-4000tps", "ultrafast")),
        # a tier never slows a model
        ("mock-4000tps", "priority", Served("mock-4000tps", "priority")),
        ("mock-1000tps", "priority", Served("mock-1000tps", "priority")),
        ("mock-1000tps", "ultrafast", Served("mock-4000tps", "ultrafast")),
        # an unknown model is left for its refusal to name
        ("no-such-model", "ultrafast", Served("no-such-model", "ultrafast")),
    ],
)
def test_the_tier_table(model: str, tier: str | None, expected: Served) -> None:
    assert serve(model, tier, ALL) == expected


def test_a_tier_whose_class_is_not_served_is_not_used() -> None:
    """An ``--engine`` (or an override) without the tier's class: the model as named, echoed ``default``."""
    served = ALL - {"mock-4000tps"}
    assert serve("mock-65tps", "ultrafast", served) == Served("mock-65tps", "default")
    assert serve("mock-65tps", "priority", served) == Served("mock-1000tps", "priority")


# ------------------------------------------------------------------------------------ over the wire


@pytest.fixture
async def http(srv: ThreadedServer) -> AsyncIterator[httpx.AsyncClient]:  # noqa: F811
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=60) as client:
        yield client


def body(tier: str | None, tokens: int = 8, **fields: Any) -> dict[str, Any]:
    extra = {} if tier is None else {"service_tier": tier}
    return messages.body(
        SLOW_MODEL, [messages.user_message(f"!tokens {tokens} !say paced")], store=False, **extra, **fields
    )


async def terminal(transport: str, srv: ThreadedServer, http: httpx.AsyncClient, b: dict[str, Any]) -> Any:  # noqa: F811
    """The terminal Response of one create of ``b`` over ``transport``."""
    if transport == "http":
        reply = await http.post("/v1/responses", json=b)
        assert reply.status_code == 200, reply.text
        return reply.json()
    if transport == "sse":
        events: list[dict[str, Any]] = []
        async with http.stream("POST", "/v1/responses", json={**b, "stream": True}) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: ") :]))
        assert events[0]["response"]["service_tier"] == events[-1]["response"]["service_tier"]
        return events[-1]["response"]
    url = srv.url + ("?protocol=longlived" if transport == "longlived" else "")
    async with connect(url) as ws:
        await ws.send(json.dumps(messages.create(b)))
        frames = await until(ws, TERMINAL_OR_ERROR)
    assert frames[-1]["type"] == "response.completed", frames[-1]
    created = next(f for f in frames if f["type"] == "response.created")
    assert created["response"]["service_tier"] == frames[-1]["response"]["service_tier"]
    return frames[-1]["response"]


TRANSPORTS = ["http", "sse", "ga", "longlived"]
ECHOES = [
    (None, "default"),
    ("auto", "default"),
    ("flex", "flex"),
    ("fast", "priority"),
    ("ultrafast", "ultrafast"),
]


@pytest.mark.process
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("tier", "echoed"), ECHOES)
async def test_the_response_echoes_the_tier_used(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
    tier: str | None,
    echoed: str,
) -> None:
    response = await terminal(transport, srv, http, body(tier))
    assert response["service_tier"] == echoed
    assert response["model"] == SLOW_MODEL  # the client's model name, whatever engine served it


def per_token_ms(response: dict[str, Any]) -> float:
    [turn] = response["lab"]["turns"]
    assert turn["output_tokens"] > 1, turn
    return float(turn["decode_ms"]) / turn["output_tokens"]


@pytest.mark.process
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_ultrafast_streams_at_the_fastest_class_pace(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,
    transport: str,
) -> None:
    """The same model name, three tiers, three paces: each at its class's inter-token latency (the mock
    GPU's modelled decode time per token, from the server's own report)."""
    paces = {
        tier: per_token_ms(await terminal(transport, srv, http, body(tier, tokens=40)))
        for tier in ("default", "priority", "ultrafast")
    }
    for tier, model in (
        ("default", "mock-65tps"),
        ("priority", "mock-1000tps"),
        ("ultrafast", "mock-4000tps"),
    ):
        spec = MODELS[model]  # a step's latency over the tokens it emits (speculative: several)
        itl = spec.inter_token_latency_ms / spec.tokens_per_step
        assert paces[tier] == pytest.approx(itl, rel=0.25), (tier, paces)
    assert paces["default"] > 50 * paces["ultrafast"]  # 65 vs 4 000 tokens/s without a new model name
