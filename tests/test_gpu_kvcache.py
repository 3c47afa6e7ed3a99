"""The prefix cache alone: chained keys, matching, ref counts, LRU eviction order."""

from sampler.kvcache import PrefixCache, block_keys

BS = 4


def test_keys_only_for_full_blocks() -> None:
    assert len(block_keys(list(range(11)), BS)) == 2
    assert len(block_keys(list(range(12)), BS)) == 3


def test_keys_are_chained_on_the_prefix() -> None:
    a = block_keys([1, 2, 3, 4, 5, 6, 7, 8], BS)
    b = block_keys([9, 9, 9, 9, 5, 6, 7, 8], BS)  # same second block, different first
    assert a[1] != b[1]
    assert block_keys([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0], BS)[:2] == a


def test_known_prefix_keys_are_reused_unchanged() -> None:
    tokens = list(range(40))
    assert block_keys(tokens, BS, block_keys(tokens[:17], BS)) == block_keys(tokens, BS)


def test_match_counts_full_block_prefix_and_recomputes_last_token() -> None:
    c = PrefixCache(100, BS)
    tokens = list(range(12))
    c.release(c.acquire(block_keys(tokens, BS)))
    # 12 tokens = 3 full blocks, but the last token is always recomputed: 2 blocks hit.
    assert c.match(block_keys(tokens, BS), 12) == 2
    assert c.match(block_keys([*tokens, 99], BS), 13) == 3
    assert (c.queries, c.hits) == (25, 20)
    other = block_keys([0, 1, 2, 3, 0, 0, 0, 0, 8, 9, 10, 11, 1], BS)  # diverges in block 2
    assert c.match(other, 13) == 1


def test_refcounts_keep_blocks_from_eviction() -> None:
    c = PrefixCache(2, BS)
    held = c.acquire(block_keys(list(range(8)), BS))
    assert c.blocks_used == 2 and c.usage == 1.0
    assert c.acquire(block_keys([7] * 8, BS)) == []  # no room: everything pinned
    c.release(held)
    assert c.blocks_used == 0 and c.blocks_stored == 2
    assert len(c.acquire(block_keys([7] * 8, BS))) == 2


def test_lru_eviction_order_tail_first() -> None:
    c = PrefixCache(4, BS)
    a, b = block_keys(list(range(8)), BS)
    (x,) = block_keys([50, 51, 52, 53], BS)
    c.release(c.acquire([a, b]))  # freed tail-first: b is older than a
    c.release(c.acquire([x]))
    d, e, f = block_keys([9] * 12, BS)
    assert c.acquire([d, e, f]) == [d, e, f]
    assert b not in c and a not in c and x in c  # evicted b, then a; x was released last


def test_reuse_refreshes_lru_position() -> None:
    c = PrefixCache(3, BS)
    (a,) = block_keys([1] * 4, BS)
    (b,) = block_keys([2] * 4, BS)
    c.release(c.acquire([a]))
    c.release(c.acquire([b]))
    c.release(c.acquire([a]))  # a is now the most recent
    d, e = block_keys([3] * 8, BS)
    c.acquire([d, e])
    assert a in c and b not in c


def test_shared_blocks_need_every_holder_released() -> None:
    c = PrefixCache(10, BS)
    keys = block_keys(list(range(8)), BS)
    h1, h2 = c.acquire(keys), c.acquire(keys)
    c.release(h1)
    assert c.blocks_used == 2
    c.release(h2)
    assert c.blocks_used == 0


def test_a_free_block_expires_its_lifetime_after_its_last_use() -> None:
    """Lifetimes run on the cache's clock from a block's last use; a held block is in use and never expires;
    a block without one leaves by eviction only; a rewrite keeps the longer lifetime."""
    now = [0.0]
    c = PrefixCache(100, BS, lambda: now[0])
    short, long_, forever = (block_keys(list(range(k, k + 12)), BS) for k in (0, 100, 200))
    c.release(c.acquire(short, 60.0))
    c.release(c.acquire(long_[:2], 3600.0))
    c.release(c.acquire(long_[2:], 60.0))  # the third block: under the short lifetime only
    held = c.acquire(forever[:1], 1.0)
    c.release(c.acquire(forever[1:]))
    now[0] = 59.0
    assert c.match(short, 13) == 3 and c.last_expired == 0  # a lookup, not a use (a turn's pins are)
    now[0] = 59.0 + 60.0
    assert c.match(short, 13) == 0 and c.last_expired == 3  # all three expired, and are dropped
    assert c.expirations == 3 and short[0] not in c
    assert c.match(long_, 13) == 2 and c.last_expired == 1  # the third block is past its 60 s
    assert c.match(forever, 13) == 3  # held, and without a lifetime
    c.release(held)
    c.release(c.acquire(long_[:1], 60.0))  # a shorter rewrite keeps the longer lifetime
    now[0] += 3599.0  # 3718 s: the first block was used at 119 s, the second at 0
    assert c.match(long_, 13) == 1 and c.last_expired == 1
    assert c.match(forever, 13) == 0  # let go at 119 s, with a lifetime of 1 s
