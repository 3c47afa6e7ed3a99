"""A server-sent events parser, sans-IO: push the body's bytes in as they arrive (split anywhere), pull
complete events out. The asyncio HTTP client (``proto/client/http.py``) and the gevent load tool
(``scripts/locustfile.py``) share it.

It follows the WHATWG HTML "Server-sent events" parsing rules: lines end with CRLF, LF or CR; a blank line
dispatches the event; ``data`` lines join with ``\\n``; one space after the colon is dropped; a line that
starts with a colon is a comment; an event with no data is not dispatched; a leading BOM is dropped; what
is left unterminated when the body ends is discarded. Our server's frames are ``event: TYPE`` then
``data: JSON`` then a blank line (docs/protocol.md, "5. HTTP and SSE"); only ``data`` carries the event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its ``event:`` name ("message" when none), its joined data, its last ``id:``."""

    event: str
    data: str
    id: str = ""


class SseParser:
    """``events = parser.feed(chunk)`` for each chunk of the body, in order; nothing else to call."""

    def __init__(self) -> None:
        self._tail = b""  # an unterminated line
        self._skip_lf = False  # the last chunk ended with CR: an LF opening the next one ends the same line
        self._started = False  # the BOM check is done
        self._event = ""
        self._data: list[str] = []
        self._id = ""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events this chunk completes (none while a line or an event is still open)."""
        if not chunk:
            return []
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        data = self._tail + chunk if self._tail else chunk
        if not self._started:
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._tail = data  # too short to tell yet
                return []
            self._started = True
            if data.startswith(_BOM):
                data = data[len(_BOM) :]
        events: list[SseEvent] = []
        start = 0
        for end in _LINE_END.finditer(data):
            event = self._line(data[start : end.start()].decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            start = end.end()
        self._tail = data[start:]
        self._skip_lf = start == len(data) and data.endswith(b"\r")
        return events

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        return None  # "retry" and unknown fields: nothing this client uses

    def _dispatch(self) -> SseEvent | None:
        data, name = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent(name or "message", "\n".join(data), self._id)
