"""What the sans-IO cores hand their adapters, shared by the long-lived core and the GA core."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from proto.core import codec
from proto.core.errors import ClientError, retry_headers
from proto.core.events import ErrorDetail, ErrorEvent, ResponseCreate
from proto.core.items import Item
from proto.core.work import WorkCounters


@dataclass(frozen=True)
class Reply:
    """Send these bytes to the client as one text frame."""

    data: bytes


@dataclass(frozen=True)
class Start:
    """Run this response: the pre-inference pipeline, then sampling."""

    response_id: str
    request: ResponseCreate
    items: list[Item]
    work: WorkCounters
    stream_id: str | None = None  # GA WebSocket mode's lane (None: the default lane)


def error_reply(exc: ClientError) -> Reply:
    """The GA error envelope: one ``error`` frame, no ``sequence_number``."""
    detail = ErrorDetail(type=exc.type, code=exc.code, message=exc.message, param=exc.param)
    headers = retry_headers(exc.retry_after_s) or None
    return Reply(codec.encode(ErrorEvent(status=exc.status, error=detail, headers=headers)))


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(16)
