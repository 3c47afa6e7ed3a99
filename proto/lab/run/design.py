"""The experiment's design (docs/lab.md, "Method"): in what order the modes run each rollout, and which tool
times each rollout draws. Pure: no clock, no I/O.

* **Order.** Rollout index ``i`` runs every mode once, in row ``i`` of a Williams design (a balanced Latin
  square; Williams 1949, "Experimental designs balanced for the estimation of residual effects of
  treatments"): over ``m`` indices (``2m`` for an odd number of modes) each mode runs in every position
  equally often and follows every other mode equally often, so neither a position (a warmer server, a cooler
  CPU) nor the mode run just before favours a mode.
* **Tool times.** A synthetic workload's rollout ``(i, s)`` (index, session) draws its tool times from the
  workload's distribution (``workload/synthetic.py``, ``tool_time_s``) with :func:`rollout_seed`: every mode
  replays the same draw, and a cell covers several draws. A trace keeps its recorded tool times (they are
  the trace).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from proto.lab.workload.synthetic import tool_time_s
from proto.lab.workload.traces import Session


def williams_rows(m: int) -> list[list[int]]:
    """The rows of a Williams design for ``m`` treatments: ``m`` rows when ``m`` is even, ``2m`` when odd
    (the square and its mirror)."""
    if m <= 0:
        return []
    first, lo, hi = [0], 1, m - 1
    while len(first) < m:  # 0, 1, m-1, 2, m-2, ...
        if len(first) % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % m for x in first] for r in range(m)]
    if m % 2:
        rows += [row[::-1] for row in rows]
    return rows


def mode_order(modes: Sequence[str], index: int) -> tuple[str, ...]:
    """The order rollout index ``index`` runs ``modes`` in: row ``index`` (cyclically) of the Williams
    design over them."""
    rows = williams_rows(len(modes))
    if not rows:
        return ()
    return tuple(modes[k] for k in rows[index % len(rows)])


def rollout_seed(seed: int, index: int, session: int) -> int:
    """The tool-time seed of rollout ``index`` of session ``session`` in a run seeded ``seed``."""
    return seed * 1_000_000 + index * 1_000 + session


def draw_tool_times(session: Session, seed: int) -> Session:
    """``session`` with each tool round's wait drawn again: per call from the fitted tool-time distribution,
    the round waiting for its slowest call (parallel calls overlap), as the shipped workloads were drawn
    (workload/synthetic.py). Rounds without calls keep their wait. Same seed, same times. A session whose
    workload wrote its times as they are (``tool_times`` "fixed": a user's own file) keeps them."""
    if not session.drawn:
        return session
    rng = random.Random(seed)
    rounds = tuple(
        dataclasses.replace(r, tool_wait_s=round(max(tool_time_s(rng) for _ in r.calls), 3)) if r.calls else r
        for r in session.rounds
    )
    return dataclasses.replace(session, rounds=rounds)
