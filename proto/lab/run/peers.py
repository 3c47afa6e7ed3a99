"""Peers: Responses servers built by others, measured on the lab's ground (docs/lab.md, "Peers").

**agentic-api** (vLLM's stateful gateway, PyPI ``agentic-api``, a Rust binary ``agentic-server``) keeps
state itself and sends each turn upstream as a stateless, full-history ``POST /v1/responses``. The lab runs
it as a user would: installed pinned into ``.cache/peers/agentic-api`` (``make peers``), started in front of
a server of this project in ``http`` mode, driven by the lab's GA WebSocket client over the gateway's own
WebSocket mode (``ws://…/v1/responses``), with the same workload, mock GPU, rollouts and statistics as the
other modes.

The gateway drops ``response.lab``, so the upstream's per-turn report and phases are read from the
upstream's log instead (its ``response_ended`` lines at info level: ``lab_turns``, ``phases_ms``). Each
client turn is paired with the upstream response that served it: the turns in the order their terminal
events arrived, each with the first unclaimed upstream response of the prompt size the plan fixed for it
(the plan knows every round's prompt tokens to the token). A turn with no such response is a
:class:`PeerError`: the gateway did not send the history the client gave it.

The split, per turn: **upstream** = what the upstream's report accounts for before the first token (its
phases, the batch-queue wait and the modelled prefill); **gateway** = client-observed TTFT − upstream. The
gateway's share thus holds agentic-api's own work, both loopback hops and the upstream's HTTP handling
outside its phases (which ``http``'s own turn overhead holds too: compare against it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from proto.lab.analysis.metrics import BOUNDARY, SEND, Trace, rollout_metrics
from proto.lab.config import AGENTIC_API, BenchConfig
from proto.lab.workload.plan import build_plan
from proto.lab.workload.traces import Replay
from proto.processes import ChildServer, cpu_seconds, free_port

AGENTIC_API_VERSION = "0.9.0"  # pinned: Makefile, "peers"
ROOT = Path(__file__).resolve().parents[3]
UPSTREAM_REPORT = "gateway: client TTFT - upstream report; upstream: this server's per-turn report"
CLIENT_ONLY = "client-side only: the server's own report is not read"


def peers_dir() -> Path:
    """Where ``make peers`` installs them: ``.cache/peers``, or ``$RESPONSES_LAB_PEERS_DIR``."""
    return Path(os.environ.get("RESPONSES_LAB_PEERS_DIR") or ROOT / ".cache" / "peers")


class PeerUnavailable(RuntimeError):
    """The peer cannot be installed or started (the reason is in the message). A run fails with it."""


class PeerError(RuntimeError):
    """The peer answered, but not as the plan requires (its upstream never saw a turn the client sent)."""


def agentic_server() -> Path:
    """The pinned ``agentic-server`` binary, or :class:`PeerUnavailable` saying how to get it."""
    home = peers_dir() / "agentic-api"
    binary = home / "bin" / "agentic-server"
    if not binary.is_file():
        raise PeerUnavailable(
            f"agentic-api {AGENTIC_API_VERSION} is not installed at {binary}: run `make peers` "
            f"(pip install --target {home} agentic-api=={AGENTIC_API_VERSION})"
        )
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerUnavailable(f"{binary} does not run: {exc}") from exc
    if AGENTIC_API_VERSION not in out.stdout:
        raise PeerUnavailable(
            f"{binary} is {out.stdout.strip()!r}, not {AGENTIC_API_VERSION}: run `make peers`"
        )
    return binary


class AgenticGateway:
    """``agentic-server`` on a loopback port in front of ``upstream`` (an http base URL), its database and
    home in ``scratch``; ready once its ``/health`` answers 200 (it probes the upstream's first)."""

    def __init__(self, upstream: str, scratch: str) -> None:
        self.port = free_port()
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/responses"
        command = [
            str(agentic_server()),
            "--llm-api-base",
            upstream,
            "--gateway-host",
            "127.0.0.1",
            "--gateway-port",
            str(self.port),
            "--db-url",
            f"sqlite://{scratch}/agentic-api.db",
        ]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        env = dict(os.environ, HOME=scratch, NO_COLOR="1", RUST_LOG="warn")
        try:
            self.proc = subprocess.Popen(
                command, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=scratch
            )
        except OSError as exc:
            self._log.close()
            raise PeerUnavailable(f"agentic-server did not start: {exc}") from exc
        self.process = psutil.Process(self.proc.pid)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerUnavailable(f"agentic-server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.http_url + "/health", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)
        raise PeerUnavailable(f"agentic-server did not answer /health within {timeout_s} s:\n{self.log()}")

    def cpu_s(self) -> float:
        return cpu_seconds(self.process)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def agentic_api(flags: list[str]) -> Iterator[tuple[ChildServer, AgenticGateway]]:
    """An upstream ``responses-lab serve FLAGS --log-level info`` (its log holds the per-turn reports the
    gateway drops) and agentic-api in front of it; both stopped on the way out."""
    agentic_server()  # not installed: fail before starting anything
    with tempfile.TemporaryDirectory(prefix="responses-lab-peer-") as scratch:
        upstream = ChildServer([*flags, "--log-level", "info"])
        try:
            upstream.wait_ready()
            gateway = AgenticGateway(upstream.http_url, scratch)
            try:
                gateway.wait_ready()
                yield upstream, gateway
            finally:
                gateway.stop()
        finally:
            upstream.stop()


def upstream_records(log: str) -> list[dict[str, Any]]:
    """The upstream's ``response_ended`` log lines (JSON), in the order it wrote them."""
    records = []
    for line in log.splitlines():
        if '"response_ended"' not in line:
            continue
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("event") == "response_ended":
                records.append(record)
    return records


def upstream_ttft_ms(record: dict[str, Any]) -> float:
    """What the upstream's report accounts for before its first token: the response's phases, then its
    first segment's batch-queue wait and modelled prefill."""
    first = record["lab_turns"][0]
    return (
        sum(float(ms) for ms in record.get("phases_ms", {}).values())
        + float(first["queue_wait_ms"])
        + float(first["prefill_ms"])
    )


def attach_upstream(
    traces: list[Trace], replay: Replay, model: str, config: BenchConfig, records: list[dict[str, Any]]
) -> list[list[float]]:
    """Pair every client turn with the upstream response that served it (module docstring), fold that
    response's report and phases into the trace as the other modes' terminal events do, and return each
    trace's upstream TTFT per turn (ms)."""
    sizes = {
        s.name: [send.prompt_tokens for send in build_plan(s, model, "0" * 12).sends] for s in replay.sessions
    }
    ends: list[tuple[float, int, int]] = []  # (terminal event time, trace, turn)
    for index, trace in enumerate(traces):
        turn = -1
        for mark in trace.marks:
            if mark.kind == SEND:
                turn += 1
            elif mark.kind in BOUNDARY:
                ends.append((mark.t, index, turn))
    claimed = [False] * len(records)
    paired: list[dict[int, dict[str, Any]]] = [{} for _ in traces]
    for _, index, turn in sorted(ends):
        want = sizes[traces[index].session][turn]
        at = next(
            (i for i, r in enumerate(records) if not claimed[i] and int(r["input_tokens"]) == want), None
        )
        if at is None:
            raise PeerError(
                f"{traces[index].mode}: turn {turn} of a rollout sent {want} prompt tokens; the upstream "
                "served no such response (the gateway changed the history)"
            )
        claimed[at] = True
        paired[index][turn] = records[at]
    upstream: list[list[float]] = []
    for trace, turns in zip(traces, paired, strict=True):
        trace.reports.clear()
        trace.phases_ms.clear()
        for turn in sorted(turns):
            record = turns[turn]
            trace.reports.extend(record["lab_turns"])
            for name, ms in record.get("phases_ms", {}).items():
                trace.phases_ms[name] = trace.phases_ms.get(name, 0.0) + float(ms)
        upstream.append([upstream_ttft_ms(turns[t]) for t in sorted(turns)])
    return upstream


def split(ttft_ms: list[list[float]], upstream_ms: list[list[float]]) -> dict[str, Any]:
    """The gateway/upstream split of every turn's TTFT: per turn, p50s and per-turn-index medians."""
    rows = [
        {"rollout": r, "turn": k, "ttft_ms": t, "upstream_ms": u, "gateway_ms": t - u}
        for r, (ts, us) in enumerate(zip(ttft_ms, upstream_ms, strict=True))
        for k, (t, u) in enumerate(zip(ts, us, strict=True))
    ]
    by_turn = max((len(ts) for ts in ttft_ms), default=0)

    def median(key: str, turn: int | None = None) -> float | None:
        values = [row[key] for row in rows if turn is None or row["turn"] == turn]
        return statistics.median(values) if values else None

    return {
        "gateway_ms_p50": median("gateway_ms"),
        "upstream_ms_p50": median("upstream_ms"),
        "gateway_ms_by_turn": [median("gateway_ms", k) for k in range(by_turn)],
        "upstream_ms_by_turn": [median("upstream_ms", k) for k in range(by_turn)],
        "turns": rows,
    }


def peer_info(mode: str, config: BenchConfig) -> dict[str, Any] | None:
    """What a run record says about who served it and how it was timed; None for this server's own modes."""
    if mode == AGENTIC_API:
        return {
            "name": AGENTIC_API,
            "version": AGENTIC_API_VERSION,
            "upstream": "http",
            "timing": UPSTREAM_REPORT,
        }
    if config.url:
        return {"name": "external", "url": config.url, "timing": CLIENT_ONLY}
    return None


async def run_peer_modes(
    modes: Sequence[str],
    replay: Replay,
    model: str,
    config: BenchConfig,
    flags: list[str],
    indices: Sequence[int],
    tallies: dict[str, Any],
    on_turn: Callable[[], None] | None,
    block: Callable[..., Awaitable[None]],
) -> dict[str, dict[str, Any]]:
    """A group's peer modes: each one's processes started for it, then the group's rollout indices run
    through the gateway's WebSocket by the runner's own ``_block`` (the same plans and seeded tool times as
    the group's other modes, so its gains pair by rollout index; it runs after them, not interleaved with
    them), the upstream's reports attached, and the split. CPU is the gateway's and the upstream's
    together. ``block`` is the runner's ``_block``, handed over so that this module does not import the
    runner."""

    out: dict[str, dict[str, Any]] = {}
    for mode in modes:
        with agentic_api(flags) as (upstream, gateway):

            def cpu(up: ChildServer = upstream, gw: AgenticGateway = gateway) -> float:
                return gw.cpu_s() + up.cpu_s()

            before = len(tallies[mode].traces)
            server = ("peer", gateway.ws_url, gateway.http_url, cpu, ())
            await block([mode], replay, model, config, server, indices, tallies, [], on_turn)
            traces = tallies[mode].traces[before:]
            want = sum(len(t.kinds) for t in traces)
            records = await _records(upstream, want)
        upstream_ms = attach_upstream(traces, replay, model, config, records[-want:] if want else [])
        ttft = [[turn.ttft_ms for turn in rollout_metrics(t).turns] for t in traces]
        info = peer_info(mode, config) or {}
        # The calls the upstream's model made in the measured turns, by tool, from its log: each one the
        # client ran (a turn whose calls the plan does not answer fails the rollout) and answered through
        # the gateway.
        calls = Counter(name for r in records[-want:] if want for name in r.get("calls", []))
        out[mode] = {**info, "upstream_calls": dict(sorted(calls.items())), **split(ttft, upstream_ms)}
    return out


async def _records(upstream: ChildServer, want: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The upstream's records once its log holds at least ``want`` of them (it writes a response's line
    just after the response's last event)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = upstream_records(upstream.output())
        if len(records) >= want or time.monotonic() > deadline:
            return records
        await asyncio.sleep(0.02)


__all__ = [
    "AGENTIC_API_VERSION",
    "AgenticGateway",
    "PeerError",
    "PeerUnavailable",
    "agentic_api",
    "attach_upstream",
    "peer_info",
    "run_peer_modes",
    "split",
    "upstream_records",
]
