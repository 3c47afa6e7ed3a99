"""A shim: these helpers live in tests/helpers.py now. Only tests/test_ga_ws.py and tests/test_limits.py
still import them from here; once they import from helpers, delete this file.

``TOOLS`` here is helpers.ROLLOUT_TOOLS (the four tools of the ten-turn rollout), not helpers.TOOLS."""

from helpers import MODEL, ga_events, outputs_for, running
from helpers import ROLLOUT_TOOLS as TOOLS

__all__ = ["MODEL", "TOOLS", "ga_events", "outputs_for", "running"]
