"""``serve --workers N``: N API processes on one port, one engine behind them all, one store.

The supervisor (this process) binds the port once and hands the listening socket to N spawned workers; the
kernel gives each new connection to whichever worker accepts first. Each worker is a whole ``LabServer``
(our shutdown path: SIGTERM ends every open session with ``server_shutting_down`` and close 1001, then the
ledger and the store are flushed), not uvicorn's plain ``Server`` that its own ``--workers`` runs (which
drops WebSockets with 1012).

The workers share what must be one: the engine (``--engine URL``, or a ``responses-lab engine`` this
supervisor starts, so N workers mean one prefix cache and one batch queue, not N mock GPUs) and the store
and ledger (``--db``: a SQLite file in WAL mode, which several processes on one host share; a memory
database cannot be shared, so it is refused).

Signals: SIGTERM or SIGINT to the supervisor is passed to every worker as SIGTERM; the supervisor waits for
them (their drain takes up to ``--shutdown-grace-s``), then stops the engine it started — last, since the
draining workers still use it (it runs in its own session, so a terminal's Ctrl-C does not reach it
first). A worker that dies is replaced; one that fails to start stops the whole server, as uvicorn's
supervisor does (its exit code 3 would fail the same way on every restart).
"""

from __future__ import annotations

import multiprocessing
import signal
import socket
import sys
import threading
from dataclasses import replace
from multiprocessing.process import BaseProcess

import structlog
import uvicorn
from uvicorn.config import STARTUP_FAILURE

from proto.processes import ChildEngine
from proto.server.config import Settings, check_bind
from proto.server.logs import configure
from proto.server.serve import LabServer, freeze_startup_objects, start_up_refusals, uvicorn_config
from proto.server.storage.database import claim_file, is_postgres

log = structlog.get_logger("proto.server.workers")
POLL_S = 0.5  # how often the supervisor looks at its children
JOIN_MARGIN_S = 15.0  # past the shutdown grace, before a worker that has not exited is killed


def serve_workers(settings: Settings) -> None:
    check_bind(settings)
    configure(settings.log_level)
    if settings.db in ("", ":memory:"):
        raise SystemExit(
            "--workers N shares the store between processes: give --db a file, not a memory database"
        )
    # One server per SQLite file: this supervisor claims it for its workers, before it starts anything,
    # and holds it for as long as it runs (docs/operations.md, "Databases").
    with start_up_refusals():
        claim = None if settings.db_shared else claim_file(settings.db)
    engine = None
    try:
        if not settings.engine:
            flags = ["--log-level", settings.log_level]
            for override in settings.model_override:
                flags += ["--model-override", override]
            engine = ChildEngine(flags, new_session=True, capture=False)  # its log lines join the workers
            engine.wait_ready()
            settings = replace(settings, engine=engine.http_url)
            log.warning("engine.started", url=engine.http_url, pid=engine.proc.pid)
        if not is_postgres(settings.db):
            # Once, here, before any worker serves (each worker's ledger holds its own owner lock, so a
            # later start never bills a live worker's rows). On PostgreSQL each worker reconciles.
            with start_up_refusals():
                reconcile_ledger(settings.db)
        # Bound once, here: every worker accepts on this socket. The app string is never loaded.
        sock = uvicorn.Config(
            "proto.server.app:create_app", host=settings.host, port=settings.port
        ).bind_socket()
        Supervisor(settings, sock, engine).run()
    finally:
        if engine is not None:
            engine.stop()
        if claim is not None:
            claim.release()


def reconcile_ledger(db: str) -> int:
    """Bill the responses a dead server left open in ``db``'s ledger (``UsageLedger.reconcile``)."""
    from proto.server.background import reconcile_stored
    from proto.server.storage.ledger import UsageLedger
    from proto.server.storage.store import ResponseStore

    ledger = UsageLedger(db)
    store = ResponseStore(db)
    try:
        reconcile_stored(store, ledger.owner)  # and the background responses they left running
        return ledger.reconcile()
    finally:
        store.close()
        ledger.close()


class Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket, engine: ChildEngine | None) -> None:
        self.settings = settings
        self.sock = sock
        self.engine = engine
        self.stopping = threading.Event()
        self.workers: list[BaseProcess] = []
        # a fresh interpreter: no loop or thread inherited
        self._context = multiprocessing.get_context("spawn")

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        self.workers = [self._spawn(i) for i in range(self.settings.workers)]
        while not self.stopping.wait(POLL_S):
            self._keep_alive()
        self._stop_workers()

    def _spawn(self, index: int) -> BaseProcess:
        process = self._context.Process(
            target=run_worker, args=(self.settings, self.sock), name=f"responses-lab-worker-{index}"
        )
        process.start()
        return process

    def _keep_alive(self) -> None:
        for index, process in enumerate(self.workers):
            if process.is_alive():
                continue
            if process.exitcode == STARTUP_FAILURE:
                log.error("worker.start_failed", pid=process.pid)
                self.stopping.set()
                return
            log.warning("worker.died", pid=process.pid, exitcode=process.exitcode)
            self.workers[index] = self._spawn(index)
        if self.engine is not None and self.engine.proc.poll() is not None:
            log.error("engine.died", returncode=self.engine.proc.returncode)
            self.engine.restart()  # same port: the workers' pools reconnect to it

    def _stop_workers(self) -> None:
        for process in self.workers:
            if process.is_alive():
                process.terminate()  # SIGTERM: each worker drains its own sessions
        for process in self.workers:
            process.join(self.settings.shutdown_grace_s + JOIN_MARGIN_S)
            if process.is_alive():
                log.error("worker.kill", pid=process.pid)
                process.kill()
                process.join()


def run_worker(settings: Settings, sock: socket.socket) -> None:
    """One worker process: a ``LabServer`` on the inherited socket."""
    configure(settings.log_level)
    server = LabServer(uvicorn_config(settings, reconcile=is_postgres(settings.db)))
    freeze_startup_objects()
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)
