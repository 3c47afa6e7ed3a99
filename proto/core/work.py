"""Work counters: what the API pipeline actually did, per response.

Tests assert on them ("each input token tokenized once"); the terminal event exposes them in
``response.lab.work`` and ``/metrics`` sums them. Plain ints, sans-IO.
"""

from __future__ import annotations

import msgspec


class WorkCounters(msgspec.Struct, kw_only=True):
    requests_validated: int = 0
    items_validated: int = 0
    chars_scanned: int = 0
    items_rendered: int = 0
    tokenize_calls: int = 0
    tokens_tokenized: int = 0
    model_resolutions: int = 0
    store_reads: int = 0
    store_writes: int = 0
    references_resolved: int = 0  # item_reference inputs replaced by the stored item they name
    ledger_rows: int = 0
    safety_hops: int = (
        0  # calls to the remote safety classifier the design makes (--safety-hop-ms each, 0 by default)
    )
    item_cache_hits: int = 0  # http-cached: body segments whose scan and tokens came from the item cache
    item_cache_misses: int = 0  # http-cached: body segments scanned and tokenized, then cached

    def merge(self, other: WorkCounters) -> None:
        for name in self.__struct_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
