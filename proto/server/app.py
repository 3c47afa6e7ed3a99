"""The starlette app: one server, one port, every endpoint of docs/protocol.md, "Endpoints"."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator

import structlog
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from proto.core.errors import ClientError
from proto.engine.routing import Replicas
from proto.server.admission import AdmissionCollector
from proto.server.auth import Auth, error_response, unauthorized
from proto.server.config import Settings
from proto.server.conversations import ConversationRoutes
from proto.server.logs import configure as configure_logs
from proto.server.model_list import models_list
from proto.server.pipeline import Pipeline
from proto.server.stages.item_cache import ItemCache
from proto.server.storage.database import claim_file
from proto.server.transports.http import HttpResponses
from proto.server.transports.websocket import SHUTDOWN
from proto.server.transports.ws_ga import GaConnection
from proto.server.transports.ws_longlived import LongLivedConnection
from sampler.clock import Clock

log = structlog.get_logger("proto.server")


class Server:
    """Everything one app instance owns; ``app.state.server``."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.auth = Auth(settings.api_key)
        self.pipeline = Pipeline(settings, clock)
        self.connections: set[LongLivedConnection | GaConnection] = set()
        self.http = HttpResponses(self.auth, self.pipeline)
        self.conversations = ConversationRoutes(self.auth, self.pipeline, self.http.body_bytes)

    async def drain(self, grace_s: float) -> int:
        """Shutdown, before uvicorn's own (which would drop every WebSocket with 1012): tell each session
        to end — its open response gets ``server_shutting_down`` and is billed, the connection closes 1001 —
        and wait up to ``grace_s`` for them; every HTTP response in flight is cut alike
        (``HttpResponses.stop``).
        Returns how many connections were still open when the grace ran out."""
        self.http.stop()
        for connection in list(self.connections):
            connection.stop(SHUTDOWN)
        # Real time, whatever the limits' clock: a SIGTERM's grace is the operator's, not a protocol limit.
        end = time.monotonic() + grace_s
        # Polled: each connection ends on its own task; one bounded wait is simpler than an event per
        # connection.
        while self.connections and time.monotonic() < end:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await self.http.background.drain(end - time.monotonic())  # each stores its end before the store does
        return len(self.connections)


class ServerCollector(Collector):
    """Gauges read at scrape time, on the server's loop: the engines, the pipeline's work counters, the
    open sessions and their send queues, the tasks alive, the ledger."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        pipeline = self.server.pipeline
        per_engine: dict[str, GaugeMetricFamily] = {}
        for model, gpu in pipeline.engines.gpus.items():
            for name, value in gpu.metrics().items():
                family = per_engine.setdefault(
                    name,
                    GaugeMetricFamily(f"responses_lab_engine_{name}", f"mock GPU {name}", labels=["model"]),
                )
                family.add_metric([model], value)
        yield from per_engine.values()
        remote = pipeline.engines.remote
        if remote is not None:  # the engine's own gauges are on its /metrics; these are this side's
            for name, value in remote.metrics().items():
                yield GaugeMetricFamily(
                    f"responses_lab_engine_client_{name}",
                    f"engine hop: {name.replace('_', ' ')}",
                    value=value,
                )
        if isinstance(remote, Replicas):  # several replicas: where the router sent the sequences
            routed = CounterMetricFamily(
                "responses_lab_engine_routed",
                "engine sequences routed, by replica",
                labels=["replica", "policy"],
            )
            for index, count in enumerate(remote.router.routed):
                routed.add_metric([str(index), remote.router.policy], float(count))
            yield routed
        work = CounterMetricFamily("responses_lab_work", "pipeline work done, by kind", labels=["kind"])
        for name in pipeline.totals.__struct_fields__:
            work.add_metric([name], float(getattr(pipeline.totals, name)))
        yield work
        yield GaugeMetricFamily(
            "responses_lab_ws_sessions", "open WebSocket sessions", value=len(self.server.connections)
        )
        # Scraped on the server's loop: a leak of one task per dropped connection shows here (soak).
        yield GaugeMetricFamily(
            "responses_lab_tasks", "asyncio tasks alive on the server loop", value=len(asyncio.all_tasks())
        )
        queued = sum(connection.out.qsize() for connection in self.server.connections)
        yield GaugeMetricFamily(
            "responses_lab_send_queue_frames", "frames waiting in every session's send queue", value=queued
        )
        ledger = pipeline.ledger
        yield GaugeMetricFamily(
            "responses_lab_ledger_unwritable",
            "1 while the database refuses the ledger's writes (new responses: ledger_unavailable)",
            value=int(ledger.unwritable is not None),
        )
        yield GaugeMetricFamily(
            "responses_lab_ledger_rows_written", "usage rows written", value=ledger.rows_written
        )
        yield GaugeMetricFamily(
            "responses_lab_ledger_rows_retried",
            "ledger write attempts that failed and were retried",
            value=ledger.retries,
        )
        yield GaugeMetricFamily(
            "responses_lab_ledger_pending",
            "ledger operations accepted, not yet durable",
            value=ledger.pending,
        )
        yield GaugeMetricFamily(
            "responses_lab_ledger_failed",
            "usage rows the ledger gave up on (logged with their ids)",
            value=ledger.failed,
        )
        yield GaugeMetricFamily(
            "responses_lab_ledger_overflow",
            "ledger calls refused: pending buffer full",
            value=ledger.overflow,
        )
        yield GaugeMetricFamily(
            "responses_lab_ledger_duplicates",
            "usage rows refused: response id already billed",
            value=ledger.duplicates,
        )
        yield GaugeMetricFamily(
            "responses_lab_ledger_reconciled",
            "responses a dead process left open, billed at start-up (server_crashed)",
            value=ledger.reconciled,
        )


class ItemCacheCollector(Collector):
    """``http-cached``'s item cache, read at scrape time (its hits and misses are in
    ``responses_lab_work``)."""

    def __init__(self, cache: ItemCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        cache = self.cache
        yield GaugeMetricFamily(
            "responses_lab_item_cache_tokens",
            "http-cached: token ids the item cache holds",
            value=cache.tokens,
        )
        yield GaugeMetricFamily(
            "responses_lab_item_cache_entries", "http-cached: item bodies the cache holds", value=len(cache)
        )
        yield CounterMetricFamily(
            "responses_lab_item_cache_evictions",
            "http-cached: entries evicted (LRU, past --item-cache-tokens)",
            value=cache.evictions,
        )


# Codex's WebSocket transports name themselves in the handshake (codex-rs/codex-api, responses_websocket):
# v1, on response.append (0.87-0.107), sends this beta; v2 (GA WebSocket mode) sends =2026-02-06. The query
# parameter wins when both are given.
LONGLIVED_BETA = "responses_websockets=2026-02-04"


def protocol_of_beta(header: str | None) -> str:
    """``OpenAI-Beta`` (comma-separated values) → the protocol it selects; GA mode unless it is v1's."""
    values = {value.strip() for value in (header or "").split(",")}
    return "longlived" if LONGLIVED_BETA in values else "ga"


def create_app(
    settings: Settings | None = None, clock: Clock | None = None, reconcile: bool = True
) -> Starlette:
    """``clock`` drives the server's limits (idle, age, tool, send and shutdown timeouts): tests pass a
    ``FakeClock`` to run them on virtual time. ``reconcile``: bill, before serving, the responses a dead
    process left open in the ledger (on SQLite one process per database does it: ``--workers N``
    reconciles in the parent, before the workers start, never in a worker — it would bill its live
    siblings' responses; on PostgreSQL every worker does, as it knows who is alive). The app that
    reconciles a SQLite file claims it first, for as long as it runs: a second server on the same file is
    refused (``DatabaseInUse``) before it touches it (docs/operations.md, "Databases")."""
    settings = settings or Settings()
    configure_logs(settings.log_level)  # before anything logs: JSON lines, redacted, at this level
    claim = claim_file(settings.db) if reconcile and not settings.db_shared else None
    try:
        server = Server(settings, clock)
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    server.pipeline.metrics.registry.register(ServerCollector(server))
    server.pipeline.metrics.registry.register(ItemCacheCollector(server.pipeline.item_cache))
    server.pipeline.metrics.registry.register(AdmissionCollector(server.pipeline.admission))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if reconcile:
            await server.pipeline.ledger.areconcile()  # before the writer starts and before any response
            await server.http.background.reconcile()  # background responses a dead process left running
        await server.pipeline.start()
        try:
            yield
        finally:
            await server.pipeline.aclose()
            if claim is not None:
                claim.release()  # last: every write of this server is done

    async def responses_ws(ws: WebSocket) -> None:
        key_id = server.auth.identify(ws.headers)
        if key_id is None:
            await ws.send_denial_response(error_response(unauthorized()))
            return
        protocol = ws.query_params.get("protocol") or protocol_of_beta(ws.headers.get("openai-beta"))
        if protocol not in ("longlived", "ga"):
            await ws.send_denial_response(
                error_response(ClientError("invalid_request", f"unknown protocol {protocol!r}", "protocol"))
            )
            return
        await ws.accept()
        structlog.contextvars.bind_contextvars(conn_id="conn_" + secrets.token_hex(6), protocol=protocol)
        connection: LongLivedConnection | GaConnection
        if protocol == "longlived":
            connection = LongLivedConnection(ws, server.pipeline, key_id)
        else:
            connection = GaConnection(ws, server.pipeline, key_id)
        server.connections.add(connection)
        try:
            await connection.serve()
        finally:
            server.connections.discard(connection)

    async def models(request: Request, key_id: str) -> Response:
        return JSONResponse(models_list(server.pipeline.engines.cards()))

    async def healthz(request: Request, key_id: str) -> Response:
        return JSONResponse({"status": "ok"})

    async def health(request: Request) -> Response:
        """vLLM's ``GET /health``, so a gateway built for vLLM (agentic-api) probes this server unmodified:
        200 with an empty body while it serves, 503 (empty) once it no longer takes work (shutting down:
        vLLM's answer for a dead engine), and no key asked, as vLLM's key guards only ``/v1`` paths
        (docs/protocol.md, "Authentication")."""
        return Response(status_code=503 if server.http.stopping else 200)

    async def metrics(request: Request, key_id: str) -> Response:
        return Response(
            generate_latest(server.pipeline.metrics.registry), media_type="text/plain; version=0.0.4"
        )

    app = Starlette(
        routes=[
            WebSocketRoute("/v1/responses", responses_ws),
            *server.http.routes(),
            *server.conversations.routes(),
            Route("/v1/models", server.auth.guard(models)),
            Route("/healthz", server.auth.guard(healthz)),
            Route("/health", health),
            Route("/metrics", server.auth.guard(metrics)),
        ],
        lifespan=lifespan,
    )
    app.state.server = server
    return app
