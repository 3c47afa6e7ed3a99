"""The shaped link's helper process (docs/lab.md, "Network"): a delaying relay and a probe, run inside the
server's network namespace by :mod:`proto.lab.run.network`.

**The relay** is the one-way delay where the kernel has no netem: a TCP proxy that holds each chunk it
reads for the profile's one-way delay ± a uniform jitter draw (netem's ``delay TIME JITTER`` without a
distribution table draws uniformly too), per direction, and writes it on in the order it came (a chunk is
never released before the one read before it: order is kept, where netem's jitter would reorder packets).
The rate is the kernel's (``tbf`` on the veth pair); the relay adds only time. What it does not model: the
TCP handshake's own round trip (the kernel answers the SYN at once; the lab opens its connections before
its clock starts) and TCP's reaction to a long round trip (the client's congestion window grows against
the veth's short one). A direction holds at most ``HOLD_LIMIT`` bytes; past it the relay stops reading
that side, and so it does while the other side's socket buffer is full (back-pressure, as a full
window would).

**The probe** is the link check's far end: after one command byte, ``E`` echoes every byte (the ping),
``U`` + an 8-byte length reads that many bytes and answers ``K`` + the receive rate of their second half
(bytes/s, a big-endian double: the steady state, after TCP's ramp), ``D`` + an 8-byte length sends that
many bytes.

Timers: the loop runs on ``select(2)``, whose timeout has microsecond resolution; epoll's and poll's are
in whole milliseconds (a late wake-up of up to 1 ms per chunk, 2 ms a round trip: the whole of a
same-region profile's RTT). ``select`` takes descriptors below 1 024, so one relay carries at most
``MAX_CONNECTIONS`` relayed connections; past it a connection is refused (closed) and said on stderr.

``python -m proto.lab.run.relay --forward LISTEN=UPSTREAM … --probe HOST:PORT --delay-ms D --jitter-ms J
--seed S`` prints ``ready`` once every socket listens, and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import selectors
import signal
import struct
import sys
from collections.abc import Callable, Coroutine, Sequence

HOLD_LIMIT = 4 * 2**20  # bytes held per direction: a 100 Mbit/s link's 330 ms of data
MAX_CONNECTIONS = 480  # two descriptors each, below select's 1 024 with room for the listeners
READ_SIZE = 2**16
LENGTH = struct.Struct(">Q")
RATE = struct.Struct(">d")


class Hold:
    """One direction of one relayed connection: ``feed`` chunks in; each leaves on ``sink`` at its
    arrival + ``draw()``, never before an earlier one (order kept). ``eof`` half-closes ``sink`` after the
    last held chunk. ``pause``/``resume`` stop and restart reading the source: past ``HOLD_LIMIT`` held,
    or while the sink's buffer is full (:meth:`sink_paused`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        draw: Callable[[], float],
        sink: asyncio.WriteTransport,
        pause: Callable[[], None],
        resume: Callable[[], None],
        on_finished: Callable[[], None],
    ) -> None:
        self.loop, self.draw, self.sink = loop, draw, sink
        self.pause, self.resume, self.on_finished = pause, resume, on_finished
        self.finished = False  # the source's EOF was passed on
        self.held: collections.deque[tuple[float, bytes]] = collections.deque()
        self.bytes = 0
        self.last = 0.0  # the latest release time given: none may be earlier
        self.ended = False  # the source's EOF, passed on after the last chunk
        self.full = False  # more than HOLD_LIMIT held
        self.sink_full = False  # the sink's write buffer is past its high-water mark
        self.reading = True
        self.timer: asyncio.TimerHandle | None = None

    def feed(self, data: bytes) -> None:
        release = max(self.loop.time() + self.draw(), self.last)
        self.last = release
        self.held.append((release, data))
        self.bytes += len(data)
        if self.timer is None:
            self.timer = self.loop.call_at(release, self.release)
        if self.bytes > HOLD_LIMIT and not self.full:
            self.full = True
            self._flow()

    def sink_paused(self, paused: bool) -> None:
        """The sink's transport asks us to stop (or may go on) writing: stop (or go on) reading the
        source."""
        self.sink_full = paused
        self._flow()

    def _flow(self) -> None:
        reading = not (self.full or self.sink_full)
        if reading != self.reading:
            self.reading = reading
            (self.resume if reading else self.pause)()

    def eof(self) -> None:
        self.ended = True
        if not self.held:
            self._end()

    def release(self) -> None:
        """Write every chunk whose time has come; wake again for the next."""
        self.timer = None
        now = self.loop.time()
        while self.held and self.held[0][0] <= now:
            _, data = self.held.popleft()
            self.bytes -= len(data)
            if not self.sink.is_closing():
                self.sink.write(data)
        if self.full and self.bytes <= HOLD_LIMIT // 2:
            self.full = False
            self._flow()
        if self.held:
            self.timer = self.loop.call_at(self.held[0][0], self.release)
        elif self.ended:
            self._end()

    def _end(self) -> None:
        if not self.sink.is_closing() and self.sink.can_write_eof():
            self.sink.write_eof()
        self.finished = True
        self.on_finished()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.held.clear()


class Side(asyncio.Protocol):
    """One socket of a relayed connection: what it reads goes into ``hold`` (towards the other side)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.hold: Hold | None = None  # set once both sockets are open
        self.early: list[bytes] = []  # read before the other side was open
        self.early_eof = False
        self.peer: Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.hold is None:
            self.early.append(data)
        else:
            self.hold.feed(data)

    def eof_received(self) -> bool:
        if self.hold is None:
            self.early_eof = True
        else:
            self.hold.eof()
        return True  # keep our writing side open until the other direction ends

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.hold is not None:
            self.peer.hold.sink_paused(True)

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.hold is not None:
            self.peer.hold.sink_paused(False)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.hold is not None:
            self.hold.close()
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        self.relay.connections.discard(self)

    def finished(self) -> None:
        """One direction passed its EOF on: once both have, the connection is over on both sockets."""
        peer = self.peer
        if self.hold and self.hold.finished and peer and peer.hold and peer.hold.finished:
            for side in (self, peer):
                if side.transport is not None:
                    side.transport.close()

    def start(self, peer: Side) -> None:
        """Join ``peer``: from now on what this side reads is held, then written to ``peer``."""
        assert self.transport is not None and peer.transport is not None
        self.peer = peer
        source = self.transport
        self.hold = Hold(
            self.relay.loop,
            self.relay.draw,
            peer.transport,
            source.pause_reading,
            source.resume_reading,
            self.finished,
        )
        for data in self.early:
            self.hold.feed(data)
        self.early.clear()
        if self.early_eof:
            self.hold.eof()


class Relay:
    """Every forward of one link, sharing the delay's random stream (seeded: a run draws the same). Owns
    the tasks that open upstream connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float, jitter_s: float, seed: int) -> None:
        self.loop = loop
        self.delay_s, self.jitter_s = delay_s, jitter_s
        self.random = random.Random(seed)
        self.connections: set[Side] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def draw(self) -> float:
        if self.jitter_s <= 0:
            return self.delay_s
        return max(0.0, self.delay_s + self.random.uniform(-self.jitter_s, self.jitter_s))

    async def forward(self, listen: tuple[str, int], upstream: tuple[str, int]) -> asyncio.Server:
        return await self.loop.create_server(lambda: Accepted(self, upstream), *listen, backlog=1024)

    def spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for side in list(self.connections):
            if side.transport is not None:
                side.transport.abort()


class Accepted(Side):
    """The accepted side: opens its upstream connection, then joins the two."""

    def __init__(self, relay: Relay, upstream: tuple[str, int]) -> None:
        super().__init__(relay)
        self.upstream = upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if len(self.relay.connections) >= MAX_CONNECTIONS:
            print(f"relay: refused a connection past {MAX_CONNECTIONS} (select's limit)", file=sys.stderr)
            transport.close()
            return
        self.relay.connections.add(self)
        self.relay.spawn(self._open())

    async def _open(self) -> None:
        try:
            transport, upstream = await self.relay.loop.create_connection(
                lambda: Side(self.relay), *self.upstream
            )
        except OSError as exc:
            print(f"relay: upstream {self.upstream}: {exc}", file=sys.stderr)
            if self.transport is not None:
                self.transport.close()
            return
        if self.transport is None or self.transport.is_closing():
            transport.close()
            return
        self.relay.connections.add(upstream)
        self.start(upstream)
        upstream.start(self)


# ---- the probe ----------------------------------------------------------------------------------


class Probe(asyncio.Protocol):
    """The link check's far end (the module docstring): echo, receive (answering the rate of the second
    half), or send."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.mode = b""
        self.want = 0  # upload: bytes still to come
        self.total = 0
        self.half_at: float | None = None  # when the upload's first half had arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.mode == b"E":
            self.transport.write(data)
            return
        if self.mode == b"U":
            self._upload(len(data))
            return
        self.buffer += data
        if not self.buffer:
            return
        command = self.buffer[:1]
        if command == b"E":
            self.mode, rest, self.buffer = b"E", self.buffer[1:], b""
            if rest:
                self.transport.write(rest)
            return
        if len(self.buffer) < 1 + LENGTH.size:
            return
        (length,) = LENGTH.unpack_from(self.buffer, 1)
        rest, self.buffer = self.buffer[1 + LENGTH.size :], b""
        if command == b"U":
            self.mode, self.want, self.total = b"U", length, length
            if rest:
                self._upload(len(rest))
        elif command == b"D":
            self.mode = b"D"
            chunk = bytes(READ_SIZE)
            while length > 0:
                self.transport.write(chunk[: min(length, READ_SIZE)])
                length -= READ_SIZE
        else:
            self.transport.close()

    def _upload(self, n: int) -> None:
        assert self.transport is not None
        self.want -= n
        now = self.loop.time()
        if self.half_at is None and self.want <= self.total // 2:
            self.half_at = now
        if self.want <= 0:
            assert self.half_at is not None
            seconds = now - self.half_at
            rate = (self.total - self.total // 2) / seconds if seconds > 0 else float("inf")
            self.transport.write(b"K" + RATE.pack(rate))
            self.mode = b"done"


# ---- the process ---------------------------------------------------------------------------------


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(
    forwards: Sequence[tuple[tuple[str, int], tuple[str, int]]],
    probe: tuple[str, int] | None,
    delay_s: float,
    jitter_s: float,
    seed: int,
) -> None:
    loop = asyncio.get_running_loop()
    relay = Relay(loop, delay_s, jitter_s, seed)
    servers = [await relay.forward(listen, upstream) for listen, upstream in forwards]
    if probe is not None:
        servers.append(await loop.create_server(lambda: Probe(loop), *probe, backlog=1024))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        for server in servers:
            server.close()
        relay.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proto.lab.run.relay", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--forward",
        action="append",
        default=[],
        metavar="LISTEN=UPSTREAM",
        help="HOST:PORT=HOST:PORT, repeatable",
    )
    parser.add_argument("--probe", default=None, metavar="HOST:PORT")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each direction")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="± uniform, each chunk")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    forwards = []
    for text in args.forward:
        listen, _, upstream = text.partition("=")
        forwards.append((_address(listen), _address(upstream)))
    probe = _address(args.probe) if args.probe else None
    # select(2): microsecond timeouts (the module docstring).
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())) as runner:
        runner.run(serve(forwards, probe, args.delay_ms / 1e3, args.jitter_ms / 1e3, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
