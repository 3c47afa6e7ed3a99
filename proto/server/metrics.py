"""``/metrics``' own series: per-stage histograms and per-mode counters, observed once per response when it
is billed. What is read at scrape time (engines, sessions, the ledger) is collected by the app, which
owns those objects (``app.ServerCollector``).

Each app has its own registry, so several servers in one process (tests, the lab) never share series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from proto.core.builder import ResponseBuilder

# Sub-millisecond stages (tokenizing a tool output) up to multi-second ones (re-rendering 100 k tokens).
_STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class PipelineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.stage = Histogram(
            "responses_lab_stage_seconds",
            "API pipeline stage time per turn",
            ["stage", "mode"],
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self.responses = Counter(
            "responses_lab_responses",
            "responses ended, by mode and status",
            ["mode", "status"],
            registry=self.registry,
        )
        self.turns = Counter(
            "responses_lab_turns", "sampling segments, by mode", ["mode"], registry=self.registry
        )
        self.tokens = Counter(
            "responses_lab_tokens",
            "billed tokens, by mode and kind",
            ["mode", "kind"],
            registry=self.registry,
        )

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
