"""A shim: these helpers live in tests/helpers.py now. Only tests/test_limits.py still imports them from
here; once it imports from helpers, delete this file."""

from helpers import (
    MODEL,
    TERMINAL,
    TOOLS,
    assert_error,
    create,
    ga_rollout_ok,
    longlived_rollout_ok,
    outputs,
    recv,
    until,
)

__all__ = ["MODEL", "TERMINAL", "TOOLS", "assert_error", "create", "ga_rollout_ok", "longlived_rollout_ok", "outputs", "recv", "until"]
