"""``responses-lab serve`` as a child process on a free loopback port: the latency lab's and the soak's server.

A subprocess, so the CPU time and RSS psutil reads of it are the server's alone. ``RESPONSES_LAB_*``
variables are not passed on: the child is configured by its flags only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from types import TracebackType

import httpx
import psutil


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds the process has used so far."""
    times = process.cpu_times()
    return float(times.user + times.system)


class ChildServer:
    """``responses-lab serve --port P --db DB [--api-key K] FLAGS…``, started at construction.

    ``with ChildServer(…) as server:`` waits for ``/healthz`` and stops the server on the way out. To start
    several at once, construct them all, then :meth:`wait_ready` each, and :meth:`stop` each at the end.
    """

    STOP_TIMEOUT_S = 30.0  # after SIGTERM, before SIGKILL

    def __init__(self, flags: Sequence[str] = (), *, db: str = ":memory:", api_key: str | None = None) -> None:
        from proto.server.run import free_port

        self.port = free_port()
        self.api_key = api_key
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/responses"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the process; closed in stop())
        command = [sys.executable, "-m", "proto", "serve", "--port", str(self.port), "--db", db]
        if api_key:
            command += ["--api-key", api_key]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_LAB_")}
        self.proc = subprocess.Popen([*command, *flags], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.process = psutil.Process(self.proc.pid)  # for its CPU time and RSS

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until ``/healthz`` answers 200; raises with the server's log if it exits or never answers."""
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.http_url + "/healthz", headers=headers, timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"the server did not answer /healthz within {timeout_s} s:\n{self.log()}")

    def cpu_s(self) -> float:
        return cpu_seconds(self.process)

    def log(self) -> str:
        """The tail of what the server wrote to stdout and stderr."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``STOP_TIMEOUT_S``."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=self.STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown, no flush (the chaos suite's crash)."""
        self.proc.kill()
        self.proc.wait()
        self._log.close()

    def __enter__(self) -> ChildServer:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
