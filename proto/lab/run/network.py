"""A real network between the lab's clients and the server (docs/lab.md, "Network").

Each shaped server runs in a network namespace of its own, joined to the lab's (root) namespace by a veth
pair with addresses from a private /30. The link is shaped with the kernel's qdiscs: ``tbf`` for the
uplink (the root end's egress) and downlink (the namespace end's egress) rates, ``netem`` for the one-way
delay and its jitter where the kernel has it; where it has not (``tc … netem``: "unknown qdisc"), a
delaying relay (:mod:`proto.lab.run.relay`) in the namespace holds each chunk for the delay instead. Which was
used is recorded with every check of the link (:class:`LinkCheck`), and each group's check measures the
link in the same run: a TCP ping and the rate each way, against the profile, flagged past a stated
tolerance.

:class:`LabNetwork` owns every namespace it makes (unique names: ``rlab-PID-START-N``) and removes them on
exit, on an exception, on SIGTERM; one left by a run that was killed outright (SIGKILL) is removed by the
next run's :func:`reap`. Without root, ``ip`` or ``tc`` a run fails at once with what it needs
(:class:`NetworkUnavailable`, exit 2), never falling back to loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType

import msgspec
import psutil

from proto.lab.records import Floor, floor
from proto.lab.run.relay import LENGTH, RATE
from proto.processes import Placement


class NetworkUnavailable(RuntimeError):
    """This machine or user cannot make the lab's network: the message says what is missing."""


class NetworkError(RuntimeError):
    """A command of the set-up failed: its command line and what it said."""


class NetProfile(msgspec.Struct, frozen=True):
    """A link between the clients and the API. ``rtt_ms`` is split evenly between the two directions;
    ``jitter_ms`` is each direction's, uniform ± (netem's ``delay TIME JITTER``); a rate of ``None`` is
    not shaped."""

    name: str
    rtt_ms: float
    jitter_ms: float = 0.0
    up_mbit: float | None = None
    down_mbit: float | None = None
    tls: bool = False
    source: str = ""


# Named links, each with the public figure behind it (docs/lab.md, "Network", says more).
NETWORKS: dict[str, NetProfile] = {
    "same-host": NetProfile(
        "same-host",
        0.0,
        source="no delay, no rate: the namespace and veth crossing alone (the control)",
    ),
    "same-region": NetProfile(
        "same-region",
        2.0,
        0.1,
        source="Azure: availability zones of a region are < 2 ms apart round trip (Azure availability zones "
        "overview); EC2 inter-AZ ping 1.3-2.1 ms, mdev 0.06-0.11 ms (a measured gist, as docs/lab.md "
        "'Profiles' cites); rates not shaped (in-region VM links are Gbit/s)",
    ),
    "cross-continent": NetProfile(
        "cross-continent",
        91.0,
        1.0,
        20.0,
        100.0,
        source="RTT: Azure's round-trip table, East US <-> West Europe P95 91 ms (30 days to 2026-07-30); "
        "jitter: SLAC PingER SLAC -> CERN, RTT IQR 1.01 ms at a 150 ms median; rates: the FCC's 2024 "
        "fixed-broadband benchmark, 100 Mbit/s down / 20 Mbit/s up",
    ),
    "slow-uplink": NetProfile(
        "slow-uplink",
        35.0,
        0.0,
        10.0,
        100.0,
        source="RTT: Azure's round-trip table, East US <-> Central US 35 ms (an in-continent client); a 10 "
        "Mbit/s uplink: below the FCC's 2024 benchmark (20 up), above its 2015 one (3 up); 100 down",
    ),
}

# The link check's tolerance (docs/lab.md, "Network"): the ping's p50 within 10 % of the profile's RTT or
# 1 ms, whichever is larger (the path's own ~0.1 ms and a loaded machine's timer slack); each rate within
# 10 % of the TCP payload the shaped rate carries.
RTT_TOLERANCE = 0.10
RTT_TOLERANCE_MS = 1.0
RATE_TOLERANCE = 0.10
# tbf counts whole frames: a full-size TCP segment carries 1 448 payload bytes (1 500 MTU - 20 IP - 32 TCP
# with timestamps) in a 1 514-byte Ethernet frame.
PAYLOAD_SHARE = 1448 / 1514

NAME = re.compile(r"^net:([0-9.]+)/([0-9.]+)/([0-9.]+|-)/([0-9.]+|-)$")


def network_named(name: str) -> NetProfile:
    """A named link, or ``net:RTT/JITTER/UP/DOWN`` (ms, ms, Mbit/s, Mbit/s; ``-`` for a rate not shaped);
    either with ``+tls`` (the server speaks TLS: ``wss://``, ``https://``). ``ValueError`` says what is
    wrong."""
    base, plus, suffix = name.partition("+")
    if plus and suffix != "tls":
        raise ValueError(f"network {name!r}: the only suffix is +tls")
    tls = bool(plus)
    if base in NETWORKS:
        return msgspec.structs.replace(NETWORKS[base], name=name, tls=tls)
    match = NAME.match(base)
    if match is None:
        raise ValueError(
            f"unknown network {name!r} (named: {', '.join(NETWORKS)}; or net:RTT/JITTER/UP/DOWN in ms, ms, "
            "Mbit/s, Mbit/s, '-' for a rate not shaped; +tls for TLS)"
        )
    rtt, jitter = float(match[1]), float(match[2])
    up, down = (None if x == "-" else float(x) for x in (match[3], match[4]))
    if (up is not None and up <= 0) or (down is not None and down <= 0):
        raise ValueError(f"network {name!r}: a rate is > 0 Mbit/s, or '-' (not shaped)")
    return NetProfile(name, rtt, jitter, up, down, tls, source="given on the command line")


def requirements(euid: int | None = None, which: Callable[[str], str | None] = shutil.which) -> None:
    """What the lab's network needs of this machine and user: root (namespaces, links and qdiscs are
    privileged), iproute2's ``ip`` and ``tc``, and util-linux's ``chrt`` (the helper's priority). Raises
    :class:`NetworkUnavailable` naming what is missing; ``euid`` and ``which`` are the process's own
    unless given (a test drives them)."""
    missing = []
    if (os.geteuid() if euid is None else euid) != 0:
        missing.append("root (network namespaces, veth links and qdiscs are privileged: run the lab as root)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("chrt", "util-linux")):
        if which(tool) is None:
            missing.append(f"`{tool}` on PATH (apt-get install {package})")
    if missing:
        raise NetworkUnavailable("--network needs " + "; and ".join(missing))


# ---- commands -------------------------------------------------------------------------------------


def run(*args: str) -> str:
    """One set-up command; its stdout, or :class:`NetworkError` with what it said."""
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetworkError(f"{shlex.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


PREFIX = "rlab-"
# The helper stands in for netem, which runs in the kernel's softirq and waits for no CPU: it runs as a
# real-time process (SCHED_FIFO, the lowest priority), so its timers wake it at once on a busy machine.
# Measured at load average 20 on 2 cores, a 20 ms profile's ping p50: 30-38 ms at nice 0 or -10, 20.4-26 ms
# so. The kernel's real-time throttling (sched_rt_runtime_us, 95 % by default) bounds what it may take.
HELPER_PRIORITY = ("chrt", "--fifo", "1")


def _alive(pid: int, start: int) -> bool:
    try:
        return int(psutil.Process(pid).create_time()) == start
    except psutil.Error:
        return False


def namespaces() -> list[str]:
    """The lab's namespaces on this machine, every run's."""
    names = (line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip())
    return [n for n in names if n.startswith(PREFIX)]


def remove(ns: str) -> None:
    """Stop what runs in ``ns`` (the lab's own helpers and servers), then delete it: its veth pair and
    qdiscs go with it."""
    with contextlib.suppress(NetworkError):
        for pid in run("ip", "netns", "pids", ns).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    run("ip", "netns", "del", ns)


def reap() -> list[str]:
    """Remove the namespaces of lab runs that no longer live (killed outright, so their owner never ran);
    the names it removed."""
    gone = []
    for ns in namespaces():
        parts = ns[len(PREFIX) :].split("-")
        if len(parts) == 3 and all(p.isdigit() for p in parts) and not _alive(int(parts[0]), int(parts[1])):
            remove(ns)
            gone.append(ns)
    return gone


_NETEM: bool | None = None


def netem_available(device: str) -> bool:
    """Whether this kernel has netem: one added to ``device`` and taken off again (once a process)."""
    global _NETEM
    if _NETEM is None:
        try:
            run("tc", "qdisc", "add", "dev", device, "root", "netem", "delay", "1ms")
        except NetworkError as exc:
            if "unknown" not in str(exc).lower():
                raise
            _NETEM = False
        else:
            run("tc", "qdisc", "del", "dev", device, "root")
            _NETEM = True
    return _NETEM


def _shape(device: str, ns: str | None, delay_ms: float, jitter_ms: float, mbit: float | None) -> None:
    """``device``'s egress: netem's delay (when given), then tbf's rate under it (when shaped). tbf's
    bucket holds 1 ms of the rate (at least two full frames), so a message meets the rate from its first
    bytes; its queue 100 ms (at least 64 KiB)."""
    tc = ["tc", *(["-n", ns] if ns else []), "qdisc", "add", "dev", device]
    parent = ["root"]
    if delay_ms > 0 or jitter_ms > 0:
        run(
            *tc,
            "root",
            "handle",
            "1:",
            "netem",
            "delay",
            f"{delay_ms}ms",
            f"{jitter_ms}ms",
            "limit",
            "100000",
        )
        parent = ["parent", "1:1"]
    if mbit is not None:
        rate = mbit * 1e6 / 8  # bytes/s
        burst = max(2 * 1514, int(rate * 1e-3))
        limit = max(2**20, int(rate * 0.5)) + burst
        run(
            *tc,
            *parent,
            "handle",
            "2:",
            "tbf",
            "rate",
            f"{int(mbit * 1e6)}bit",
            "burst",
            str(burst),
            "limit",
            str(limit),
        )


# ---- one link -----------------------------------------------------------------------------------


class Mechanism(msgspec.Struct, frozen=True):
    """How a link was shaped: ``delay`` netem | relay | none, ``rate`` tbf | none, and TLS."""

    delay: str
    rate: str
    tls: bool


class LinkCheck(msgspec.Struct, frozen=True):
    """One measurement of a link, in the run that used it: the TCP ping's round trips (through the path, to
    the probe at its far end) and the TCP payload rate each way (the second half of a transfer of
    ``transfer_bytes``, after TCP's ramp), against what the profile says; ``off`` names each figure past
    its tolerance ([] within)."""

    network: str
    rtt_ms: float
    jitter_ms: float
    up_mbit: float | None
    down_mbit: float | None
    mechanism: Mechanism
    ping: Floor
    measured_up_mbit: float
    measured_down_mbit: float
    expected_up_mbit: float | None  # the TCP payload the shaped rate carries (PAYLOAD_SHARE)
    expected_down_mbit: float | None
    transfer_bytes: dict[str, int]
    tolerance: dict[str, float]
    off: list[str]
    source: str


class Link:
    """One namespace, its veth pair, the qdiscs on both ends, and the helper (relay and probe) inside.
    Servers placed on it (:meth:`placement`, at most ``SERVERS``) bind inside; the lab reaches them at the
    namespace end's address. Built by :class:`LabNetwork`, which closes it."""

    SERVERS = 4  # server ports per link: 8000-8003 (a reconnect pair needs two)
    PORT, PROBE = 8000, 9000

    def __init__(
        self,
        profile: NetProfile,
        ns: str,
        device: str,
        subnet: ipaddress.IPv4Network,
        relay: bool,
        certs: tuple[str, str] | None,
        seed: int,
    ) -> None:
        self.profile, self.ns, self.device = profile, ns, device
        near, far = list(subnet.hosts())
        self.near, self.far = str(near), str(far)
        self.certs = certs
        self.servers = 0
        self.helper: subprocess.Popen[str] | None = None
        one_way = profile.rtt_ms / 2
        delayed = one_way > 0 or profile.jitter_ms > 0
        self.mechanism = Mechanism(
            delay="none" if not delayed else "relay" if relay else "netem",
            rate="tbf" if profile.up_mbit or profile.down_mbit else "none",
            tls=profile.tls,
        )
        netem = self.mechanism.delay == "netem"
        _shape(device, None, one_way if netem else 0.0, profile.jitter_ms if netem else 0.0, profile.up_mbit)
        _shape("rlab0", ns, one_way if netem else 0.0, profile.jitter_ms if netem else 0.0, profile.down_mbit)
        self._start_helper(seed)

    @property
    def relayed(self) -> bool:
        return self.mechanism.delay == "relay"

    def _start_helper(self, seed: int) -> None:
        """The probe, and in relay mode the relay of every server port and of the probe's own."""
        flags = ["--seed", str(seed)]
        if self.relayed:
            flags += ["--delay-ms", str(self.profile.rtt_ms / 2), "--jitter-ms", str(self.profile.jitter_ms)]
            for port in range(self.PORT, self.PORT + self.SERVERS):
                flags += ["--forward", f"{self.far}:{port}=127.0.0.1:{port}"]
            flags += ["--forward", f"{self.far}:{self.PROBE}=127.0.0.1:{self.PROBE + 1}"]
            flags += ["--probe", f"127.0.0.1:{self.PROBE + 1}"]
        else:
            flags += ["--probe", f"{self.far}:{self.PROBE}"]
        command = [
            "ip",
            "netns",
            "exec",
            self.ns,
            *HELPER_PRIORITY,
            sys.executable,
            "-m",
            "proto.lab.run.relay",
            *flags,
        ]
        # Its stdout says "ready" once; what it says later (stderr) goes to a file, never a pipe nobody reads.
        self.helper_log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.helper = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.helper_log, text=True)
        assert self.helper.stdout is not None
        if self.helper.stdout.readline().strip() != "ready":  # else its error, and EOF
            self._stop_helper()
            self.helper_log.seek(0)
            said = self.helper_log.read().decode(errors="replace")
            raise NetworkError(f"the link's helper did not start: {said[-2000:]}")

    def placement(self) -> Placement:
        """Where the next server on this link binds and how the lab reaches it."""
        if self.servers >= self.SERVERS:
            raise NetworkError(f"a link carries at most {self.SERVERS} servers")
        port = self.PORT + self.servers
        self.servers += 1
        scheme = "https" if self.certs else "http"
        tls = ("--ssl-certfile", self.certs[0], "--ssl-keyfile", self.certs[1]) if self.certs else ()
        return Placement(
            prefix=("ip", "netns", "exec", self.ns),
            bind="127.0.0.1" if self.relayed else self.far,
            port=port,
            url=f"{scheme}://{self.far}:{port}",
            flags=tls,
        )

    async def check(self) -> LinkCheck:
        """Measure the link now: pings, then a transfer each way (module docstring)."""
        p = self.profile
        pings = max(10, min(100, int(3000 / max(p.rtt_ms, 1.0))))
        rtts = await ping_ms(self.far, self.PROBE, pings)
        up_bytes, down_bytes = (_transfer_bytes(m) for m in (p.up_mbit, p.down_mbit))
        up = await upload_mbit(self.far, self.PROBE, up_bytes)
        down = await download_mbit(self.far, self.PROBE, down_bytes)
        expected_up, expected_down = (
            None if m is None else m * PAYLOAD_SHARE for m in (p.up_mbit, p.down_mbit)
        )
        ping = floor("link_ping", rtts)
        off = []
        assert ping.p50 is not None
        if abs(ping.p50 - p.rtt_ms) > max(RTT_TOLERANCE * p.rtt_ms, RTT_TOLERANCE_MS):
            off.append(f"link RTT p50 {ping.p50:.2f} ms vs {p.rtt_ms:g} ms")
        for what, measured, expected in (("uplink", up, expected_up), ("downlink", down, expected_down)):
            if expected is not None and abs(measured - expected) > RATE_TOLERANCE * expected:
                off.append(f"{what} {measured:.1f} Mbit/s vs {expected:.1f}")
        return LinkCheck(
            network=p.name,
            rtt_ms=p.rtt_ms,
            jitter_ms=p.jitter_ms,
            up_mbit=p.up_mbit,
            down_mbit=p.down_mbit,
            mechanism=self.mechanism,
            ping=ping,
            measured_up_mbit=up,
            measured_down_mbit=down,
            expected_up_mbit=expected_up,
            expected_down_mbit=expected_down,
            transfer_bytes={"up": up_bytes, "down": down_bytes},
            tolerance={"rtt": RTT_TOLERANCE, "rtt_ms": RTT_TOLERANCE_MS, "rate": RATE_TOLERANCE},
            off=off,
            source=p.source,
        )

    def _stop_helper(self) -> None:
        if self.helper is None:
            return
        self.helper.terminate()
        try:
            self.helper.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.helper.kill()
            self.helper.wait()
        if self.helper.stdout is not None:
            self.helper.stdout.close()
        self.helper = None

    def close(self) -> None:
        """The helper stopped, then the namespace (and what still runs in it) removed."""
        self._stop_helper()
        self.helper_log.close()
        remove(self.ns)


def _transfer_bytes(mbit: float | None) -> int:
    """1.5 s of the shaped rate (at least 256 KiB); 32 MiB on a link not shaped."""
    if mbit is None:
        return 32 * 2**20
    return max(256 * 1024, int(mbit * 1e6 / 8 * 1.5))


# ---- the measurements -------------------------------------------------------------------------


async def ping_ms(host: str, port: int, count: int) -> list[float]:
    """``count`` one-byte round trips to the probe's echo, on one connection (opened before the clock)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"E")
        rtts = []
        for _ in range(count):
            t0 = time.perf_counter()
            writer.write(b"x")
            await reader.readexactly(1)
            rtts.append((time.perf_counter() - t0) * 1e3)
        return rtts
    finally:
        writer.close()
        await writer.wait_closed()


async def upload_mbit(host: str, port: int, size: int) -> float:
    """``size`` bytes to the probe; the rate it received the second half at (Mbit/s of TCP payload)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"U" + LENGTH.pack(size))
        chunk = bytes(2**16)
        left = size
        while left > 0:
            writer.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
            await writer.drain()
        answer = await reader.readexactly(1 + RATE.size)
        (rate,) = RATE.unpack_from(answer, 1)
        return float(rate) * 8 / 1e6
    finally:
        writer.close()
        await writer.wait_closed()


async def download_mbit(host: str, port: int, size: int) -> float:
    """``size`` bytes from the probe; the rate the second half arrived at (Mbit/s of TCP payload)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"D" + LENGTH.pack(size))
        got, half_at = 0, None
        while got < size:
            data = await reader.read(2**16)
            if not data:
                raise NetworkError(f"the probe closed after {got} of {size} bytes")
            got += len(data)
            if half_at is None and got >= size // 2:
                half_at = time.perf_counter()
        assert half_at is not None
        seconds = time.perf_counter() - half_at
        return (size - size // 2) * 8 / 1e6 / seconds if seconds > 0 else float("inf")
    finally:
        writer.close()
        await writer.wait_closed()


# ---- the owner ----------------------------------------------------------------------------------

_LIVE: dict[str, Link] = {}  # by the base URL of each server placed on a link
_LOCK = Path(tempfile.gettempdir()) / "responses-lab-network.lock"
RUN_KEY = secrets.token_urlsafe(16)  # the API key of servers the lab binds beyond loopback


def live_link(url: str) -> Link | None:
    """The link a server of this process is behind (by its base URL), if any."""
    return _LIVE.get(url.rstrip("/"))


class LabNetwork:
    """The owner of every link of a run: ``with LabNetwork() as net: link = net.link(profile)``. On
    entry, the namespaces of dead runs are removed (:func:`reap`); on exit (an exception and SIGTERM
    included), every link it made. With a TLS link, one CA made at run time (``trustme``) signs each
    link's certificate, and the lab's clients trust it (``SSL_CERT_FILE``: the system's CAs and it, read
    by httpx and by ``ssl.create_default_context``) until exit."""

    def __init__(self, prefer_relay: bool = False, seed: int = 1) -> None:
        requirements()
        self.prefer_relay, self.seed = prefer_relay, seed
        start = int(psutil.Process().create_time())
        self.stem = f"{PREFIX}{os.getpid()}-{start}"
        self.links: list[Link] = []
        self.count = 0
        self.scratch: tempfile.TemporaryDirectory[str] | None = None
        self.ca: object | None = None
        self.saved_env: str | None = None
        self.saved_term: Callable[[int, FrameType | None], object] | int | None = None

    def __enter__(self) -> LabNetwork:
        reap()
        self.scratch = tempfile.TemporaryDirectory(prefix="responses-lab-net-")
        if threading.current_thread() is threading.main_thread():
            self.saved_term = signal.signal(signal.SIGTERM, _terminate)
        return self

    def link(self, profile: NetProfile) -> Link:
        """A new link shaped as ``profile``, with its own namespace."""
        n = self.count
        self.count += 1
        ns = f"{self.stem}-{n}"
        device = f"rl{os.getpid():x}n{n}"[:15]
        with _locked():
            subnet = _free_subnet()
            run("ip", "netns", "add", ns)
            try:
                run("ip", "link", "add", device, "type", "veth", "peer", "name", "rlab0", "netns", ns)
                near, far = (str(a) for a in subnet.hosts())
                run("ip", "addr", "add", f"{near}/30", "dev", device)
                run("ip", "link", "set", device, "up")
                run("ip", "-n", ns, "addr", "add", f"{far}/30", "dev", "rlab0")
                run("ip", "-n", ns, "link", "set", "rlab0", "up")
                run("ip", "-n", ns, "link", "set", "lo", "up")
            except BaseException:
                remove(ns)
                raise
        try:
            relay = self.prefer_relay or not netem_available(device)
            link = Link(profile, ns, device, subnet, relay, self._certs(profile, far), self.seed + n)
        except BaseException:
            remove(ns)
            raise
        self.links.append(link)
        for k in range(Link.SERVERS):
            scheme = "https" if profile.tls else "http"
            _LIVE[f"{scheme}://{far}:{Link.PORT + k}"] = link
        return link

    def _certs(self, profile: NetProfile, host: str) -> tuple[str, str] | None:
        if not profile.tls:
            return None
        import trustme  # only a TLS run needs it

        assert self.scratch is not None
        if self.ca is None:
            self.ca = trustme.CA()
            bundle = Path(self.scratch.name) / "ca-bundle.pem"
            import certifi

            bundle.write_bytes(Path(certifi.where()).read_bytes() + self.ca.cert_pem.bytes())
            self.saved_env = os.environ.get("SSL_CERT_FILE")
            os.environ["SSL_CERT_FILE"] = str(bundle)
        assert isinstance(self.ca, trustme.CA)
        cert = self.ca.issue_cert(host)
        base = Path(self.scratch.name) / host
        cert.cert_chain_pems[0].write_to_path(f"{base}.crt")
        for extra in cert.cert_chain_pems[1:]:
            extra.write_to_path(f"{base}.crt", append=True)
        cert.private_key_pem.write_to_path(f"{base}.key")
        return f"{base}.crt", f"{base}.key"

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        errors = []
        for link in self.links:
            for url in [u for u, v in _LIVE.items() if v is link]:
                del _LIVE[url]
            try:
                link.close()
            except NetworkError as error:
                errors.append(str(error))
        self.links.clear()
        if self.ca is not None:
            if self.saved_env is None:
                os.environ.pop("SSL_CERT_FILE", None)
            else:
                os.environ["SSL_CERT_FILE"] = self.saved_env
        if self.scratch is not None:
            self.scratch.cleanup()
        if self.saved_term is not None:
            signal.signal(signal.SIGTERM, self.saved_term)
        if errors and kind is None:
            raise NetworkError("; ".join(errors))


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM while links are up: unwind (the owners remove them), as Ctrl-C would."""
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One run at a time picks a subnet and takes it (concurrent runs on one machine)."""
    with open(_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of 10.213.0.0/16 that no address or route of the root namespace overlaps."""
    text = run("ip", "-4", "-o", "addr", "show") + run("ip", "-4", "route", "show")
    taken = [ipaddress.IPv4Network(w, strict=False) for w in re.findall(r"\d+\.\d+\.\d+\.\d+/\d+", text)]
    pool = list(ipaddress.IPv4Network("10.213.0.0/16").subnets(new_prefix=30))
    rng = random.Random()
    for _ in range(64):
        subnet = rng.choice(pool)
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise NetworkError("no free /30 in 10.213.0.0/16")
