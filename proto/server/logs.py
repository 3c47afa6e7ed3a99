"""structlog, configured once: JSON lines, contextvars (conn_id, response_id), keys never logged."""

from __future__ import annotations

import logging
import re
from collections.abc import MutableMapping
from typing import Any

import msgspec
import structlog

_SECRET_FIELDS = frozenset({"authorization", "api_key", "key", "token", "password"})
_BEARER = re.compile(r"(?i)bearer\s+\S+")
_encode = msgspec.json.Encoder().encode


def _serialize(obj: Any, **_: Any) -> str:
    # structlog's JSONRenderer passes ``default=``, which msgspec's encoder does not take: wrap it.
    return _encode(obj).decode()


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Drop secrets wherever they hide: by field name, and bearer tokens inside any string."""
    for name in list(event):
        if name.lower() in _SECRET_FIELDS:
            event[name] = "[redacted]"
        elif isinstance(event[name], str) and "earer" in event[name]:
            event[name] = _BEARER.sub("Bearer [redacted]", event[name])
    return event


def configure(level: str = "warning") -> None:
    # The one processors list, refilled in place: a logger cached on first use keeps the list it saw, so
    # a new list on every call (each in-process server's create_app calls this) would leave the loggers
    # already used on the old one, out of reach of later calls and of structlog.testing.capture_logs.
    processors = structlog.get_config()["processors"]
    processors[:] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        redact,  # after the traceback is text: an exception message may quote a header too
        structlog.processors.JSONRenderer(serializer=_serialize),
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        cache_logger_on_first_use=True,
    )
