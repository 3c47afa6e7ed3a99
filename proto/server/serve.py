"""Running the app: ``serve`` (the CLI, blocking) and ``serving`` (a server in a background thread,
on a free loopback port, for the demo, the lab and the tests)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import uvicorn
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.wsproto_impl import FrameTooLargeError, WebsocketBuffer, WSProtocol
from wsproto import events
from wsproto.connection import Connection, ConnectionState
from wsproto.frame_protocol import Opcode

from proto.core.actions import error_reply
from proto.core.errors import ClientError
from proto.processes import free_port
from proto.server.app import create_app
from proto.server.config import Settings, check_bind, resolve_http, resolve_loop
from proto.server.heads import HeadGate, default_cap, guarded
from proto.server.logs import configure
from proto.server.storage.database import DatabaseInUse
from proto.server.storage.ledger import LedgerError
from proto.server.storage.store import StoreUnavailable
from proto.server.transports.websocket import FRAMES_EXTENSION
from sampler.clock import Clock


def uvicorn_config(
    settings: Settings, clock: Clock | None = None, reconcile: bool = True, **extra: object
) -> uvicorn.Config:
    """The one configuration every way of serving uses (the CLI, each of N workers, the threaded test
    server): a fresh app for ``settings``, the same protocol class, limits, pings and shutdown timing.
    ``reconcile``: ``create_app``'s (a SQLite worker does not)."""
    return uvicorn.Config(
        create_app(settings, clock, reconcile),
        host=settings.host,
        port=settings.port,
        ws=LabWSProtocol,
        loop=resolve_loop(settings.loop),
        http=guarded(
            resolve_http(settings.http),
            HeadGate(settings.header_timeout_s, settings.max_unfinished_headers or default_cap()),
        ),
        ws_max_size=settings.max_frame_bytes,
        ws_per_message_deflate=settings.ws_per_message_deflate,
        ssl_certfile=settings.ssl_certfile or None,
        ssl_keyfile=settings.ssl_keyfile or None,
        ws_ping_interval=None,  # the lab measures its own pings; keep-alive traffic would perturb it
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        # then uvicorn cancels what still runs (SSE)
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
        **extra,  # type: ignore[arg-type]
    )


class _ReportingBuffer(WebsocketBuffer):
    """uvicorn's message buffer, telling its protocol when a message passes the size limit."""

    def __init__(self, max_length: int, report: Callable[[], None]) -> None:
        super().__init__(max_length)
        self._report = report

    def extend(self, event: events.TextMessage | events.BytesMessage) -> None:
        try:
            super().extend(event)
        except FrameTooLargeError:
            self._report()
            raise


class LabWSProtocol(WSProtocol):
    """uvicorn's wsproto protocol, with the two refusals a client should be able to read:

    * a message past ``--max-frame-bytes``: the typed ``message_too_large`` error frame, then uvicorn's
      close 1009 (uvicorn alone only closes);
    * a frame wsproto itself rejects (invalid UTF-8 in a text frame: 1007; a protocol error: 1002): the
      connection is failed with a close frame carrying that code, as RFC 6455 §7.1.7 asks (uvicorn 0.54
      hangs up without one);

    and one addition, offered to the app as the ASGI extension ``FRAMES_EXTENSION``: a ``websocket.send``
    message carrying a list of already-encoded UTF-8 text frames, written with one ``transport.write``
    (ASGI's ``text`` must be a ``str``: our frames would be decoded only to be encoded again, and sent one
    write each). With permessage-deflate negotiated the frames go through wsproto's own serializer (which
    compresses); without, a server's text frame is only a 2-, 4- or 10-byte header before the payload
    (RFC 6455 §5.2: no mask), written as such — wsproto's serializer copies and re-checks every frame
    (a tenth of the server's CPU per token when many streams run). The extension's ``write_now``
    (``scope["extensions"][FRAMES_EXTENSION]["write_now"](frames)``) writes the frames at once and returns
    True when a ``websocket.send`` would not have to wait; otherwise (uvicorn paused writing, the
    connection is closing) it writes nothing and returns False, and the app sends them the ASGI way,
    which waits or raises as ``send`` does. It saves a coroutine chain per write: a tenth of the CPU per
    token again (docs/decisions/0004-websocket-frame-bypass.md).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffer = _ReportingBuffer(self.config.ws_max_size, self._too_large)
        self._plain: bool | None = None  # no extension negotiated: known at the first frames sent

    def handle_connect(self, event: events.Request) -> None:
        super().handle_connect(event)
        self.scope["extensions"][FRAMES_EXTENSION] = {"write_now": self.write_now}

    async def send(self, message: Any) -> None:
        frames = message.get(FRAMES_EXTENSION) if message["type"] == "websocket.send" else None
        if frames is None:
            await super().send(message)
            return
        await self.writable.wait()  # back-pressure: the transport paused writing past its high-water mark
        if self.disconnected:
            raise ClientDisconnected()
        connection = self.conn.connection
        if not self.handshake_complete or connection is None or self.response_started:
            raise RuntimeError("websocket.send before the handshake completed")
        if self.close_sent or connection.state is not ConnectionState.OPEN or self.transport.is_closing():
            return  # as uvicorn does for a send after close: nothing more goes out
        self._write_frames(connection, frames)

    def write_now(self, frames: Sequence[bytes]) -> bool:
        """Write ``frames`` at once if a ``websocket.send`` of them would neither wait nor fail."""
        connection = self.conn.connection
        if (
            not self.writable.is_set()
            or self.disconnected
            or not self.handshake_complete
            or connection is None
            or self.response_started
            or self.close_sent
            or connection.state is not ConnectionState.OPEN
            or self.transport.is_closing()
        ):
            return False
        self._write_frames(connection, frames)
        return True

    def _write_frames(self, connection: Connection, frames: Sequence[bytes]) -> None:
        proto = connection._proto
        plain = self._plain
        if plain is None:
            # wsproto keeps every extension the server offered, negotiated or not; only enabled ones act.
            plain = self._plain = not any(ext.enabled() for ext in proto.extensions)
        if plain:
            if len(frames) == 1:  # a token's delta, the common case
                data = frames[0]
                self.transport.write(_text_header(len(data)) + data)
            else:
                self.transport.write(
                    b"".join([part for data in frames for part in (_text_header(len(data)), data)])
                )
        else:
            serialize = proto._serialize_frame  # whole messages only: no fragmented one is open
            self.transport.write(b"".join([serialize(Opcode.TEXT, data) for data in frames]))

    def _too_large(self) -> None:
        if self.close_sent or self.transport.is_closing():
            return
        limit = ClientError(
            "message_too_large",
            f"a message may be at most {self.config.ws_max_size} bytes (--max-frame-bytes)",
        )
        self.transport.write(self.conn.send(events.TextMessage(data=error_reply(limit).data.decode())))

    def handle_close(self, event: events.CloseConnection) -> None:
        if not self.close_sent and self.conn.state is ConnectionState.OPEN:
            self.transport.write(self.conn.send(events.CloseConnection(code=event.code, reason=event.reason)))
            self.close_sent = True
            self.queue.put_nowait(
                {"type": "websocket.disconnect", "code": event.code, "reason": event.reason}
            )
            self.transport.close()
            return
        super().handle_close(event)


_HEADER_16 = struct.Struct("!BBH")
_HEADER_64 = struct.Struct("!BBQ")
_FIN_TEXT = 0x81  # FIN, no RSV bits, opcode 1 (text)


_SHORT_HEADERS = [bytes((_FIN_TEXT, n)) for n in range(126)]


def _text_header(n: int) -> bytes:
    """A server's unmasked, unfragmented text frame header for an ``n``-byte payload (RFC 6455 §5.2)."""
    if n < 126:
        return _SHORT_HEADERS[n]
    if n < 65536:
        return _HEADER_16.pack(_FIN_TEXT, 126, n)
    return _HEADER_64.pack(_FIN_TEXT, 127, n)


class LabServer(uvicorn.Server):
    """uvicorn, whose shutdown (SIGTERM, SIGINT, ``should_exit``) first lets the app end its WebSocket
    sessions: uvicorn's own shutdown drops every WebSocket at once with 1012, and an open response would
    end without a word. Listening stops first, so nothing new arrives during the grace period; then
    uvicorn's shutdown runs as usual (lifespan shutdown: the ledger and the store are flushed and closed)."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        lab = getattr(getattr(self.config.app, "state", None), "server", None)
        if lab is not None:
            await lab.drain(lab.settings.shutdown_grace_s)
        await super().shutdown(sockets)


@contextlib.contextmanager
def start_up_refusals() -> Iterator[None]:
    """A database the server cannot use (unreachable, read-only, another server's) ends the start with
    its reason and exit code 1, not a traceback (docs/operations.md, "Databases")."""
    try:
        yield
    except (LedgerError, StoreUnavailable, DatabaseInUse) as exc:
        raise SystemExit(f"refusing to start: {exc}") from None


def serve(settings: Settings) -> None:
    """One API process (``--workers 1``); ``proto.server.workers.serve_workers`` runs N of them."""
    check_bind(settings)
    configure(settings.log_level)
    with start_up_refusals():
        config = uvicorn_config(settings)
    server = LabServer(config)
    freeze_startup_objects()
    server.run()


def freeze_startup_objects() -> None:
    """Everything built so far (modules, the app, the tokenizer's tables) lives as long as the process:
    ``gc.freeze`` moves it out of the collector's generations, so a full collection scans only what serving
    allocated. Without it every gen-2 collection walks the ~42 k start-up objects too (6 ms here, and
    10–50 ms seen as a stall of every stream at 160 streams; docs/decisions/0002-gc-freeze-at-startup.md).
    The ``gc`` docs recommend it after start-up; servers that fork workers use it the same way (Instagram's
    Django, gunicorn apps)."""
    gc.collect()  # garbage from start-up is freed, not frozen for ever
    gc.freeze()


class ThreadedServer:
    """uvicorn in a thread with its own event loop; ``url`` once started."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = replace(settings, port=settings.port or free_port(settings.host))
        self.server = LabServer(uvicorn_config(self.settings, clock))
        self.thread = threading.Thread(target=self._run, name="responses-lab-server", daemon=True)
        self.app = self.server.config.app
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's event loop, once started

    @property
    def http_url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    @property
    def url(self) -> str:
        return f"ws://{self.settings.host}:{self.settings.port}/v1/responses"

    def _run(self) -> None:
        # The configured loop (uvloop or asyncio), as the CLI's server runs it.
        with asyncio.Runner(loop_factory=self.server.config.get_loop_factory()) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve()

    def start(self) -> None:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread died during start-up")
            threading.Event().wait(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@contextlib.contextmanager
def serving(settings: Settings | None = None, **overrides: object) -> Iterator[str]:
    """``with serving(db=":memory:") as url:`` → ``ws://127.0.0.1:PORT/v1/responses``."""
    base = settings or Settings(db=":memory:", port=0)
    server = ThreadedServer(replace(base, **overrides))  # type: ignore[arg-type]
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
