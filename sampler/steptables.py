"""The kernel time of one engine step, read from a GPU profile's step tables (``sampler/profiles/*.json``).

A step's time is the sum of three measured parts (docs/mock-gpu.md, "Step tables"):

* outside attention (GEMMs, norms, all-reduce, logits), by the tokens in the step;
* each prefill chunk's attention, by the chunk's tokens × the tokens already in KV before it;
* the decodes' attention, by their number × their mean context.

The tables come from NVIDIA's AIConfigurator (``scripts/gen_step_tables.py``, which names the package and
version in each profile's ``provenance``); this module reads them with the standard library only, and
interpolates linearly between knots (bilinearly on the two-axis tables), extrapolating from the last two
knots past either end. Host overhead is not in ``step_ms``: it is the profile's ``step-overhead`` knob.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

__all__ = ["PROFILES_DIR", "StepTables", "profiles"]

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


def profiles() -> list[str]:
    """The committed profile names (``sampler/profiles/<name>.json``)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def _segment(knots: Sequence[float], x: float) -> tuple[int, float]:
    """The knot interval holding ``x`` (the first or last one outside the range) and the weight of its right
    end (< 0 or > 1 outside the range: linear extrapolation)."""
    i = bisect_right(knots, x) - 1
    last = len(knots) - 2
    i = 0 if i < 0 else (last if i > last else i)
    lo = knots[i]
    return i, (x - lo) / (knots[i + 1] - lo)


class _Line:
    __slots__ = ("knots", "values")

    def __init__(self, knots: Sequence[float], values: Sequence[float]) -> None:
        if len(knots) < 2 or len(knots) != len(values) or any(b <= a for a, b in pairwise(knots)):
            raise ValueError("a table needs >= 2 strictly increasing knots, one value each")
        self.knots = [float(k) for k in knots]
        self.values = [float(v) for v in values]

    def __call__(self, x: float) -> float:
        i, w = _segment(self.knots, x)
        v = self.values
        return v[i] + (v[i + 1] - v[i]) * w


class _Grid:
    __slots__ = ("cols", "rows", "values")

    def __init__(
        self, rows: Sequence[float], cols: Sequence[float], values: Sequence[Sequence[float]]
    ) -> None:
        _Line(rows, [0.0] * len(rows)), _Line(cols, [0.0] * len(cols))  # validates both axes
        if len(values) != len(rows) or any(len(r) != len(cols) for r in values):
            raise ValueError("a grid needs one row per row knot and one value per column knot")
        self.rows = [float(k) for k in rows]
        self.cols = [float(k) for k in cols]
        self.values = [[float(v) for v in r] for r in values]

    def __call__(self, r: float, c: float) -> float:
        i, u = _segment(self.rows, r)
        j, w = _segment(self.cols, c)
        top, bottom = self.values[i], self.values[i + 1]
        a = top[j] + (top[j + 1] - top[j]) * w
        b = bottom[j] + (bottom[j + 1] - bottom[j]) * w
        return a + (b - a) * u


class StepTables:
    """One profile's tables. ``step_ms`` is the kernel time of a step, host overhead excluded."""

    def __init__(
        self,
        name: str,
        provenance: dict[str, object],
        knobs: dict[str, dict[str, object]],
        nonattn: _Line,
        prefill: _Grid,
        decode: _Grid,
    ) -> None:
        self.name = name
        self.provenance = provenance
        self.knobs = knobs  # name -> {"value", "unit", "source"}: what the tables do not give
        self._nonattn = nonattn
        self._prefill = prefill
        self._decode = decode

    @classmethod
    def load(cls, profile: str) -> StepTables:
        """Read ``sampler/profiles/<profile>.json``; KeyError naming the known profiles when absent."""
        path = PROFILES_DIR / f"{profile}.json"
        if "/" in profile or not path.is_file():
            raise KeyError(f"unknown GPU profile {profile!r}; known: {', '.join(profiles())}")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTables:
        na, pre, dec = data["nonattn"], data["prefill"], data["decode"]
        return cls(
            str(data["profile"]),
            dict(data["provenance"]),
            dict(data.get("knobs", {})),
            _Line(na["tokens"], na["ms"]),
            _Grid(pre["chunk"], pre["prefix"], pre["ms"]),
            _Grid(dec["batch"], dec["context"], dec["ms"]),
        )

    def knob(self, name: str) -> float:
        """A hand-set knob's value (``knobs[name]["value"]``)."""
        value = self.knobs[name]["value"]
        if not isinstance(value, int | float):
            raise TypeError(f"knob {name!r} of {self.name} is not a number: {value!r}")
        return float(value)

    def step_ms(self, prefill: Sequence[tuple[int, int]], decode_ctx: Sequence[int]) -> float:
        """Kernel time of one engine step in ms, host overhead excluded. ``prefill``: one
        ``(chunk_tokens, tokens_already_in_kv)`` per sequence prefilling in this step; ``decode_ctx``: the
        context length of each decoding sequence. An empty step costs 0."""
        n = len(decode_ctx)
        tokens = n
        ms = 0.0
        for chunk, prefix in prefill:
            if chunk > 0:
                tokens += chunk
                ms += self._prefill(chunk, prefix)
        if n:
            ms += self._decode(n, sum(decode_ctx) / n)
        if tokens == 0:
            return 0.0
        return ms + self._nonattn(tokens)

    def nonattn_ms(self, tokens: int) -> float:
        return self._nonattn(tokens)

    def prefill_attention_ms(self, chunk: int, prefix: int) -> float:
        return self._prefill(chunk, prefix)

    def decode_attention_ms(self, batch: int, mean_context: float) -> float:
        return self._decode(batch, mean_context)
