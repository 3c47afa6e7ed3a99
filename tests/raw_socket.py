"""A WebSocket on a plain socket (RFC 6455 by hand, wsproto for the handshake), for frames that no
conforming client library will send."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

import wsproto
from helpers import GUARD
from wsproto.events import AcceptConnection, CloseConnection, Request


def raw_invalid_utf8_close_code(url: str) -> int | None:
    """Open a WebSocket on a plain socket and send one *text* frame whose payload is not UTF-8 (no
    conforming client library will): the close code the server answers with, or None if it just hung up."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    with socket.create_connection((host, port), timeout=GUARD) as sock:
        sock.sendall(conn.send(Request(host=f"{host}:{port}", target=target)))
        accepted = False
        while not accepted:
            conn.receive_data(sock.recv(65536))
            accepted = any(isinstance(event, AcceptConnection) for event in conn.events())
        payload = b'{"type": "response.create", "input": "\xff\xfe"}'
        mask = os.urandom(4)
        masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)  # FIN + text; masked, short length
        while True:
            data = sock.recv(65536)
            if not data:
                return None
            conn.receive_data(data)
            for event in conn.events():
                if isinstance(event, CloseConnection):
                    return event.code
