"""The tiny buggy repository the demo's agent fixes: ``mean`` skips the last value, and both tests fail.

The buggy and fixed sources, and the model's patch between them, live side by side so that nothing the
script sends can drift from what the repository holds.
"""

from __future__ import annotations

import difflib
from pathlib import Path

BUGGY_STATS = '''\
"""Tiny statistics helpers."""


def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    total = 0.0
    for i in range(len(values) - 1):
        total += values[i]
    return total / len(values)
'''

FIXED_STATS = BUGGY_STATS.replace("range(len(values) - 1)", "range(len(values))")

TEST_STATS = """\
from stats import mean


def test_mean_of_four() -> None:
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_of_one() -> None:
    assert mean([7]) == 7


if __name__ == "__main__":  # also runs without pytest: `python test_stats.py`
    test_mean_of_four()
    test_mean_of_one()
    print("2 passed")
"""

# The model's fix, as a unified diff (what `git diff` would print), derived from the two versions so the
# script and the fixture cannot drift apart.
FIX_PATCH = "".join(
    difflib.unified_diff(
        BUGGY_STATS.splitlines(keepends=True),
        FIXED_STATS.splitlines(keepends=True),
        "a/stats.py",
        "b/stats.py",
        n=2,
    )
)


def make_repo(root: Path) -> Path:
    """Write the buggy repository into ``root`` (created if missing); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stats.py").write_text(BUGGY_STATS, encoding="utf-8")
    (root / "test_stats.py").write_text(TEST_STATS, encoding="utf-8")
    return root
