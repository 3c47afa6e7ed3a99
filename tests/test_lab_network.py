"""The lab's shaped network (docs/lab.md, "Network"): a link measures as its profile says, the relay keeps
bytes and their order, a run without what the network needs fails typed, no namespace outlives its run,
and ``http``'s extra bytes cost what the uplink's rate says.

Every test but the typed refusals needs root (namespaces, veth, qdiscs; CI runs as root): without it they
fail with the reason, never skipped. Modest links (20 ms, 20 Mbit/s) keep them short.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proto.lab.analysis.metrics import rollout_metrics
from proto.lab.config import nonce
from proto.lab.run.clients import make_client
from proto.lab.run.network import (
    PAYLOAD_SHARE,
    LabNetwork,
    NetworkUnavailable,
    namespaces,
    netem_available,
    network_named,
    requirements,
)
from proto.lab.run.relay import Relay
from proto.lab.workload.plan import build_plan
from proto.lab.workload.traces import Round, Session
from proto.processes import ChildServer
from sampler.policy import PlannedCall

ROOT = Path(__file__).resolve().parents[1]


def test_profiles_parse_with_their_sources() -> None:
    named = network_named("cross-continent+tls")
    assert (named.rtt_ms, named.up_mbit, named.down_mbit, named.tls) == (91.0, 20.0, 100.0, True)
    assert "Azure" in named.source
    given = network_named("net:20/1/20/-")
    assert (given.rtt_ms, given.jitter_ms, given.up_mbit, given.down_mbit) == (20.0, 1.0, 20.0, None)
    for bad in ("net:20/1/20", "moon", "same-host+quic", "net:20/0/0/5"):
        with pytest.raises(ValueError):
            network_named(bad)


def test_without_root_or_iproute2_it_fails_typed() -> None:
    with pytest.raises(NetworkUnavailable, match="root"):
        requirements(euid=1000)
    with pytest.raises(NetworkUnavailable, match=r"`ip` on PATH.*`tc` on PATH"):
        requirements(euid=0, which=lambda tool: None)
    requirements(euid=0, which=lambda tool: f"/usr/sbin/{tool}")  # all there: no error


@pytest.mark.process
def test_a_bench_run_without_iproute2_exits_2_with_what_it_needs(tmp_path: Path) -> None:
    """The CLI itself, with ``ip``, ``tc`` and ``chrt`` off its PATH (the check a test can drive: the
    root check is the same code, driven above): exit 2, the reason, nothing started."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proto",
            "bench",
            "--network",
            "same-region",
            "--quick",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PATH": str(tmp_path)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--network needs" in done.stderr and "`ip` on PATH" in done.stderr
    assert not (tmp_path / "results.json").exists()


@pytest.mark.process
@pytest.mark.serial  # a ping and rates on the wall clock: alone after the parallel part
def test_a_shaped_link_measures_as_its_profile() -> None:
    """20 ms, 20 Mbit/s each way: the link check's ping p50 within its tolerance of 20 ms and each rate
    within 10 % of the payload 20 Mbit/s carries; on a kernel without netem the relay did the delay."""
    requirements()
    with LabNetwork() as net:
        link = net.link(network_named("net:20/0/20/20"))
        check = asyncio.run(link.check())
    assert check.mechanism.rate == "tbf"
    assert check.mechanism.delay == ("netem" if netem_available(link.device) else "relay")
    assert check.off == [], check
    assert check.ping.p50 is not None and check.ping.p50 >= 20.0  # never faster than the profile
    assert check.expected_up_mbit == pytest.approx(20 * PAYLOAD_SHARE)


@pytest.mark.process
def test_the_relay_keeps_every_byte_in_order() -> None:
    """Chunks through a relay whose jitter (±3 ms on 3 ms) would reorder them if it released each at its
    own draw: every byte arrives, in order, and the half-close after them; once both directions have
    ended, the relay lets go of both sockets."""

    async def scenario() -> bytes:
        loop = asyncio.get_running_loop()
        received = bytearray()

        async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.extend(await reader.read())  # until the relayed EOF
            writer.write(b"done")
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(sink, "127.0.0.1", 0)
        relay = Relay(loop, 0.003, 0.003, seed=7)
        port = upstream.sockets[0].getsockname()[1]
        server = await relay.forward(("127.0.0.1", 0), ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        rng = random.Random(3)
        sent = bytearray()
        for k in range(400):
            chunk = bytes([k % 256]) * rng.randint(1, 3000)
            sent.extend(chunk)
            writer.write(chunk)
            await writer.drain()
            if k % 7 == 0:
                await asyncio.sleep(0.0005)  # separate reads at the relay: separate draws
        writer.write_eof()
        assert await reader.read() == b"done"  # and the sink's EOF, relayed
        writer.close()
        for _ in range(200):  # both directions ended: the relay closes its two sockets (no descriptor kept)
            if not relay.connections:
                break
            await asyncio.sleep(0.005)
        assert not relay.connections
        relay.close()
        server.close()
        upstream.close()
        assert bytes(received) == bytes(sent)
        return bytes(received)

    assert len(asyncio.run(scenario())) > 100_000


def _ours() -> list[str]:
    return [ns for ns in namespaces() if ns.startswith(f"rlab-{os.getpid()}-")]


@pytest.mark.process
def test_no_namespace_outlives_its_run() -> None:
    """On exit and on an exception the owner removes its namespaces; one left by a run killed outright
    (SIGKILL: no owner ran) is removed by the next run's start."""
    requirements()
    with LabNetwork() as net:
        net.link(network_named("same-host"))
        net.link(network_named("net:2/0/-/-"))
        assert len(_ours()) == 2
    assert _ours() == []
    with pytest.raises(RuntimeError, match="boom"), LabNetwork() as net:
        net.link(network_named("same-host"))
        raise RuntimeError("boom")
    assert _ours() == []

    script = textwrap.dedent(
        """
        import sys, time
        from proto.lab.run.network import LabNetwork, network_named
        net = LabNetwork().__enter__()
        net.link(network_named("net:4/0/-/-"))
        print(net.stem, flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert child.stdout is not None
    stem = child.stdout.readline().strip()
    assert [ns for ns in namespaces() if ns.startswith(stem)], "the child made its namespace"
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert [ns for ns in namespaces() if ns.startswith(stem)], "a killed run leaves it"
    with LabNetwork():
        assert not [ns for ns in namespaces() if ns.startswith(stem)]


# A first message of ~20 k tokens, one tool call, then the answer: the second turn's request holds the
# whole history in http, the tool's output alone in ws. The tool's 0.5 s lets the server finish the first
# turn's tail (its store and ledger writes) before the second is sent, on either link: without it that work
# overlapped a slow upload and hid a sixth of its time.
BIG = Session(
    "big",
    0.0,
    (Round(16, (PlannedCall("tool", "{}"),), 0.5, result_tokens=(50,)), Round(16, (), 0.0, text="Done.")),
    first_tokens=20_000,
)


@pytest.mark.process
@pytest.mark.serial  # times on the wall clock: alone after the parallel part
def test_http_bytes_cost_what_the_uplink_says() -> None:
    """The same rollouts, http and ws, over a 2 Mbit/s uplink and over an unshaped link: on the turn after
    the tool call, http's extra time to the first token over ws's is its extra bytes ÷ the uplink's
    payload rate (within 20 %; medians of three rollouts). The first turns send the same bytes in both."""
    requirements()
    up_mbit = 2.0
    rate = up_mbit * 1e6 / 8 * PAYLOAD_SHARE  # payload bytes/s
    shaped, plain = f"net:0/0/{up_mbit:g}/-", "same-host"

    async def turns(ws_url: str, http_url: str, key: str, mode: str) -> tuple[float, int]:
        client = make_client(mode, ws_url, http_url, key)
        await client.open()
        seconds, sent = [], []
        try:
            await client.rollout(build_plan(BIG, "mock-4000tps", nonce()))  # warm: connection, code paths
            for _ in range(3):
                trace = await client.rollout(build_plan(BIG, "mock-4000tps", nonce()))
                seconds.append(rollout_metrics(trace).turns[1].ttft_ms / 1e3)
                sent.append(trace.bytes_sent)
        finally:
            await client.close()
        return statistics.median(seconds), int(statistics.median(sent))

    measured: dict[tuple[str, str], tuple[float, int]] = {}
    with LabNetwork() as net:
        for name in (shaped, plain):
            placement = net.link(network_named(name)).placement()
            key = "test-key"
            with ChildServer(["--log-level", "warning"], api_key=key, placement=placement) as server:
                for mode in ("http", "ws"):
                    measured[(name, mode)] = asyncio.run(turns(server.ws_url, server.http_url, key, mode))
    extra = {mode: measured[(shaped, mode)][0] - measured[(plain, mode)][0] for mode in ("http", "ws")}
    sent = {mode: measured[(shaped, mode)][1] for mode in ("http", "ws")}
    assert sent["http"] > 1.8 * sent["ws"]  # the history twice against once
    assert extra["http"] - extra["ws"] == pytest.approx((sent["http"] - sent["ws"]) / rate, rel=0.2), (
        extra,
        sent,
    )


def test_the_shapers_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """What each end's egress gets: netem's delay with tbf under it where the kernel has netem (these
    machines have not: the commands are tc-netem(8)'s, checked here as text), tbf alone for a rate, nothing
    for a link neither delays nor shapes."""
    from proto.lab.run import network

    commands: list[tuple[str, ...]] = []
    monkeypatch.setattr(network, "run", lambda *args: commands.append(args) or "")
    network._shape("rl1n0", None, 45.5, 1.0, 20.0)
    assert commands[0] == (
        "tc", "qdisc", "add", "dev", "rl1n0", "root", "handle", "1:", "netem", "delay", "45.5ms", "1.0ms",
        "limit", "100000",
    )  # fmt: skip
    assert commands[1][:9] == ("tc", "qdisc", "add", "dev", "rl1n0", "parent", "1:1", "handle", "2:")
    assert commands[1][9:12] == ("tbf", "rate", "20000000bit")
    commands.clear()
    network._shape("rlab0", "rlab-1-2-0", 0.0, 0.0, 10.0)
    assert [c[:8] for c in commands] == [("tc", "-n", "rlab-1-2-0", "qdisc", "add", "dev", "rlab0", "root")]
    burst, limit = int(commands[0][commands[0].index("burst") + 1]), int(commands[0][-1])
    assert burst == 2 * 1514 and limit == 2**20 + burst  # 1 ms of 10 Mbit/s is less than two frames
    commands.clear()
    network._shape("rl1n0", None, 0.0, 0.0, None)
    assert commands == []
