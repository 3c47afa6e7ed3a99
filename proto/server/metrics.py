"""``/metrics``: per-stage histograms and per-mode counters (observed once per response, when it is
billed), plus the engines' gauges and the pipeline's work counters read at scrape time.

Each app has its own registry, so several servers in one process (tests, the lab) never share series.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from proto.builder import ResponseBuilder
    from proto.server.app import Server

# Sub-millisecond stages (tokenizing a tool output) up to multi-second ones (re-rendering 100 k tokens).
_STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PipelineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.stage = Histogram(
            "responses_lab_stage_seconds", "API pipeline stage time per turn", ["stage", "mode"],
            buckets=_STAGE_BUCKETS, registry=self.registry,
        )
        self.responses = Counter("responses_lab_responses", "responses ended, by mode and status", ["mode", "status"], registry=self.registry)
        self.turns = Counter("responses_lab_turns", "sampling segments, by mode", ["mode"], registry=self.registry)
        self.tokens = Counter("responses_lab_tokens", "billed tokens, by mode and kind", ["mode", "kind"], registry=self.registry)

    def observe(self, builder: ResponseBuilder) -> None:
        """One ended response: its turns' stage times and its usage."""
        lab, usage, mode = builder.lab, builder.usage, builder.lab.mode
        for turn in lab.turns:
            for stage, ms in turn.phases_ms.items():
                self.stage.labels(stage, mode).observe(ms / 1e3)
        self.responses.labels(mode, builder.response.status).inc()
        self.turns.labels(mode).inc(len(lab.turns))
        self.tokens.labels(mode, "input").inc(usage.input_tokens)
        self.tokens.labels(mode, "cached").inc(usage.input_tokens_details.cached_tokens)
        self.tokens.labels(mode, "output").inc(usage.output_tokens)


class _ServerCollector(Collector):
    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        pipeline = self.server.pipeline
        per_engine: dict[str, GaugeMetricFamily] = {}
        for model, gpu in pipeline.engines.gpus.items():
            for name, value in gpu.metrics().items():
                family = per_engine.setdefault(name, GaugeMetricFamily(f"responses_lab_engine_{name}", f"mock GPU {name}", labels=["model"]))
                family.add_metric([model], value)
        yield from per_engine.values()
        work = CounterMetricFamily("responses_lab_work", "pipeline work done, by kind", labels=["kind"])
        for name in pipeline.totals.__struct_fields__:
            work.add_metric([name], float(getattr(pipeline.totals, name)))
        yield work
        yield GaugeMetricFamily("responses_lab_ws_sessions", "open WebSocket sessions", value=len(self.server.sessions))
        # Scraped on the server's loop: a leak of one task per dropped connection shows here (soak).
        yield GaugeMetricFamily("responses_lab_tasks", "asyncio tasks alive on the server loop", value=len(asyncio.all_tasks()))
        queued = sum(session.out.qsize() for session in self.server.sessions)
        yield GaugeMetricFamily("responses_lab_send_queue_frames", "frames waiting in every session's send queue", value=queued)
        ledger = pipeline.ledger
        yield GaugeMetricFamily("responses_lab_ledger_rows_written", "usage rows written", value=ledger.rows_written)
        yield GaugeMetricFamily("responses_lab_ledger_rows_retried", "ledger write attempts that failed and were retried", value=ledger.retries)
        yield GaugeMetricFamily("responses_lab_ledger_pending", "ledger operations accepted, not yet durable", value=ledger.pending)
        yield GaugeMetricFamily("responses_lab_ledger_failed", "usage rows the ledger gave up on (logged with their ids)", value=ledger.failed)
        yield GaugeMetricFamily("responses_lab_ledger_overflow", "ledger calls refused: pending buffer full", value=ledger.overflow)
        yield GaugeMetricFamily("responses_lab_ledger_duplicates", "usage rows refused: response id already billed", value=ledger.duplicates)


def register_server(server: Server) -> None:
    server.pipeline.metrics.registry.register(_ServerCollector(server))


def render_metrics(server: Server) -> bytes:
    return generate_latest(server.pipeline.metrics.registry)
