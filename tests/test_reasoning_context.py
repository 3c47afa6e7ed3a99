"""``reasoning.context`` (openai-python 3.63, ``shared.Reasoning``): under ``current_turn`` the reasoning
items of earlier turns (before the latest user message) are withheld from the model, listed in the
Response's ``input_transformations`` and left out of ``usage.input_tokens``; ``all_turns`` (the default)
keeps them. The same conversation over the five designs reports the same usage (docs/protocol.md, "Newer
fields")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from helpers import MODEL, TERMINAL_OR_ERROR, auth, output, outputs_for, tool_output, tools_decl, until
from openai.types.responses import Response as SdkResponse
from plain_server import http, srv  # noqa: F401  (the module's server and a client on it)
from websockets.asyncio.client import connect

from proto.client import messages
from proto.server.serve import ThreadedServer

pytestmark = pytest.mark.process  # every test starts a server

DESIGNS = ("http", "http-cached", "http-prev", "ws", "longlived")
CACHED = {"X-Responses-Lab-Cache": "items"}
TOOLS = tools_decl()
# Three responses (one long-lived): the first call's output comes alone (the same turn goes on), the
# second's with a new user message (a new turn).
SCRIPT = "Start.\n!reason 7 !call grep {}\n!reason 9 !call read_file {}\n!reason 11 !say done"
FOLLOW_UPS: tuple[list[dict[str, Any]], ...] = ([], [messages.user_message("Next, please.")])


def base(context: str | None, design: str) -> dict[str, Any]:
    reasoning = {"effort": "low"} if context is None else {"effort": "low", "context": context}
    # A cache key per run: each design's prefix cache sees only its own conversation.
    return messages.body(
        MODEL,
        [messages.user_message(SCRIPT)],
        tools=TOOLS,
        store=design == "http-prev",
        reasoning=reasoning,
        include=["reasoning.encrypted_content"],
        prompt_cache_key=f"{design}-{context}",
    )


def answer(response: dict[str, Any], turn: int) -> list[dict[str, Any]]:
    return [*outputs_for(response), *FOLLOW_UPS[turn]]


async def over_http(url: str, design: str, context: str | None) -> list[dict[str, Any]]:
    first = base(context, design)
    body, history, responses = first, list(first["input"]), []
    headers = CACHED if design == "http-cached" else {}
    async with httpx.AsyncClient(base_url=url, headers={**auth(None), **headers}, timeout=60) as client:
        for turn in range(3):
            reply = await client.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            responses.append(reply.json())
            if turn == 2:
                return responses
            new = answer(responses[-1], turn)
            if design == "http-prev":
                body = messages.continuation(first, new, responses[-1]["id"])
            else:
                history = [*history, *responses[-1]["output"], *new]
                body = dict(first, input=history)
    raise AssertionError("unreachable")


async def over_ga(url: str, context: str | None) -> list[dict[str, Any]]:
    first = base(context, "ws")
    event, responses = first, []
    async with connect(url) as ws:
        for turn in range(3):
            await ws.send(json.dumps(messages.create(event)))
            frame = (await until(ws, TERMINAL_OR_ERROR))[-1]
            assert frame["type"] == "response.completed", frame
            responses.append(frame["response"])
            if turn < 2:
                event = messages.continuation(first, answer(responses[-1], turn), responses[-1]["id"])
    return responses


async def over_longlived(url: str, context: str | None) -> list[dict[str, Any]]:
    """One response: each suspension answered by an append of the call's output and a user message."""
    async with connect(url + "?protocol=longlived") as ws:
        await ws.send(json.dumps(messages.create(base(context, "longlived"))))
        for turn in range(3):
            frame = (await until(ws, {*TERMINAL_OR_ERROR, "response.done"}))[-1]
            if turn == 2:
                assert frame["type"] == "response.completed", frame
                return [frame["response"]]
            assert frame["type"] == "response.done", frame
            new = [output(c["call_id"], tool_output(c["name"], "{}")) for c in frame["pending_calls"]]
            await ws.send(json.dumps(messages.append([*new, *FOLLOW_UPS[turn]])))
    raise AssertionError("unreachable")


async def run(srv: ThreadedServer, design: str, context: str | None) -> list[dict[str, Any]]:  # noqa: F811
    if design == "longlived":
        return await over_longlived(srv.url, context)
    if design == "ws":
        return await over_ga(srv.url, context)
    return await over_http(srv.http_url, design, context)


CONTEXTS = (None, "all_turns", "current_turn")


@pytest.fixture(scope="module")
def runs(srv: ThreadedServer) -> dict[tuple[str, str | None], list[dict[str, Any]]]:  # noqa: F811
    """The conversation over every design under every context setting (one cache key each)."""

    async def every() -> dict[tuple[str, str | None], list[dict[str, Any]]]:
        return {(d, c): await run(srv, d, c) for d in DESIGNS for c in CONTEXTS}

    return asyncio.run(every())


def prompts(responses: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each segment's prompt and prefix-cache hit, in conversation order."""
    return [(t["prompt_tokens"], t["cached_tokens"]) for r in responses for t in r["lab"]["turns"]]


def input_tokens(responses: list[dict[str, Any]]) -> int:
    # A long-lived terminal event's whole usage is lab.usage_total ("Billing").
    return sum(r["lab"]["usage_total"]["input_tokens"] for r in responses)


def reasoning_ids(responses: list[dict[str, Any]]) -> list[str]:
    return [item["id"] for r in responses for item in r["output"] if item["type"] == "reasoning"]


@pytest.mark.parametrize("design", DESIGNS)
def test_the_context_is_echoed_as_asked(
    runs: dict[tuple[str, str | None], list[dict[str, Any]]], design: str
) -> None:
    for context in CONTEXTS:
        for response in runs[design, context]:
            assert response["reasoning"]["context"] == (context or "all_turns"), (design, context)
            # OpenAI's own type reads it (``usage`` aside: its cache-write counts belong to prompt caching)
            SdkResponse.model_validate({k: v for k, v in response.items() if k != "usage"})


@pytest.mark.parametrize("design", DESIGNS)
def test_current_turn_withholds_the_reasoning_of_earlier_turns(
    runs: dict[tuple[str, str | None], list[dict[str, Any]]], design: str
) -> None:
    """Under ``all_turns`` (and by default) nothing is withheld. Under ``current_turn`` the reasoning of the
    first turn stays while its tool loop goes on, and both earlier reasoning items leave the context once
    the user's new message starts a turn: listed in input order, the last prompt smaller by their
    rendering, and the prefix cache missing from where the first of them stood."""
    for context in (None, "all_turns"):
        assert all(r["input_transformations"] == [] for r in runs[design, context])
    kept, cut = runs[design, "all_turns"], runs[design, "current_turn"]
    if design != "longlived":  # one response per segment: the tool loop's continuation withholds nothing
        assert [len(r["input_transformations"]) for r in cut] == [0, 0, 2]
    earlier = reasoning_ids(cut)[:2]
    assert cut[-1]["input_transformations"] == [
        {"id": rs, "action": "removed", "reason": "turn_boundary", "type": "reasoning"} for rs in earlier
    ]
    (p1, c1), (p2, c2), (p3_kept, c3_kept) = prompts(kept)
    assert prompts(cut)[:2] == [(p1, c1), (p2, c2)]  # the same until the user's message
    p3, c3 = prompts(cut)[2]
    assert p3 < p3_kept and input_tokens(kept) - input_tokens(cut) == p3_kept - p3
    # The first withheld item followed the first prompt: the hit ends at or before it, below all_turns'.
    assert c3 <= p1 < c3_kept


def test_the_five_designs_report_the_same_usage(
    runs: dict[tuple[str, str | None], list[dict[str, Any]]],
) -> None:
    for context in CONTEXTS:
        seen = {
            design: (input_tokens(runs[design, context]), prompts(runs[design, context]))
            for design in DESIGNS
        }
        assert len(set(map(str, seen.values()))) == 1, (context, seen)
    assert input_tokens(runs["http", "current_turn"]) < input_tokens(runs["http", "all_turns"])


async def test_withholding_counts_as_leaving_the_items_out(
    runs: dict[tuple[str, str | None], list[dict[str, Any]]],
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    """The last create of the full-history conversation, counted by ``POST /v1/responses/input_tokens``:
    under ``current_turn`` it is the first turn's ``input_tokens``, and the count of the same input under
    ``all_turns`` with the earlier reasoning left out by the client."""
    responses = runs["http", "current_turn"]
    history = [
        *base("current_turn", "http")["input"],
        *responses[0]["output"],
        *answer(responses[0], 0),
        *responses[1]["output"],
        *answer(responses[1], 1),
    ]
    body = dict(base("current_turn", "http"), input=history)
    counted = (await http.post("/v1/responses/input_tokens", json=body)).json()["input_tokens"]
    assert counted == responses[-1]["lab"]["turns"][0]["prompt_tokens"]
    omitted = [item for item in history if item.get("type") != "reasoning"]
    plain = dict(base("all_turns", "http"), input=omitted)
    assert (await http.post("/v1/responses/input_tokens", json=plain)).json()["input_tokens"] == counted
    kept = dict(base("all_turns", "http"), input=history)
    assert (await http.post("/v1/responses/input_tokens", json=kept)).json()["input_tokens"] > counted


async def test_a_ga_chain_that_changes_its_settings_renders_what_a_full_history_would(
    srv: ThreadedServer,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    """On one GA connection the reused rendering holds only under the setting that withheld its items:
    a continuation under ``all_turns`` gets the withheld reasoning back, one under new instructions lists
    every withheld item; each prompt is what ``input_tokens`` counts for the full history re-sent."""
    first = base("current_turn", "ws")
    history, event, responses = list(first["input"]), first, []
    follow = [
        ("current_turn", None),
        ("current_turn", None),
        ("all_turns", None),  # the withheld reasoning is back
        ("current_turn", "Be brief."),  # new instructions: rendered again, every earlier item withheld
    ]
    async with connect(srv.url) as ws:
        for turn, (context, instructions) in enumerate(follow):
            await ws.send(json.dumps(messages.create(event)))
            frame = (await until(ws, TERMINAL_OR_ERROR))[-1]
            assert frame["type"] == "response.completed", frame
            response = frame["response"]
            # The body an HTTP client would send for the same create: the whole history.
            body = dict(event, input=history)
            body.pop("previous_response_id", None)
            counted = (await http.post("/v1/responses/input_tokens", json=body)).json()["input_tokens"]
            assert response["lab"]["turns"][0]["prompt_tokens"] == counted, (turn, context)
            withheld = [t["id"] for t in response["input_transformations"]]
            users = [i for i, item in enumerate(history) if item.get("role") == "user"]
            before = [item["id"] for item in history[: users[-1]] if item.get("type") == "reasoning"]
            assert withheld == (before if event["reasoning"]["context"] == "current_turn" else []), turn
            responses.append(response)
            if turn + 1 == len(follow):
                break
            new = [*outputs_for(response), messages.user_message(f"Now step {turn}.")]
            history = [*history, *response["output"], *new]
            context, instructions = follow[turn + 1]
            reasoning = {"effort": "low", "context": context}
            event = messages.continuation(dict(first, reasoning=reasoning), new, response["id"])
            if instructions is not None:
                event["instructions"] = instructions
    assert len(responses[-1]["input_transformations"]) >= 3
