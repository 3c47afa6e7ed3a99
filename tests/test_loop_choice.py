"""The server's event loop and HTTP parser are pinned by its configuration (``--loop``, ``--http``), never
left to uvicorn's silent "auto": uvloop and httptools when installed (they are, in the dev extras: the
suite serves on them), asyncio and h11 when asked; anything else is refused at start-up."""

from __future__ import annotations

import httpx
import pytest
from helpers import running

from proto.server.config import resolve_http, resolve_loop

pytestmark = pytest.mark.process  # every test starts a server or a process


def test_auto_serves_on_uvloop_and_httptools_and_either_can_be_pinned_off() -> None:
    assert resolve_loop("auto") == "uvloop" and resolve_http("auto") == "httptools"
    for overrides, loop_module, protocol in (
        ({}, "uvloop", "HttpToolsProtocol"),
        ({"loop": "asyncio", "http": "h11"}, "asyncio", "H11Protocol"),
    ):
        with running(**overrides) as srv:
            assert srv.loop is not None and type(srv.loop).__module__.split(".")[0] == loop_module
            # the class uvicorn serves with: the parser's own, behind the request-head guard
            # (docs/operations.md, "Unfinished request heads")
            served = srv.server.config.http_protocol_class
            assert protocol in [c.__name__ for c in served.__mro__]
            assert httpx.get(srv.http_url + "/healthz", timeout=10).status_code == 200


def test_an_unknown_loop_or_parser_is_refused() -> None:
    with pytest.raises(SystemExit, match="--loop must be auto, uvloop or asyncio"):
        resolve_loop("trio")
    with pytest.raises(SystemExit, match="--http must be auto, httptools or h11"):
        resolve_http("h2")
