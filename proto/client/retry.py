"""When to ask again after a create refused at the door (docs/protocol.md, "Admission"), the way OpenAI's
Python SDK does (``openai/_base_client.py``, ``_calculate_retry_timeout``): the server's hint when it gives
one between 0 and 120 s — ``retry-after-ms`` first, then ``retry-after`` in seconds — else exponential
backoff from 0.5 s, doubling per attempt up to 8 s, less up to 25 % jitter.

The hint comes as HTTP headers, or as the WebSocket error envelope's ``headers`` object.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

__all__ = ["REFUSED", "retry_delay"]

REFUSED = "rate_limit_exceeded"  # the code of a create refused at the door: nothing started, ask again
INITIAL_S = 0.5  # the SDK's INITIAL_RETRY_DELAY
MAX_S = 8.0  # its MAX_RETRY_DELAY
MAX_HINT_S = 120.0  # its MAX_RETRY_AFTER_DELAY: a longer hint is not waited for


def retry_delay(headers: Mapping[str, str] | None, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry)."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = (headers or {}).get(name)
        try:
            hint = float(value) * scale if value is not None else None
        except ValueError:
            hint = None
        if hint is not None:
            if 0.0 < hint <= MAX_HINT_S:
                return hint
            break
    backoff = min(INITIAL_S * 2.0 ** (attempt - 1), MAX_S)
    return backoff * (1.0 - 0.25 * (rng or random).random())
