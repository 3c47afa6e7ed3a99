"""The servers the perf suite measures: ``responses-lab serve`` in a child process (this checkout's or
another's, optionally under py-spy), and the stack's floor — a bare starlette + uvicorn(wsproto) app."""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from proto.processes import ChildServer, free_port

PROFILE: list[str] = []  # --profile DIR: every server runs under py-spy, its raw stacks written there


def servers(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(label, checkout) of every server a command runs: ``before`` (``--compare DIR``) first, then this one
    (or ``--server-path DIR``'s, labelled ``other`` when there is nothing to compare it with)."""
    pairs: list[tuple[str, str | None]] = []
    if args.compare:
        pairs.append(("before", args.compare))
    pairs.append(("this" if args.compare or not args.server_path else "other", args.server_path))
    return pairs


@contextlib.contextmanager
def lab_server(flags: Sequence[str], server_path: str | None) -> Iterator[ChildServer]:
    """``responses-lab serve FLAGS`` in a child process, from ``server_path`` when given."""
    with ChildServer(["--log-level", "error", *flags], pythonpath=server_path) as server:
        if not PROFILE:
            yield server
            return
        with py_spy(server, Path(PROFILE[0])):
            yield server


@contextlib.contextmanager
def py_spy(server: ChildServer, directory: Path) -> Iterator[None]:
    """py-spy attached to a running server (start-up is not in the profile), its raw stacks written to
    ``directory``. ``--nonblocking``: the server is not paused per sample (its figures stay close to an
    unprofiled run's)."""
    out = directory / f"{time.strftime('%H%M%S')}-{server.port}.txt"
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--nonblocking",
            "--rate",
            "1000",
            "--format",
            "raw",
            "--output",
            str(out),
            "--pid",
            str(server.proc.pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # it writes its file and exits
        spy.wait(30)


# A delta event of the size ours have (a 24-hex item id, a one-token delta, a 5-digit sequence number).
FLOOR_FRAME = json.dumps(
    {
        "type": "response.output_text.delta",
        "item_id": "msg_" + "0" * 24,
        "output_index": 0,
        "content_index": 0,
        "delta": " the",
        "sequence_number": 12345,
    },
    separators=(",", ":"),
)
GO = {"type": "go"}  # what the floor app waits for before it streams


def _floor_serve(port: int, loop: str) -> None:
    """The stack's floor: starlette + uvicorn(wsproto), nothing else, sending one constant frame per
    ``await ws.send_text``: flat out, or paced at ``rate`` frames/s on the server's own clock (RealClock,
    absolute deadlines, every frame due at a wake-up sent then: the engine's pacing without the engine)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    from sampler.clock import RealClock

    async def stream(ws: WebSocket) -> None:
        await ws.accept()
        await ws.receive_text()  # go: every connection is open before any stream starts
        n = int(ws.query_params["n"])
        rate = float(ws.query_params.get("rate", 0))
        if rate:
            clock = RealClock()
            start, sent = clock.now(), 0
            while sent < n:
                await clock.sleep_until(start + sent / rate)
                due = min(n, int((clock.now() - start) * rate) + 1)
                for _ in range(sent, due):
                    await ws.send_text(FLOOR_FRAME)
                sent = due
        else:
            for _ in range(n):
                await ws.send_text(FLOOR_FRAME)
        await ws.send_text('{"type":"response.completed"}')
        with contextlib.suppress(Exception):
            await ws.receive()  # the client closes

    app = Starlette(routes=[WebSocketRoute("/floor", stream)])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        ws="wsproto",
        loop=loop,
        ws_per_message_deflate=False,
        ws_ping_interval=None,
        log_level="error",
        lifespan="off",
    )


@contextlib.contextmanager
def floor_server(loop: str) -> Iterator[tuple[int, psutil.Process]]:
    """The floor app in a spawned child: its port and its process, once it accepts connections."""
    port = free_port()
    child = multiprocessing.get_context("spawn").Process(target=_floor_serve, args=(port, loop), daemon=True)
    child.start()
    try:
        _wait_accepting(port, child)
        assert child.pid is not None
        yield port, psutil.Process(child.pid)
    finally:
        child.terminate()
        child.join(10)


def _wait_accepting(port: int, child: multiprocessing.process.BaseProcess, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with contextlib.closing(socket.create_connection(("127.0.0.1", port), 0.2)):
                return
        except OSError:
            if time.monotonic() > deadline or not child.is_alive():
                raise
            time.sleep(0.05)
