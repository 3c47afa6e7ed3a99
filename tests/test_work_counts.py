"""The same ten-turn rollout over the four transports: what each one redoes, counted.

``longlived`` and ``ws`` tokenize and scan each input once; ``http`` and ``http-prev`` redo the history on
every turn. Token usage (input, output) is the same in every mode: the same prompts reach the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import (
    ga_rollout,
    http_rollout,
    longlived_rollout,
    outputs_for,
    running,
    state,
    ten_turn_script,
)

from proto.server.serve import ThreadedServer
from sampler.tokens import Tokenizer

pytestmark = pytest.mark.process  # every test starts a server or a process

MODES = ("longlived", "ws", "http", "http-prev")


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server


async def rollout(server: ThreadedServer, mode: str) -> list[dict[str, Any]]:
    script = ten_turn_script()
    if mode == "longlived":
        return await longlived_rollout(server.url, script)
    if mode == "ws":
        return await ga_rollout(server.url, script)
    return await http_rollout(server.http_url, script, previous=mode == "http-prev")


def total(responses: list[dict[str, Any]], name: str) -> int:
    return sum(int(r["lab"]["work"][name]) for r in responses)


@pytest.fixture(scope="module")
def runs(srv: ThreadedServer) -> dict[str, list[dict[str, Any]]]:
    import asyncio

    async def all_modes() -> dict[str, list[dict[str, Any]]]:
        return {mode: await rollout(srv, mode) for mode in MODES}

    return asyncio.run(all_modes())


def test_every_mode_runs_ten_turns_to_the_same_answer(runs: dict[str, list[dict[str, Any]]]) -> None:
    for mode, responses in runs.items():
        assert all(r["status"] == "completed" for r in responses), mode
        assert sum(len(r["lab"]["turns"]) for r in responses) == 10, mode
        assert responses[-1]["output"][-1]["content"][0]["text"] == "Fixed.", mode
        assert {r["lab"]["mode"] for r in responses[1:] or responses} == {
            mode
        }  # http-prev starts with a plain POST
    assert len(runs["longlived"]) == 1
    # Eight local-call turns end eight responses; the hosted web_search turn runs inside one.
    assert len(runs["ws"]) == len(runs["http"]) == len(runs["http-prev"]) == 9


def test_usage_totals_are_identical_across_modes(runs: dict[str, list[dict[str, Any]]]) -> None:
    # A terminal event's whole usage is lab.usage_total (a long-lived one's usage is its last segment's).
    usage = {
        mode: (
            sum(r["lab"]["usage_total"]["input_tokens"] for r in rs),
            sum(r["lab"]["usage_total"]["output_tokens"] for r in rs),
        )
        for mode, rs in runs.items()
    }
    assert len(set(usage.values())) == 1, usage
    for rs in runs.values():  # one segment per response over HTTP and GA: there the two are the same
        assert all(r["usage"] == r["lab"]["usage_total"] for r in rs) or rs is runs["longlived"]


def test_longlived_and_ws_process_each_input_once(runs: dict[str, list[dict[str, Any]]]) -> None:
    for counter in ("tokens_tokenized", "chars_scanned", "items_rendered"):
        assert total(runs["ws"], counter) == total(runs["longlived"], counter), counter
    assert total(runs["longlived"], "model_resolutions") == 1
    assert total(runs["ws"], "model_resolutions") == 1  # the cache hit reuses the resolved engine
    # The same safety rule: an append of tool outputs calls the classifier as a create of them does.
    assert total(runs["longlived"], "safety_hops") == total(runs["ws"], "safety_hops") == 9
    assert total(runs["ws"], "store_reads") == 0
    # Each ws continuation tokenizes exactly its new items (the outputs it carries), nothing old.
    tokenizer = Tokenizer()
    for previous, response in zip(runs["ws"], runs["ws"][1:], strict=False):
        if any(item["type"] == "web_search_call" for item in response["output"]):
            continue  # the hosted result is tokenized when it arrives, inside the response
        new = sum(tokenizer.count(output["output"]) for output in outputs_for(previous))
        assert response["lab"]["work"]["tokens_tokenized"] == new


def test_http_modes_redo_the_history_every_turn(runs: dict[str, list[dict[str, Any]]]) -> None:
    once = total(runs["ws"], "tokens_tokenized")
    for mode in ("http", "http-prev"):
        per_turn = [r["lab"]["work"]["tokens_tokenized"] for r in runs[mode]]
        assert per_turn == sorted(per_turn) and per_turn[-1] > per_turn[0] * 3, (mode, per_turn)
        assert sum(per_turn) > 4 * once, mode
        assert total(runs[mode], "model_resolutions") == len(runs[mode])
    # http re-scans everything; http-prev scans only the new input, as ws does.
    assert total(runs["http"], "chars_scanned") > 4 * total(runs["ws"], "chars_scanned")
    assert total(runs["http-prev"], "chars_scanned") == total(runs["ws"], "chars_scanned")
    # http-prev reads the whole chain from the store on every request: 1 + 2 + … + 8 rows.
    assert total(runs["http-prev"], "store_reads") == sum(range(1, 9))
    assert total(runs["http"], "store_reads") == 0


def test_each_response_is_billed_once(srv: ThreadedServer, runs: dict[str, list[dict[str, Any]]]) -> None:
    ledger = state(srv).pipeline.ledger
    ledger.flush()
    assert ledger.duplicates == 0
    for responses in runs.values():
        for response in responses:
            assert ledger.get(response["id"]) is not None
