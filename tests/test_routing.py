"""The routing table among engine replicas (``proto.engine.routing``): sans-IO, each policy's choice."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from proto.engine.routing import POLICIES, Replicas, Router, block_hashes, queue_scores
from proto.server.config import Settings
from proto.server.pipeline import Engines
from sampler.clock import FakeClock


def test_block_hashes_chain_and_stop_at_the_last_full_block() -> None:
    prompt = list(range(100))
    hashes = block_hashes(prompt, "m\x1fs", 16)
    assert len(hashes) == 6  # 96 of the 100 tokens: the partial block is not hashed
    # A prompt that shares the first two blocks shares exactly the first two hashes (the chain).
    other = prompt[:32] + [7] * 68
    assert block_hashes(other, "m\x1fs", 16)[:2] == hashes[:2]
    assert block_hashes(other, "m\x1fs", 16)[2] != hashes[2]
    # Another seed (model or cache salt) shares nothing, as the engine's cache shares nothing across salts.
    assert not set(block_hashes(prompt, "m\x1ft", 16)) & set(hashes)
    assert len(block_hashes(list(range(10_000)), "s", 16, limit=256)) == 256


def test_prefix_aware_follows_the_prefix_and_breaks_ties_by_load() -> None:
    router = Router("prefix-aware", 3)
    a, b = block_hashes(list(range(64)), "s", 16), block_hashes(list(range(1000, 1064)), "s", 16)
    first = router.pick([0, 0, 0], a)
    router.seen(first, a)
    assert first == 0  # nothing seen: least loaded, then least routed, then lowest index
    second = router.pick([1, 0, 0], b)  # unseen prefix: the least loaded
    router.seen(second, b)
    assert second == 1
    # The continuation of a (its blocks and more) goes where a went, even under more load there.
    longer = block_hashes(list(range(80)), "s", 16)
    assert router.pick([5, 0, 0], longer) == 0
    assert router.prefix_hits == 1
    assert router.routed == [2, 1, 0]


def test_prefix_aware_weighs_the_share_matched_against_the_queue() -> None:
    """llm-d's default profile: 3 x the share of the prompt's leading blocks a replica has seen + 2 x its
    queue score (1 least loaded, 0 most). A prompt that shares only a common head (1 block of 4) goes to
    the idle replica; at equal load the head decides."""
    router = Router("prefix-aware", 2)
    tools = list(range(16))
    first = block_hashes(tools + list(range(100, 148)), "s", 16)
    router.seen(router.pick([0, 0], first), first)
    other = block_hashes(tools + list(range(200, 248)), "s", 16)
    assert router.pick([2, 0], other) == 1  # 3 x 1/4 + 0 < 0 + 2 x 1
    assert router.pick([1, 1], other) == 0  # 3 x 1/4 + 2 > 0 + 2
    assert router.prefix_hits == 1
    assert queue_scores([3, 1, 2]) == [0.0, 1.0, 0.5] and queue_scores([4, 4]) == [1.0, 1.0]


def test_sticky_keeps_a_key_and_spreads_new_ones() -> None:
    router = Router("sticky", 2)
    assert router.pick([0, 0], key="conn-a") == 0
    assert router.pick([0, 0], key="conn-b") == 1  # a tie in load: the replica routed to less
    for _ in range(5):
        assert router.pick([9, 0], key="conn-a") == 0  # its replica, whatever the load
    assert router.pick([3, 1], key="") == 1  # no key: least loaded


def test_least_loaded_alternates_at_equal_load_and_random_is_seeded() -> None:
    router = Router("least-loaded", 2)
    assert [router.pick([0, 0]) for _ in range(6)] == [0, 1, 0, 1, 0, 1]
    assert router.pick([4, 2]) == 1
    seeded, again = Router("random", 4, seed=3), Router("random", 4, seed=3)
    assert [seeded.pick([0] * 4) for _ in range(20)] == [again.pick([0] * 4) for _ in range(20)]
    many = Router("random", 2, seed=1)
    picks = [many.pick([0, 0]) for _ in range(400)]
    assert 150 < sum(picks) < 250


def test_a_bad_policy_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="--engine-routing"):
        Router("round-robin", 2)
    settings = replace(Settings(), engine="http://127.0.0.1:9,http://127.0.0.1:10", engine_routing="nope")
    with pytest.raises(ValueError, match="--engine-routing"):
        Engines(settings, FakeClock())
    assert set(POLICIES) == {"random", "least-loaded", "prefix-aware", "sticky"}


def test_several_urls_are_replicas_one_is_the_engine_itself() -> None:
    clock = FakeClock()
    two = Engines(replace(Settings(), engine="http://127.0.0.1:9, http://127.0.0.1:10"), clock)
    assert isinstance(two.remote, Replicas)
    assert [e.url for e in two.remote.engines] == ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    one = Engines(replace(Settings(), engine="http://127.0.0.1:9"), clock)
    assert not isinstance(one.remote, Replicas)
    asyncio.run(two.remote.aclose())  # never started: nothing to close, and no error
