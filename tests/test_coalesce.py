"""``--coalesce-ms``: the GPU wakes at most that often and each wake-up's text is one delta per item. Every
event is still a snapshot, sequence numbers still rise strictly over the whole response, the text and the
token counts are those of one delta per token, and off (the default) is one delta per token."""

from __future__ import annotations

import asyncio
import itertools
import json
from contextlib import aclosing
from typing import Any

import pytest
from helpers import MODEL, create, outputs, recv, running
from websockets.asyncio.client import connect

from proto.processes import ChildEngine
from sampler.clock import FakeClock
from sampler.gpu import MockGPU
from sampler.models import ModelSpec

# Every test starts a server or a process; the GPU's wake-ups and deltas are paced in wall-clock time.
pytestmark = [pytest.mark.process, pytest.mark.serial]

TOKENS = 400  # at 4 000 tok/s: 100 ms of decoding
SCRIPT = (
    'Go.\n!call grep {"pattern": "a long argument to stream", "paths": ["src", "tests"]}\n'
    f"!tokens {TOKENS} !say done"
)


async def wake_ups(every_s: float, n: int = 50) -> list[tuple[float, int]]:
    spec = ModelSpec(
        name="t",
        time_to_first_token_ms=1.0,
        prefill_overhead_ms=10.0,
        prefill_time_per_token_ms=0.0,
        inter_token_latency_ms=1.0,
        max_num_seqs=4,
        time_factor_under_load=1.0,
        kv_cache_size=100,
    )
    clock = FakeClock()
    seq = MockGPU(spec, clock).open()
    got: list[tuple[float, int]] = []

    async def drive() -> None:
        async with aclosing(seq.run_turn(list(range(40)), list(range(n)), every_s)) as ticks:
            async for k in ticks:
                got.append((clock.now(), k))

    task = asyncio.create_task(drive())
    await clock.run_until_idle()
    await task
    # deadlines unmoved
    assert seq.last_report is not None and seq.last_report.decode_ms == pytest.approx(n - 1.0)
    return got


async def test_the_gpu_wakes_at_most_every_window_and_releases_what_fell_due() -> None:
    plain = await wake_ups(0.0)
    assert [k for _, k in plain] == [1] * 50
    windowed = await wake_ups(0.005)
    assert windowed[0] == plain[0]  # the first token is not held back
    times = [t for t, _ in windowed]
    assert all(b - a >= 0.005 - 1e-9 for a, b in itertools.pairwise(times))
    # t_first, then every 5 ms: 5 tokens each
    assert sum(k for _, k in windowed) == 50 and len(windowed) == 11
    # Never early: each wake-up releases only tokens whose deadline has passed.
    due = [0.010 + i * 0.001 for i in range(50)]
    released = 0
    for t, k in windowed:
        released += k
        assert due[released - 1] <= t + 1e-12


async def rollout(url: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with connect(url + "?protocol=longlived") as ws:
        await ws.send(json.dumps(create(SCRIPT)))
        while True:
            event = await recv(ws)
            events.append(event)
            if event["type"] == "response.done":
                await ws.send(
                    json.dumps({"type": "response.append", "input": outputs(event["pending_calls"])})
                )
            if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                return events


def total_usage(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole rollout's usage (a long-lived terminal event's ``usage`` is its last segment's)."""
    usage: dict[str, Any] = events[-1]["response"]["lab"]["usage_total"]
    return usage


def deltas(events: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["delta"] for e in events if e["type"] == kind]


@pytest.fixture(scope="module")
def both() -> dict[float, list[dict[str, Any]]]:
    runs = {}
    for window in (0.0, 5.0):
        with running(coalesce_ms=window) as server:
            runs[window] = asyncio.run(rollout(server.url))
    return runs


def test_off_is_one_delta_per_token(both: dict[float, list[dict[str, Any]]]) -> None:
    events = both[0.0]
    assert len(deltas(events, "response.output_text.delta")) == TOKENS
    arguments = deltas(events, "response.function_call_arguments.delta")
    assert total_usage(events)["output_tokens"] == TOKENS + len(arguments)  # ASCII: a delta a token


def test_coalesced_deltas_are_fewer_and_say_the_same(both: dict[float, list[dict[str, Any]]]) -> None:
    plain, merged = both[0.0], both[5.0]
    assert merged[-1]["type"] == "response.completed"
    for kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        assert "".join(deltas(merged, kind)) == "".join(deltas(plain, kind))
    # 100 ms of text in windows of 5 ms: about 21 deltas, not 400 (generous bounds: the box may be busy).
    assert 2 <= len(deltas(merged, "response.output_text.delta")) <= TOKENS // 4
    assert len(deltas(merged, "response.function_call_arguments.delta")) < len(
        deltas(plain, "response.function_call_arguments.delta")
    )
    assert total_usage(merged) == total_usage(plain)
    text = merged[-1]["response"]["output"][-1]["content"][0]["text"]
    assert "".join(deltas(merged, "response.output_text.delta")) == text


def test_coalesced_events_are_snapshots_in_strict_sequence(both: dict[float, list[dict[str, Any]]]) -> None:
    events = [e for e in both[5.0] if "sequence_number" in e]
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(len(numbers)))  # strictly increasing over the whole response, every turn
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added and all(item["status"] == "in_progress" for item in added)
    assert all(item.get("content", []) == [] and item.get("arguments", "") == "" for item in added)
    for done in (e for e in events if e["type"] == "response.output_text.done"):
        before = [
            e
            for e in events
            if e["type"] == "response.output_text.delta"
            and e["item_id"] == done["item_id"]
            and e["sequence_number"] < done["sequence_number"]
        ]
        # the deltas so far, in order, are the text
        assert "".join(e["delta"] for e in before) == done["text"]
    assert all(e["delta"] for e in events if e["type"].endswith(".delta"))  # no empty delta
    assert MODEL in both[5.0][-1]["response"]["model"]


def test_through_an_engine_in_another_process_the_stream_is_merged_the_same_way(
    both: dict[float, list[dict[str, Any]]],
) -> None:
    """The engine paces (one chunk per token); the API side merges what arrives within the window."""
    with (
        ChildEngine(["--model-override", f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0"]) as engine,
        running(engine=engine.http_url, coalesce_ms=5.0) as server,
    ):
        merged = asyncio.run(rollout(server.url))
    assert merged[-1]["type"] == "response.completed"
    kind = "response.output_text.delta"
    assert "".join(deltas(merged, kind)) == "".join(deltas(both[0.0], kind))
    assert 2 <= len(deltas(merged, kind)) <= TOKENS // 4
    numbers = [e["sequence_number"] for e in merged if "sequence_number" in e]
    assert numbers == list(range(len(numbers)))
