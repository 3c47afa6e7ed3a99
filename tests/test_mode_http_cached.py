"""``http-cached``: one independent HTTP request per turn, the server's item cache skipping what it has seen
(``proto/server/stages/item_cache.py``), counted per response and on /metrics; the ledger takes the new mode,
also
in a database file created before it existed; the HTTP modes' API-cost knob."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import MODEL, http_rollout, running, state, ten_turn_script

from proto.core.response import MODES
from proto.server.storage.ledger import LedgerRow, UsageLedger

pytestmark = pytest.mark.process  # every test starts a server or a process

HEADER = {"X-Responses-Lab-Cache": "items"}


async def rollout(url: str, headers: dict[str, str], script: str) -> list[dict[str, Any]]:
    """The full history re-sent every turn (``http``), with or without the cache header."""
    return await http_rollout(url, script, previous=False, headers=headers)


async def test_the_cache_skips_every_item_it_has_seen_and_counts_it() -> None:
    with running() as srv:
        plain = await rollout(srv.http_url, {}, ten_turn_script())
        cached = await rollout(srv.http_url, HEADER, ten_turn_script())
        assert [r["lab"]["mode"] for r in cached] == ["http-cached"] * len(cached)
        assert {r["lab"]["mode"] for r in plain} == {"http"}
        # Same conversation, same usage: the cache changes the work, never what reaches the engine.
        usage = [[r["usage"]["input_tokens"], r["usage"]["output_tokens"]] for r in plain]
        assert [[r["usage"]["input_tokens"], r["usage"]["output_tokens"]] for r in cached] == usage
        work = [r["lab"]["work"] for r in cached]
        # The first request sees everything for the first time; each later one hits every earlier body and
        # misses only what is new since (a model's output and its tool outputs).
        assert work[0]["item_cache_hits"] == 0 and work[0]["item_cache_misses"] >= 1
        for before, after in itertools.pairwise(work):
            # everything seen stays seen (nothing evicted)
            assert after["item_cache_hits"] > before["item_cache_hits"]
            # the last turn's output items and the outputs of its (up to two) calls
            assert after["item_cache_misses"] <= 6
        # http tokenizes the whole history every turn; http-cached only the new bodies.
        assert sum(w["tokens_tokenized"] for w in work) * 3 < sum(
            r["lab"]["work"]["tokens_tokenized"] for r in plain
        )
        # The model is resolved once per key; the classifier is called whenever a body is new (every turn
        # here).
        assert sum(w["model_resolutions"] for w in work) == 1
        assert [w["safety_hops"] for w in work] == [1] * len(work)
        pipeline = state(srv).pipeline
        assert pipeline.item_cache.hits == sum(w["item_cache_hits"] for w in work)
        assert pipeline.item_cache.misses == sum(w["item_cache_misses"] for w in work)
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            text = (await http.get("/metrics")).text
        assert f'responses_lab_work_total{{kind="item_cache_hits"}} {float(pipeline.item_cache.hits)}' in text
        assert "responses_lab_item_cache_tokens " in text and "responses_lab_item_cache_entries " in text


async def test_the_cache_is_bounded_and_scoped_by_key() -> None:
    with running(item_cache_tokens=300, api_key=["k1", "k2"]) as srv:
        script = ten_turn_script()
        await rollout(srv.http_url, {**HEADER, "Authorization": "Bearer k1"}, script)
        cache = state(srv).pipeline.item_cache
        assert cache.tokens <= 300 and cache.evictions > 0
        hits = cache.hits
        # Another key sees none of the first key's entries: the same first message misses.
        async with httpx.AsyncClient(
            base_url=srv.http_url, headers={**HEADER, "Authorization": "Bearer k2"}
        ) as client:
            reply = await client.post(
                "/v1/responses", json={"model": MODEL, "input": [{"role": "user", "content": "!say hi"}]}
            )
        assert reply.json()["lab"]["work"]["item_cache_hits"] == 0
        assert cache.hits == hits


async def test_the_cache_keeps_the_safety_findings_of_what_it_skips() -> None:
    secret = "my key is sk-" + "a1" * 20 + "\n!say ok"
    with running(safety="block") as srv:
        async with httpx.AsyncClient(base_url=srv.http_url, headers=HEADER) as client:
            for _ in range(2):  # the second time the text is a cache hit: still refused
                reply = await client.post(
                    "/v1/responses", json={"model": MODEL, "input": [{"role": "user", "content": secret}]}
                )
                assert reply.status_code == 400 and reply.json()["error"]["code"] == "content_policy"


def test_an_old_ledger_file_is_migrated_to_the_new_mode(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    old = "'http', 'http-prev', 'ws', 'longlived'"
    db.executescript(f"""
        CREATE TABLE usage (response_id TEXT PRIMARY KEY, api_key_id TEXT NOT NULL, model TEXT NOT NULL,
            mode TEXT NOT NULL CHECK (mode IN ({old})), status TEXT NOT NULL, input_tokens INTEGER NOT NULL,
            cached_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, turns INTEGER NOT NULL,
            created_at REAL NOT NULL, completed_at REAL NOT NULL);
        CREATE INDEX usage_by_key ON usage (api_key_id, created_at);
        INSERT INTO usage VALUES
            ('resp_old', 'key_a', 'mock-1000tps', 'ws', 'completed', 10, 0, 5, 1, 1.0, 2.0);
    """)
    db.commit()
    db.close()
    assert "http-cached" in MODES
    ledger = UsageLedger(str(path))
    ledger.start()
    ledger.record(
        LedgerRow("resp_new", "key_a", "mock-1000tps", "http-cached", "completed", 20, 10, 5, 1, 3.0, 4.0)
    )
    ledger.close()
    db = sqlite3.connect(path)
    rows = dict(db.execute("SELECT response_id, mode FROM usage").fetchall())
    schema = db.execute("SELECT sql FROM sqlite_master WHERE name = 'usage'").fetchone()[0]
    indexes = [
        r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'usage'")
    ]
    db.close()
    assert rows == {"resp_old": "ws", "resp_new": "http-cached"}
    assert "'http-cached'" in schema and "usage_by_key" in indexes


async def test_the_api_cost_knob_is_paid_by_the_http_modes_only() -> None:
    with running(api_cost_ms=2.0, api_cost_ms_per_1k=1.0) as srv:
        plain = await rollout(srv.http_url, {}, "!say hi")
        cached = await rollout(srv.http_url, HEADER, "!say hi")
        for response, base_only in ((plain[0], False), (cached[0], True)):
            history = response["lab"]["turns"][0]["prompt_tokens"] - 3  # less the prompt's assistant header
            modelled = 2.0 + (0.0 if base_only else history / 1000.0)
            # a sleep on the precise clock: never short
            assert response["lab"]["phases_ms"]["api_cost"] >= modelled
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as client:
            first = (await client.post("/v1/responses", json={"model": MODEL, "input": "!say hi"})).json()
            chained = await client.post(
                "/v1/responses", json={"model": MODEL, "input": "again", "previous_response_id": first["id"]}
            )
        assert "api_cost" in chained.json()["lab"]["phases_ms"]
