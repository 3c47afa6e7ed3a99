"""The safety rules apply to every design alike (docs/lab.md, "Equal rules"), over a real server.

Under ``--safety-classify new`` (the default) an append of tool outputs pays the classifier's hop as a GA
WebSocket create of the same outputs does, and ``lab.turns`` shows it on the turn after the append; under
``user`` neither pays it. ``--safety-placement beside`` runs the hop beside the prefill: the first token
waits for whichever ends last, not for their sum. The store round trip (``--store-hop-ms``) is paid per
store read a chain load makes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from helpers import (
    MODEL,
    TERMINAL_OR_ERROR,
    create,
    ga_rollout,
    http_rollout,
    longlived_rollout,
    output,
    running,
    ten_turn_script,
)

from proto.client.longlived import LongLivedClient
from proto.server.config import Settings
from proto.server.pipeline import Pipeline

pytestmark = pytest.mark.process  # every test starts a server or a process

HOP_MS = 5.0


def total(responses: list[dict[str, Any]], name: str) -> int:
    return sum(int(r["lab"]["work"][name]) for r in responses)


def hop_turns(response: dict[str, Any]) -> list[bool]:
    """Per turn (``lab.turns``): whether the classifier's hop was paid on its way to the first token."""
    return [turn["phases_ms"].get("safety_hop", 0.0) >= HOP_MS for turn in response["lab"]["turns"]]


async def test_under_new_content_a_longlived_append_pays_what_a_ws_create_pays() -> None:
    with running(safety_hop_ms=HOP_MS) as srv:
        (longlived,) = await longlived_rollout(srv.url, ten_turn_script())
        ws = await ga_rollout(srv.url, ten_turn_script())
    # Ten turns: the create, eight appends of tool outputs, and the turn after the hosted search (nothing
    # new arrived: no classifier call). ws: nine creates, one per response.
    assert longlived["lab"]["work"]["safety_hops"] == total(ws, "safety_hops") == 9
    assert hop_turns(longlived) == [True] * 6 + [False] + [True] * 3
    phases = longlived["lab"]["phases_ms"]
    assert phases["safety_hop"] >= 9 * HOP_MS


async def test_under_user_input_only_no_design_classifies_tool_outputs() -> None:
    with running(safety_hop_ms=HOP_MS, safety_classify="user") as srv:
        (longlived,) = await longlived_rollout(srv.url, ten_turn_script())
        ws = await ga_rollout(srv.url, ten_turn_script())
        http = await http_rollout(srv.http_url, ten_turn_script(), previous=False)
        prev = await http_rollout(srv.http_url, ten_turn_script(), previous=True)
    # Only the first request carries the user's message as new content.
    assert (
        longlived["lab"]["work"]["safety_hops"] == total(ws, "safety_hops") == total(prev, "safety_hops") == 1
    )
    assert hop_turns(longlived) == [True] + [False] * 9
    # http re-sends the user's message every turn and cannot know it was classified: its design pays.
    assert total(http, "safety_hops") == len(http) == 9


async def test_under_all_every_append_classifies_the_whole_context() -> None:
    with running(safety_hop_ms=0.0, safety_classify="all") as srv:
        (longlived,) = await longlived_rollout(srv.url, ten_turn_script())
    with running(safety_hop_ms=0.0) as srv:
        (new,) = await longlived_rollout(srv.url, ten_turn_script())
    assert longlived["lab"]["work"]["safety_hops"] == new["lab"]["work"]["safety_hops"] == 9
    # Each append re-reads everything before it: far more characters than the new items alone.
    assert longlived["lab"]["work"]["chars_scanned"] > 3 * new["lab"]["work"]["chars_scanned"]


PREFILL_MS = 250.0
SLOW_HOP_MS = 500.0


async def append_to_first_event(placement: str) -> tuple[float, dict[str, Any]]:
    """A long-lived create that calls a tool, then the seconds from the append of its output to the first
    event of the turn it resumes; and the terminal response."""
    flags: dict[str, Any] = {
        "safety_hop_ms": SLOW_HOP_MS,
        "safety_placement": placement,
        "model_override": [f"{MODEL}:prefill-overhead={PREFILL_MS:g},prefill-time-per-token=0"],
    }
    with running(**flags) as srv:
        async with LongLivedClient(srv.url) as client:
            await client.send(create('Go.\n!call grep {"q": 1}\n!say done'))
            while True:
                event = await client.recv(30.0)
                if event.type == "response.done" or event.type in TERMINAL_OR_ERROR:
                    break
            assert event.type == "response.done", event.data
            (call,) = event.data["pending_calls"]
            sent = time.perf_counter()
            await client.send({"type": "response.append", "input": [output(call["call_id"], "found")]})
            first = await client.recv(30.0)
            waited = time.perf_counter() - sent
            while first.type not in TERMINAL_OR_ERROR:
                first = await client.recv(30.0)
            assert first.type == "response.completed", first.data
    return waited, first.data["response"]


@pytest.mark.serial  # an upper bound on the real clock (250 ms of slack): run alone
async def test_beside_the_prefill_the_first_token_waits_for_the_longer_not_the_sum() -> None:
    before, serial = await append_to_first_event("before")
    beside, overlapped = await append_to_first_event("beside")
    hop, prefill, total_ms = SLOW_HOP_MS / 1e3, PREFILL_MS / 1e3, (SLOW_HOP_MS + PREFILL_MS) / 1e3
    assert before >= total_ms  # the hop, then the prefill
    assert max(hop, prefill) <= beside < total_ms  # both at once: the longer of the two
    for response in (serial, overlapped):
        resumed = response["lab"]["turns"][1]["phases_ms"]
        assert resumed["safety_hop"] >= SLOW_HOP_MS  # lab.turns shows the hop on the append's turn
    # Beside, the first token waited only for what the hop had left once the prefill was done.
    waited = overlapped["lab"]["turns"][1]["phases_ms"]["safety_wait"]
    assert waited < SLOW_HOP_MS
    assert "safety_wait" not in serial["lab"]["turns"][1]["phases_ms"]


async def test_a_chain_load_pays_one_store_round_trip_per_link() -> None:
    with running(store_hop_ms=HOP_MS) as srv:
        prev = await http_rollout(srv.http_url, ten_turn_script(), previous=True)
    for response in prev[1:]:
        reads = response["lab"]["work"]["store_reads"]
        assert reads >= 1
        assert response["lab"]["phases_ms"]["store_hop"] >= reads * HOP_MS
    assert "store_hop" not in prev[0]["lab"]["phases_ms"]


def test_a_bad_rule_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="--safety-classify"):
        Pipeline(Settings(db=":memory:", safety_classify="tools"))
    with pytest.raises(ValueError, match="--safety-placement"):
        Pipeline(Settings(db=":memory:", safety_placement="after"))
