"""scripts/locustfile.py runs for real: Locust headless on one machine, and in its distributed mode (a local
master and two workers), against a real server process, every user type, for a bounded few seconds.

Checked: every mode ran rollouts without an error, the exact figures the workers ship to the master are the
samples Locust itself counted (its final statistics), and they mean what the lab's do (TTFT below E2E; one
TTFT and one
overhead per turn). Nothing about speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import MODEL

from proto.processes import ChildServer, free_port

pytestmark = pytest.mark.process  # every test starts a server or a process

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = ROOT / "scripts" / "locustfile.py"
FLAGS = ["--model-override", f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0", "--log-level", "warning"]
TURNS = 4  # a shortened coding-agent rollout: three tool turns, then the answer
GUARD = 120  # seconds: a guard against hangs only


def locust(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args]


def load_args(host: str, out: Path) -> list[str]:
    return [
        "--headless",
        "-u",
        "3",
        "-r",
        "3",
        "-t",
        "4s",
        "--host",
        host,
        "--rl-model",
        MODEL,
        "--rl-turns",
        str(TURNS),
        "--rl-tool-time-scale",
        "0",
        "--rl-out",
        str(out / "figures.json"),
        "--json-file",
        str(out / "locust"),
        "--only-summary",
    ]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def check(out: Path) -> dict[str, Any]:
    figures: dict[str, Any] = json.loads((out / "figures.json").read_text())
    assert set(figures) == {"http", "ws", "longlived"}, figures
    # Locust's final statistics (its CSV lags by up to a second; the JSON file is written after the stop).
    counted = {
        (e["method"], e["name"]): e["num_requests"] for e in json.loads((out / "locust.json").read_text())
    }
    for mode, row in figures.items():
        assert row["errors"] == 0, (mode, row)
        rollouts = row["e2e"]["n"]
        assert rollouts > 0 and row["ttft"]["n"] == row["overhead"]["n"] == rollouts * TURNS, (mode, row)
        # The exact samples and Locust's own counts are the same events, merged two ways.
        assert counted[("E2E", mode)] == rollouts and counted[("TTFT", mode)] == row["ttft"]["n"], (
            mode,
            counted,
        )
        assert 0 < row["ttft"]["p50_ms"] < row["e2e"]["p50_ms"]
    return figures


@pytest.fixture(scope="module")
def server() -> Any:
    with ChildServer(FLAGS, db=":memory:") as srv:
        yield srv


def test_headless_on_one_machine(server: ChildServer, tmp_path: Path) -> None:
    done = subprocess.run(
        locust(*load_args(server.http_url, tmp_path)),
        env=env(),
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    check(tmp_path)
    assert "responses-lab figures (local" in done.stdout


def test_distributed_master_and_two_workers(server: ChildServer, tmp_path: Path) -> None:
    port = str(free_port())
    workers = [
        subprocess.Popen(
            locust("--worker", "--master-host", "127.0.0.1", "--master-port", port),
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        master = subprocess.run(
            locust(
                "--master",
                "--master-bind-host",
                "127.0.0.1",
                "--master-bind-port",
                port,
                "--expect-workers",
                "2",
                "--expect-workers-max-wait",
                "60",
                *load_args(server.http_url, tmp_path),
            ),
            env=env(),
            capture_output=True,
            text=True,
            timeout=GUARD,
            check=False,
        )
        assert master.returncode == 0, master.stderr[-3000:]
        for worker in workers:
            assert worker.wait(GUARD) == 0  # the master tells them to quit
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            assert worker.stderr is not None
            worker.stderr.close()
    check(tmp_path)
    assert "2 workers connected" in master.stderr and "responses-lab figures (master" in master.stdout
