"""A prefix KV cache after vLLM's: full blocks keyed by chained hashes, ref counts, LRU eviction.

A block's key hashes its tokens *and* its predecessor's key, so a key names a whole prefix and
two prompts share a block only if they share everything before it. Only full blocks are cached.
The same capacity holds the blocks running requests compute into (``reserve``: not yet hashed, private
to one request): the scheduler (``sampler.batch``) admits and preempts by it.

A stored block may have a lifetime (prompt caching's ``ttl``: docs/mock-gpu.md, "Block lifetimes"): once no
sequence holds it and it has gone unused for that long on the cache's clock, it is no longer stored, and a
lookup that reaches it misses (and drops it). A block held by a sequence is in use and never expires.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from typing import overload

BlockKey = int


def salt_key(salt: str) -> BlockKey:
    """The parent of a prompt's first block for a tenant: the key chain starts from it, so two tenants
    never share a block (vLLM's ``cache_salt``, mixed into its first block's hash: docs/mock-gpu.md,
    "Prefix cache per tenant"). ``""``: unsalted, the chain starts from 0 as before. blake2b, not
    ``hash()``: a str's hash changes per process, and an engine in another process must agree."""
    if not salt:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little", signed=True)


def block_keys(tokens: Sequence[int], block_size: int, known: Sequence[BlockKey] = ()) -> list[BlockKey]:
    """The chained keys of every full block of ``tokens``. ``known`` are keys already computed
    for a prefix of these same tokens (a sequence's previous turn): only the rest is hashed."""
    keys = list(known)
    keys += chain_keys(tokens[len(keys) * block_size :], block_size, keys[-1] if keys else 0)
    return keys


def chain_keys(tokens: Sequence[int], block_size: int, parent: BlockKey) -> list[BlockKey]:
    """The keys of the full blocks of ``tokens``, which start on a block boundary right after the block
    whose key is ``parent`` (0: at the start of a prompt)."""
    keys: list[BlockKey] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        # Python's tuple hash of ints is 64-bit and not salted per process; a collision would be a
        # false hit, negligible for a simulator (vLLM offers sha256 for the real thing).
        parent = hash((parent, *tokens[start : start + block_size]))
        keys.append(parent)
    return keys


class TokenLog:
    """A conversation's token ids: 4 bytes each (``array('I')``; cl100k's ids are < 2**17), and append-only
    unless ``rewrite`` says otherwise. ``rewrites`` counts the changes that were not appends, so whoever saw
    the first ``n`` ids and the same ``rewrites`` later knows those ``n`` are unchanged without comparing
    them: that is what lets a long-lived response hash, match and pin only its new tail each turn.

    Change it only through these methods (``ids`` is exposed for reading and slicing)."""

    __slots__ = ("ids", "rewrites")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self.ids = array("I", ids)
        self.rewrites = 0

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Iterable[int]) -> None:
        self.ids.extend(ids)

    def append(self, token: int) -> None:
        self.ids.append(token)

    def rewrite(self, keep: int, ids: Iterable[int] = ()) -> None:
        """Keep the first ``keep`` ids and continue with ``ids`` (a truncation or an edit of the history)."""
        del self.ids[keep:]
        self.ids.extend(ids)
        self.rewrites += 1


class Prompt(Sequence[int]):
    """A turn's prompt without a copy of the context: the first ``length`` ids of ``log`` as they were at
    ``rewrites``, then ``suffix`` (the tokens that open the model's turn). A ``Sequence[int]`` (an engine in
    another process sends it whole: ``list(prompt)`` copies at C speed); ``tokens_from`` copies only the
    part asked for."""

    __slots__ = ("length", "log", "rewrites", "suffix")

    def __init__(self, log: TokenLog, length: int, rewrites: int, suffix: tuple[int, ...]) -> None:
        self.log, self.length, self.rewrites, self.suffix = log, length, rewrites, suffix

    @classmethod
    def of(cls, log: TokenLog, suffix: Iterable[int] = ()) -> Prompt:
        return cls(log, len(log), log.rewrites, tuple(suffix))

    def __len__(self) -> int:
        return self.length + len(self.suffix)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                part = self.tokens_from(start)
                del part[stop - start :]
                return part
            return list(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("prompt index out of range")
        return self.log.ids[index] if index < self.length else self.suffix[index - self.length]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.log.ids[: self.length], self.suffix)

    @property
    def current(self) -> bool:
        """The log has not been rewritten since this prompt was taken (its first ``length`` ids are as
        seen)."""
        return self.log.rewrites == self.rewrites and len(self.log) >= self.length

    def tokens_from(self, start: int) -> array[int]:
        out = self.log.ids[start : self.length] if start < self.length else array("I")
        out.extend(self.suffix[max(0, start - self.length) :])
        return out


def tokens_from(tokens: Sequence[int], start: int) -> MutableSequence[int]:
    """A copy of ``tokens[start:]``, for a plain sequence or a ``Prompt``."""
    if isinstance(tokens, Prompt):
        return tokens.tokens_from(start)
    return list(tokens[start:])


class PrefixCache:
    def __init__(self, capacity_blocks: int, block_size: int, now: Callable[[], float] | None = None) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        # The clock lifetimes run on: the GPU's (a test may move it on, to age what is stored).
        self.now = now or (lambda: 0.0)
        self._refs: dict[BlockKey, int] = {}  # every stored block -> holders (0 = evictable)
        self._free: OrderedDict[BlockKey, None] = OrderedDict()  # ref 0, oldest first = next evicted
        # A stored block's lifetime after its last use (inf: none, it leaves by eviction only) and that use:
        # when it was last acquired or let go.
        self._ttl: dict[BlockKey, float] = {}
        self._used: dict[BlockKey, float] = {}
        self.evictions = 0  # stored blocks dropped for room
        self.expirations = 0  # stored blocks dropped past their lifetime
        self.last_expired = 0  # blocks the last ``match`` found expired where its match stopped
        self.reserved = 0  # blocks allocated to running requests' uncached tokens (not hashed, not shared)
        self.queries = 0  # prompt tokens looked up (vLLM counts tokens, not blocks)
        self.hits = 0

    def _expired(self, key: BlockKey, now: float) -> bool:
        """``key`` is stored, free and past its lifetime: it is dropped now."""
        if self._refs.get(key) != 0 or now - self._used[key] < self._ttl[key]:
            return False
        self._drop(key)
        del self._free[key]
        self.expirations += 1
        return True

    def _drop(self, key: BlockKey) -> None:
        del self._refs[key], self._ttl[key], self._used[key]

    def match(self, keys: Sequence[BlockKey], prompt_tokens: int, held: int = 0) -> int:
        """How many leading blocks are stored. Counts the lookup in the hit-rate statistics.

        Like vLLM, the last prompt token is always recomputed (its logits are needed), so a block
        holding it never counts as a hit: at most ``(prompt_tokens - 1) // block_size`` blocks.
        ``held``: the caller holds the first ``held`` keys (so they are stored): only the rest is looked up.
        A block past its lifetime is a miss; ``last_expired`` counts those met where the match stopped.
        """
        limit = min(len(keys), max(0, prompt_tokens - 1) // self.block_size)
        n = min(held, limit)
        now = self.now()
        refs = self._refs
        expired = 0
        while n < limit and keys[n] in refs:
            if self._expired(keys[n], now):
                # the rest of its chain went unused as long: count (and drop) what of it expired too
                expired = 1
                while n + expired < limit and keys[n + expired] in refs:
                    if not self._expired(keys[n + expired], now):
                        break
                    expired += 1
                break
            n += 1
        self.last_expired = expired
        self.queries += prompt_tokens
        self.hits += n * self.block_size
        return n

    def acquire(self, keys: Sequence[BlockKey], ttl_s: float | None = None) -> list[BlockKey]:
        """Hold ``keys`` in order, storing missing ones (evicting LRU unreferenced blocks).
        Stops at the first block that finds no room: a prefix cache is useless past a gap.
        ``ttl_s``: the lifetime these blocks are written under (a stored block keeps the longer of its own
        and this one; a new block without one has none). Returns the keys actually held; hand exactly those
        back to ``release``."""
        held: list[BlockKey] = []
        now = self.now()
        life = math.inf if ttl_s is None else ttl_s
        for key in keys:
            refs = self._refs.get(key)
            if refs is not None and self._expired(key, now):
                refs = None
            if refs is None:
                if len(self._refs) + self.reserved >= self.capacity and not self._evict_one():
                    break
                refs = 0
                self._ttl[key] = life
            else:
                if refs == 0:
                    del self._free[key]
                if ttl_s is not None and ttl_s > self._ttl[key]:
                    self._ttl[key] = ttl_s
            self._refs[key] = refs + 1
            self._used[key] = now
            held.append(key)
        return held

    def reserve(self, blocks: int, force: bool = False) -> bool:
        """Allocate ``blocks`` private blocks, evicting LRU unreferenced ones for room. False (nothing
        allocated) when even that leaves too little; ``force``: allocate anyway, over capacity."""
        refs, free = self._refs, self._free
        while len(refs) + self.reserved + blocks > self.capacity:
            if not free:
                if not force:
                    return False
                break
            key, _ = free.popitem(last=False)
            self._drop(key)
            self.evictions += 1
        self.reserved += blocks
        return True

    def unreserve(self, blocks: int) -> None:
        self.reserved -= blocks

    def release(self, keys: Sequence[BlockKey]) -> None:
        # Freed tail-first (vLLM does the same): a chain's last blocks are evicted before its
        # first ones, and the first ones are what the next prompt will match.
        now = self.now()
        for key in reversed(keys):
            refs = self._refs[key] - 1
            self._refs[key] = refs
            if refs == 0:
                self._free[key] = None
                self._used[key] = now  # its lifetime runs from here

    def _evict_one(self) -> bool:
        if not self._free:
            return False
        key, _ = self._free.popitem(last=False)
        self._drop(key)
        self.evictions += 1
        return True

    def __contains__(self, key: object) -> bool:
        """Stored and not past its lifetime (an expired block found here is dropped)."""
        return key in self._refs and not self._expired(key, self.now())

    @property
    def blocks_stored(self) -> int:
        return len(self._refs)

    @property
    def blocks_used(self) -> int:
        """Blocks held by some sequence, running requests' private ones included (vLLM's KV usage counts
        these, not evictable ones)."""
        return len(self._refs) - len(self._free) + self.reserved

    @property
    def usage(self) -> float:
        return self.blocks_used / self.capacity if self.capacity else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
