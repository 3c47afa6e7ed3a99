"""An empty key is no key (docs/operations.md, "Security"): refused at start-up, on the command line and in
the environment alike, so that ``--api-key "$KEY"`` with ``KEY`` unset cannot open a public bind; and a
blank bearer token is never a match, on any route or the WebSocket upgrade."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from helpers import GUARD, clean_env, cli_command, running
from starlette.datastructures import Headers

from proto.server.auth import Auth

KEY = "sk-real-0123456789abcdef"
BLANK_TOKENS = ["Bearer  ", "Bearer \t", "Bearer \xa0", "Bearer \xa0 \xa0", "bearer   "]


@pytest.mark.parametrize(
    "keys", [[""], [" "], [KEY, ""], [KEY, "\xa0"]], ids=["empty", "space", "and-empty", "nbsp"]
)
def test_an_empty_or_blank_key_is_refused_before_anything_serves(keys: list[str]) -> None:
    with pytest.raises(SystemExit, match="empty key"):
        Auth(keys)


@pytest.mark.parametrize("header", BLANK_TOKENS)
def test_a_blank_token_identifies_nobody(header: str) -> None:
    assert Auth([KEY]).identify(Headers({"authorization": header})) is None
    assert (
        Auth([KEY]).identify(Headers({"authorization": f"Bearer  {KEY} "})) is not None
    )  # padding is not a key


@pytest.mark.process
@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (["--api-key", KEY, "--api-key="], {}),
        (["--api-key", ""], {}),
        ([], {"RESPONSES_LAB_API_KEY": " "}),
        ([], {"RESPONSES_LAB_API_KEY": f"{KEY}, "}),
    ],
    ids=["flag-empty-beside-a-key", "flag-empty", "env-blank", "env-blank-beside-a-key"],
)
def test_serve_refuses_an_empty_key_with_a_clear_message(flags: list[str], env: dict[str, str]) -> None:
    """Off loopback: before, each of these counted as keyed, bound 0.0.0.0 and served (the run never
    ended)."""
    try:
        done = subprocess.run(
            [*cli_command(), "serve", "--host", "0.0.0.0", "--port", "0", "--db", ":memory:", *flags],
            capture_output=True,
            text=True,
            timeout=30,
            env={**clean_env(), **env},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the server started on an empty key") from exc
    assert done.returncode != 0
    assert "empty key" in done.stderr and "--api-key" in done.stderr, done.stderr


async def status_of(url: str, method: str, path: str, header: str, upgrade: bool = False) -> int:
    """The status line of one request sent on a plain socket: HTTP clients refuse to send a header value
    that ends in whitespace, which is what is being tested."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Authorization: {header}", "Content-Length: 2"]
    if upgrade:
        lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13"]
        lines += ["Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if upgrade else b"{}"))
    try:
        status = await asyncio.wait_for(reader.readline(), GUARD)
    finally:
        writer.close()
    return int(status.split()[1])


@pytest.mark.process
async def test_blank_tokens_are_refused_on_every_route_and_the_upgrade() -> None:
    from test_security import HTTP_ENDPOINTS, WS_PROTOCOLS

    with running(api_key=[KEY]) as srv:
        for method, path in HTTP_ENDPOINTS:
            for header in BLANK_TOKENS:
                assert await status_of(srv.http_url, method, path, header) == 401, (method, path, header)
            assert await status_of(srv.http_url, method, path, f"Bearer {KEY}") != 401, (method, path)
        for query in WS_PROTOCOLS:
            for header in BLANK_TOKENS:
                status = await status_of(srv.http_url, "GET", "/v1/responses" + query, header, upgrade=True)
                assert status == 401, (query, header)
            assert await status_of(srv.http_url, "GET", "/v1/responses" + query, f"Bearer {KEY}", True) == 101
