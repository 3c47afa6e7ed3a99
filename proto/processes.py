"""Our servers as child processes on free loopback ports: ``responses-lab serve`` (the latency lab's and the
soak's server) and ``responses-lab engine`` (the engine ``serve --workers N`` and the lab start).

A subprocess, so the CPU time and RSS psutil reads of it are the server's alone (its own children — the
workers and the engine of ``--workers N`` — included). ``RESPONSES_LAB_*`` variables are not passed on: the
child is configured by its flags only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import httpx
import psutil


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the kernel's pick); the caller binds it soon after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def cpu_seconds(process: psutil.Process, children: bool = True) -> float:
    """User + system CPU seconds the process (and, by default, every process below it) has used so far.
    A child that exited is no longer counted; the lab reads CPU around runs its processes outlive."""
    processes = [process]
    if children:
        with contextlib.suppress(psutil.Error):
            processes += process.children(recursive=True)
    total = 0.0
    for each in processes:
        with contextlib.suppress(psutil.Error):
            times = each.cpu_times()
            total += times.user + times.system
    return total


@dataclass(frozen=True)
class Placement:
    """Where a child runs and how it is reached, when not on this namespace's loopback: a command prefix
    (``ip netns exec NS``), the address and port it binds, the base URL its clients use, and flags it
    needs there (a TLS certificate). proto/lab/run/network.py makes one per server on a shaped link."""

    prefix: tuple[str, ...]
    bind: str
    port: int
    url: str
    flags: tuple[str, ...] = ()


class ChildProcess:
    """``python -m proto COMMAND --port P FLAGS…``, started at construction; ready once ``health`` answers
    200. ``with`` waits for it and stops it on the way out. To start several at once, construct them all,
    then :meth:`wait_ready` each, and :meth:`stop` each at the end."""

    STOP_TIMEOUT_S = 30.0  # after SIGTERM, before SIGKILL

    def __init__(
        self,
        command: str,
        flags: Sequence[str],
        health: str,
        *,
        port: int | None = None,
        api_key: str | None = None,
        new_session: bool = False,
        capture: bool = True,
        pythonpath: str | None = None,
        placement: Placement | None = None,
    ) -> None:
        """``pythonpath``: run the child's code from that checkout (there, so ``-m proto`` imports it first):
        a before/after in one run (``responses-lab perf --compare``). ``placement``: run it elsewhere (a
        network namespace) and reach it there."""
        self.name = command
        self.api_key = api_key
        self.health = health
        if placement is None:
            self.port = port or free_port()
            self.http_url = f"http://127.0.0.1:{self.port}"
            where: list[str] = []
        else:
            self.port, self.http_url = placement.port, placement.url
            where = ["--host", placement.bind, *placement.flags]
        prefix = list(placement.prefix) if placement else []
        self.command = [
            *prefix,
            sys.executable,
            "-m",
            "proto",
            command,
            "--port",
            str(self.port),
            *where,
            *flags,
        ]
        self.new_session = new_session
        self.pythonpath = pythonpath
        # Captured for log() (the lab, the tests), or the parent's own stdout and stderr (an operator's
        # server).
        self._log = tempfile.TemporaryFile() if capture else None  # noqa: SIM115 (closed in stop())
        self._start()

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}
        if self.pythonpath is not None:
            env["PYTHONPATH"] = self.pythonpath
        # A new session keeps a terminal's Ctrl-C (sent to the whole foreground group) from reaching it: its
        # owner stops it, in order (the engine after the workers that use it).
        output = subprocess.STDOUT if self._log is not None else None
        self.proc = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=output,
            env=env,
            start_new_session=self.new_session,
            cwd=self.pythonpath,
        )
        self.process = psutil.Process(self.proc.pid)  # for its CPU time and RSS

    def restart(self) -> None:
        """Start it again on the same port (it exited)."""
        self.proc.wait()
        self._start()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until ``health`` answers 200; raises with the child's log if it exits or never answers."""
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.http_url + self.health, headers=headers, timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not answer {self.health} within {timeout_s} s:\n{self.log()}")

    def cpu_s(self) -> float:
        return cpu_seconds(self.process)

    def log(self) -> str:
        """The tail of what the child wrote to stdout and stderr (when captured)."""
        return self.output()[-4000:]

    def output(self) -> str:
        """Everything the child wrote to stdout and stderr so far (when captured)."""
        if self._log is None:
            return "(not captured: see this process's own output)"
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``STOP_TIMEOUT_S``."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=self.STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._log is not None:
            self._log.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown, no flush (the chaos suite's crash)."""
        self.proc.kill()
        self.proc.wait()
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> ChildProcess:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ChildServer(ChildProcess):
    """``responses-lab serve --port P --db DB [--api-key K] FLAGS…``."""

    def __init__(
        self,
        flags: Sequence[str] = (),
        *,
        db: str = ":memory:",
        api_key: str | None = None,
        pythonpath: str | None = None,
        placement: Placement | None = None,
    ) -> None:
        keyed = ["--api-key", api_key] if api_key else []
        super().__init__(
            "serve",
            ["--db", db, *keyed, *flags],
            "/healthz",
            api_key=api_key,
            pythonpath=pythonpath,
            placement=placement,
        )
        self.ws_url = "ws" + self.http_url.removeprefix("http") + "/v1/responses"

    def __enter__(self) -> ChildServer:
        super().__enter__()
        return self


class ChildEngine(ChildProcess):
    """``responses-lab engine --port P FLAGS…`` (the mock GPU behind vLLM's completions API)."""

    def __init__(
        self,
        flags: Sequence[str] = (),
        *,
        port: int | None = None,
        new_session: bool = False,
        capture: bool = True,
    ) -> None:
        super().__init__("engine", flags, "/health", port=port, new_session=new_session, capture=capture)

    def __enter__(self) -> ChildEngine:
        super().__enter__()
        return self
