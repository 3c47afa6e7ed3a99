"""No input can stall the loop (docs/decisions/0015-bounded-work-on-the-loop.md): texts that offer
tiktoken no safe cut point (one huge word, no letters, no newlines, CJK on one line, digits, base64) are
tokenized a bounded slice at a time, and an input past the context window is refused as soon as its tokens
so far prove it, before the rest is tokenized."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import statistics
import time

import httpx
import pytest
from helpers import GUARD, MODEL, TERMINAL_OR_ERROR, create, output, running, until
from websockets.asyncio.client import connect

from proto.load.chaos_stall import prose
from proto.processes import ChildServer
from sampler.tokens import RUN_CHARS, SLICE_CHARS

pytestmark = pytest.mark.process  # every test starts a server or a process

# Each past the window (131 072 tokens): before the fix, tokenized whole on the loop (0.1 s to seconds).
CHARS = 512 * 1024
rng = random.Random(7)
SHAPES = {
    "one word (a)": "a" * (3 * CHARS),  # 8 characters a token
    "one word (letters)": "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=CHARS)),
    "no letters": "".join(rng.choices("!#$%&*+-/<=>?@^_|~", k=CHARS)),
    "CJK, one line": "".join(chr(0x4E00 + rng.randrange(20_000)) for _ in range(CHARS)),
    "digits": "".join(rng.choices("0123456789", k=CHARS)),
    "base64": base64.b64encode(rng.randbytes(CHARS * 3 // 4)).decode(),
}
HEAVY_S = 120.0  # a guard only: before the fix one word of 512 Ki letters took seconds to tokenize


def body(text: str) -> bytes:
    return json.dumps({"model": MODEL, "input": text, "store": False}, ensure_ascii=False).encode()


async def heavy(http_url: str, ws_url: str, payloads: list[bytes]) -> list[str]:
    """Each payload as a create, alternately over GA WebSocket and HTTP; what ended each (an error code or
    a terminal event's type)."""
    ended: list[str] = []
    async with (
        connect(ws_url, max_size=None) as ws,
        httpx.AsyncClient(base_url=http_url, timeout=HEAVY_S) as http,
    ):
        for i, payload in enumerate(payloads):
            if i % 2 == 0:
                await ws.send(b'{"type":"response.create",' + payload[1:], text=True)
                while (last := json.loads(await asyncio.wait_for(ws.recv(), HEAVY_S)))["type"] not in (
                    TERMINAL_OR_ERROR
                ):
                    pass
                ended.append(last["error"]["code"] if last["type"] == "error" else last["type"])
            else:
                reply = await http.post(
                    "/v1/responses", content=payload, headers={"content-type": "application/json"}
                )
                ended.append(
                    reply.json()["error"]["code"] if reply.status_code >= 400 else reply.json()["status"]
                )
    return ended


async def pings(ws_url: str, until_done: asyncio.Future[object] | None, seconds: float) -> list[float]:
    """Round trips (s) of WebSocket pings on a connection of their own, one after another, for
    ``seconds`` or until ``until_done`` is done."""
    rtts: list[float] = []
    async with connect(ws_url) as ws:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and not (until_done is not None and until_done.done()):
            sent = time.perf_counter()
            await asyncio.wait_for(await ws.ping(), HEAVY_S)
            rtts.append(time.perf_counter() - sent)
            await asyncio.sleep(0.002)
    return rtts


async def beside(http_url: str, ws_url: str, payloads: list[bytes]) -> tuple[list[float], list[str]]:
    """Ping round trips on a connection of their own while ``payloads`` are sent on others (the heavy
    client on a loop and thread of its own, as in tests/test_bounds.py), and what ended each payload."""
    done = asyncio.ensure_future(asyncio.to_thread(asyncio.run, heavy(http_url, ws_url, payloads)))
    rtts = await pings(ws_url, done, HEAVY_S)
    return rtts, await done


@pytest.mark.serial
async def test_no_input_shape_stalls_another_connection() -> None:
    # Encoded before the clock: this process's own work. The control: prose of the same lengths, a cut
    # point every word, as far past the window.
    payloads = [body(text) for text in SHAPES.values()]
    control = [body(prose(len(text))) for text in SHAPES.values()]
    # A server process of its own: the round trips measured are the server's, not this process's GIL.
    with ChildServer() as server:
        http_url = f"http://127.0.0.1:{server.port}"
        await heavy(http_url, server.ws_url, [body("!say warm"), body("!say warm")])  # first-use costs
        floor, _ = await beside(http_url, server.ws_url, control)
        loaded, ended = await beside(http_url, server.ws_url, payloads)
    print(
        f"ping rtt beside prose: median {statistics.median(floor) * 1e3:.2f} ms"
        f" max {max(floor) * 1e3:.2f} ms;"
        f" beside the shapes: median {statistics.median(loaded) * 1e3:.2f} ms max {max(loaded) * 1e3:.2f} ms"
        f" ({len(loaded)} pings); ended: {dict(zip(SHAPES, ended, strict=True))}"
    )
    # Against the floor of the same run: the worst round trip beside inputs of the same size that always
    # had cut points. Before bounded slices, one shape held the loop for seconds.
    assert max(loaded) < max(3 * max(floor), max(floor) + 0.010), (max(loaded), max(floor))
    # Every input was refused, the moment its tokens so far passed the window.
    assert ended == ["context_length_exceeded"] * len(SHAPES), ended


async def test_an_input_past_the_window_is_refused_before_the_rest_is_tokenized() -> None:
    window = 131_072  # the catalogue's models (sampler/models.py, ModelLimits)
    text = "word " * 3_000_000  # 3 M tokens, 15 MB: 23 times the window
    with running() as srv:
        async with (
            connect(srv.url, max_size=None) as ga,
            connect(srv.url + "?protocol=longlived", max_size=None) as longlived,
            httpx.AsyncClient(base_url=srv.http_url, timeout=GUARD) as http,
        ):
            errors = []
            for ws in (ga, longlived):
                await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": text}))
                [event] = await until(ws, TERMINAL_OR_ERROR)
                assert event["type"] == "error", event
                errors.append(event["error"])
            for stream in (False, True):
                reply = await http.post(
                    "/v1/responses", json={"model": MODEL, "input": text, "stream": stream}
                )
                assert reply.status_code == 400, reply.text[:300]
                errors.append(reply.json()["error"])
            # the same typed error on every transport
            assert {(e["type"], e["code"], e["param"]) for e in errors} == {
                ("invalid_request_error", "context_length_exceeded", "input")
            }, errors
            # It stopped counting one slice past the window: never 3 M tokens.
            for error in errors:
                counted = int(error["message"].split("at least ")[1].split(")")[0])
                assert window < counted <= window + SLICE_CHARS + RUN_CHARS, error["message"]
            # Each connection serves on.
            await ga.send(json.dumps({"type": "response.create", "model": MODEL, "input": "!say ok"}))
            assert (await until(ga, TERMINAL_OR_ERROR))[-1]["type"] == "response.completed"


async def test_an_append_past_the_window_is_refused_before_the_rest_is_tokenized() -> None:
    """A long-lived response's appended tool output is held to the window as a create's input is: counted
    from the conversation's tokens so far, and refused one slice past it (the response fails with
    ``context_length_exceeded``), never tokenized whole."""
    window = 131_072
    text = "word " * 3_000_000
    with running() as srv:
        async with connect(srv.url + "?protocol=longlived", max_size=None) as ws:
            await ws.send(json.dumps(create("!call grep {}\n!say never")))
            done = (await until(ws, {"response.done", *TERMINAL_OR_ERROR}))[-1]
            assert done["type"] == "response.done", done
            call_id = done["pending_calls"][0]["call_id"]
            await ws.send(json.dumps({"type": "response.append", "input": [output(call_id, text)]}))
            terminal = (await until(ws, TERMINAL_OR_ERROR))[-1]
            assert terminal["type"] == "response.failed", terminal
            error = terminal["response"]["error"]
            assert error["code"] == "context_length_exceeded", error
            counted = int(error["message"].split("at least ")[1].split(")")[0])
            assert window < counted <= window + SLICE_CHARS + RUN_CHARS, error["message"]
            # The connection serves on.
            await ws.send(json.dumps(create("!say ok")))
            assert (await until(ws, TERMINAL_OR_ERROR))[-1]["type"] == "response.completed"
