"""The figures behind NOTES.md, "Issue 15"'s fleet section: N API servers sharing one PostgreSQL, driven by
Locust in its distributed mode (a local master and W workers), for a bounded time, on this machine.

    PYTHONPATH=. .venv/bin/python scripts/fleet_figures.py --servers 2 --workers 2 --users 24 --seconds 60

It starts everything itself (a throwaway PostgreSQL with its default durability — ``fsync`` on — from
tests/databases.py, the API servers as ``responses-lab serve --db postgresql://…`` processes, Locust), and
measures, around the load: turns and rollouts completed (Locust's exact samples, scripts/locustfile.py),
the CPU seconds of the API servers, of PostgreSQL (the postmaster and its backends) and of the Locust
processes (their rusage), and PostgreSQL's commits (``pg_stat_database``). It prints them per turn — the
inputs of the capacity arithmetic — with TTFT/E2E per mode, and writes them as JSON (``--out``).
Loopback only; everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's throwaway PostgreSQL

from databases import PostgresServer  # noqa: E402

from proto.processes import ChildServer, cpu_seconds  # noqa: E402
from proto.server.serve import free_port  # noqa: E402


def postgres_cpu(pg: PostgresServer) -> float:
    master = psutil.Process(pg.postmaster_pid)
    total = 0.0
    for proc in [master, *master.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a backend that ended meanwhile: lost to both readings alike
            total += cpu_seconds(proc)
    return total


def commits(pg: PostgresServer) -> int:
    with pg.connect() as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = 'lab'").fetchone()
    return int(row[0]) if row else 0


def wait_rusage(proc: subprocess.Popen[bytes], timeout: float) -> float:
    """Wait for a child and return its user + system CPU seconds (its own rusage, read at exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return float(usage.ru_utime + usage.ru_stime)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{proc.args} did not exit")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="Locust worker processes")
    parser.add_argument("--users", type=int, default=24)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--workload", default="coding-agent", help="as bench --workload (scripts/soak-like.json: soak's shape)")
    parser.add_argument("--model", default="mock-4000tps")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tool-time-scale", type=float, default=0.1)
    parser.add_argument("--db", default="postgresql", choices=["postgresql", "sqlite"], help="sqlite: one file shared")
    parser.add_argument("--out", type=Path, default=Path("fleet-out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]  # the machine is shared: say how busy it was
    flags = ["--model-override", f"{args.model}:prefill-overhead=1,prefill-time-per-token=0", "--log-level", "warning"]
    pg = PostgresServer(durable=True).start() if args.db == "postgresql" else None
    scratch = tempfile.TemporaryDirectory(prefix="fleet-")
    servers: list[ChildServer] = []
    try:
        url = pg.fresh() if pg is not None else f"{scratch.name}/fleet.sqlite3"
        servers = [ChildServer(flags, db=url) for _ in range(args.servers)]
        for server in servers:
            server.wait_ready()
        locust = [sys.executable, "-m", "locust", "-f", str(ROOT / "scripts" / "locustfile.py")]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        port = str(free_port())
        workers = [subprocess.Popen([*locust, "--worker", "--master-host", "127.0.0.1", "--master-port", port],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(args.workers)]
        api0 = sum(s.cpu_s() for s in servers)
        pg0 = postgres_cpu(pg) if pg else 0.0
        commits0 = commits(pg) if pg else 0
        t0 = time.perf_counter()
        master = subprocess.Popen(
            [*locust, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", port, "--expect-workers",
             str(args.workers), "--headless", "-u", str(args.users), "-r", str(args.users), "-t", f"{args.seconds}s",
             "--host", servers[0].http_url, "--rl-hosts", ",".join(s.http_url for s in servers), "--rl-model", args.model, "--rl-workload", args.workload,
             "--rl-turns", str(args.turns), "--rl-tool-time-scale", str(args.tool_time_scale),
             "--rl-out", str(args.out / "locust-figures.json"), "--json-file", str(args.out / "locust"), "--only-summary"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        master_cpu = wait_rusage(master, args.seconds + 120)
        wall = time.perf_counter() - t0
        worker_cpu = [wait_rusage(w, 60) for w in workers]
        api_cpu = sum(s.cpu_s() for s in servers) - api0
        pg_cpu = (postgres_cpu(pg) - pg0) if pg else 0.0
        pg_commits = (commits(pg) - commits0) if pg else 0
        assert master.stdout is not None
        printed = master.stdout.read().decode()
    finally:
        for server in servers:
            server.stop()
        if pg is not None:
            pg.stop()
        scratch.cleanup()
    figures = json.loads((args.out / "locust-figures.json").read_text())
    turns = sum(row["ttft"]["n"] for row in figures.values())
    rollouts = sum(row["e2e"]["n"] for row in figures.values())
    errors = sum(row["errors"] for row in figures.values())
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "servers": args.servers, "locust_workers": args.workers, "users": args.users, "seconds": args.seconds,
        "db": args.db, "workload": args.workload, "model": args.model, "turns_per_rollout": args.turns, "wall_s": wall,
        # Per second of Locust's run time (-t), not of this script's wall time (start-ups included).
        "turns": turns, "rollouts": rollouts, "errors": errors, "turns_per_s": turns / args.seconds,
        "load_average_before": load_before, "machine_cpus": os.cpu_count(),
        "api_cpu_ms_per_turn": api_cpu * 1e3 / max(turns, 1),
        "postgres_cpu_ms_per_turn": pg_cpu * 1e3 / max(turns, 1),
        "postgres_commits_per_turn": pg_commits / max(turns, 1),
        "locust_worker_cpu_ms_per_turn": sum(worker_cpu) * 1e3 / max(turns, 1),
        "locust_master_cpu_s": master_cpu,
        "by_mode": figures,
    }
    (args.out / "fleet.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(printed[printed.find("responses-lab figures"):].split("\n[")[0])
    for key in ("turns", "rollouts", "errors", "turns_per_s", "api_cpu_ms_per_turn", "postgres_cpu_ms_per_turn",
                "postgres_commits_per_turn", "locust_worker_cpu_ms_per_turn", "locust_master_cpu_s", "wall_s",
                "load_average_before"):
        value = result[key]
        print(f"{key:32} {value:.3f}" if isinstance(value, float) else f"{key:32} {value}")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
