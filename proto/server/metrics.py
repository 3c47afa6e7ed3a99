"""``/metrics``: Prometheus text from the engines' gauges and the pipeline's work counters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from proto.server.app import Server


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
        ledger = GaugeMetricFamily("responses_lab_ledger_rows_written", "usage rows written", value=pipeline.ledger.rows_written)
        yield ledger


def render_metrics(server: Server) -> bytes:
    registry = CollectorRegistry()
    registry.register(_ServerCollector(server))
    return generate_latest(registry)
