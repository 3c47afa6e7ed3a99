"""``responses-lab engine``: the mock GPU as its own process, behind vLLM's completions API (``wire``).

One process serves every API process that points ``--engine`` at it, so their responses share one prefix
KV cache and one engine-step loop per model, as they would share a real vLLM. The step loop (its batch, the
step times of the model's profile or cited figures, KV admission and preemption), the cache, jitter and
failure injection are ``sampler.gpu.MockGPU``'s; this module only puts them on the wire:

* ``POST /v1/completions`` — token-id prompt, ``max_tokens`` tokens streamed as they come due (the mock
  has no end-of-sequence token: it always says exactly ``max_tokens``, as vLLM does with ``ignore_eos``
  and ``min_tokens`` = ``max_tokens``). ``stream: false`` answers once the last token is due.
* ``DELETE /v1/sequences/{id}`` — a pinned sequence's blocks go back (the ``responses_lab`` extension).
* ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (vLLM's metric names, per model).

A closed connection ends its request at once: Starlette cancels the stream, and ``run_turn``'s own cleanup
gives back the batch slot and the turn's cache pins (the engine then serves the next waiter). A pinned
sequence's blocks survive a disconnect (the API may come back for the next turn) but not their TTL: an API
process that dies leaks nothing for longer than ``pin_ttl_s`` (+ the 1 s sweep).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proto.engine.wire import (
    DONE,
    CompletionRequest,
    ErrorInfo,
    FinalChunk,
    LabRequest,
    PerRequestMetrics,
    PromptTokensDetails,
    StreamChoice,
    StreamChunk,
    TokenChunk,
    Usage,
    error_body,
    sse,
)
from sampler.clock import Clock
from sampler.engine import Breakpoint, EngineFailure, EngineOverloaded, EngineReport
from sampler.gpu import GpuSequence, MockGPU
from sampler.models import ContextLengthExceeded, ModelSpec
from sampler.tokens import TextStream, Tokenizer

log = structlog.get_logger("proto.engine")
_encode = msgspec.json.Encoder().encode
_decode_request = msgspec.json.Decoder(CompletionRequest).decode
PIN_SWEEP_S = 1.0  # expired pins are dropped this often
# vLLM's histogram buckets for request_queue_time_seconds / request_prefill_time_seconds (loggers.py).
_TIME_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class RequestError(Exception):
    """A request the engine refuses, with the HTTP status vLLM would answer it with."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass
class Lease:
    """A sequence the engine keeps between requests (``responses_lab.sequence_id``)."""

    model: str
    sequence: GpuSequence
    expires_at: float
    busy: bool = False  # a request is running on it
    deleted: bool = False  # DELETE came while it was busy: the running request must not pin it again
    salt: str = ""  # its cache_salt: a later request on it must send the same


class MockEngine:
    """Everything the engine process owns: a ``MockGPU`` per model and the leased sequences."""

    def __init__(
        self, specs: dict[str, ModelSpec], clock: Clock | None = None, api_key: str | None = None
    ) -> None:
        self.specs = specs
        self.gpus = {name: MockGPU(spec, clock) for name, spec in specs.items()}
        self.leases: dict[str, Lease] = {}
        self.streams = 0  # requests in flight, queued ones included
        self.tokenizer = Tokenizer()
        self.api_key = api_key.encode() if api_key else None
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(self))
        labels = ["model_name", "engine"]
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels,
            buckets=_TIME_BUCKETS,
            registry=self.registry,
        )
        self.prefill_time = Histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            labels,
            buckets=_TIME_BUCKETS,
            registry=self.registry,
        )

    # ------------------------------------------------------------------------------------ requests
    def check(self, request: CompletionRequest) -> tuple[MockGPU, list[int]]:
        """The model's GPU and the output ids, or RequestError as vLLM would refuse the request."""
        gpu = self.gpus.get(request.model)
        if gpu is None:
            raise RequestError(404, f"The model `{request.model}` does not exist.", "model")
        if not request.prompt:
            raise RequestError(
                400, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
            )
        if request.max_tokens < 1:
            raise RequestError(400, f"max_tokens must be at least 1, got {request.max_tokens}.", "max_tokens")
        if request.min_tokens > request.max_tokens:
            raise RequestError(
                400,
                f"min_tokens must be less than or equal to max_tokens={request.max_tokens}, got "
                f"{request.min_tokens}.",
                "min_tokens",
            )
        lab = request.responses_lab
        if lab is not None and lab.output_token_ids is not None:
            if len(lab.output_token_ids) != request.max_tokens:
                raise RequestError(
                    400,
                    "responses_lab.output_token_ids must hold max_tokens ids",
                    "responses_lab.output_token_ids",
                )
            return gpu, lab.output_token_ids
        return gpu, self.tokenizer.model_tokens("", request.max_tokens)

    def sequence_for(self, request: CompletionRequest, gpu: MockGPU) -> tuple[GpuSequence, Lease | None]:
        lab = request.responses_lab
        salt = request.cache_salt or ""
        if lab is None or lab.sequence_id is None:
            sequence = gpu.open(salt=salt)
            sequence.retention = _retention(lab)
            return sequence, None
        lease = self.leases.get(lab.sequence_id)
        if lease is None:
            lease = self.leases[lab.sequence_id] = Lease(request.model, gpu.open(salt=salt), 0.0, salt=salt)
        else:
            self.check_lease(request)
        lease.busy = True
        lease.sequence.retention = _retention(lab)
        return lease.sequence, lease

    def check_lease(self, request: CompletionRequest) -> None:
        """A leased sequence runs one request at a time, for its own model."""
        sid = request.responses_lab.sequence_id if request.responses_lab else None
        lease = self.leases.get(sid) if sid else None
        if lease is None:
            return
        if lease.model != request.model:
            raise RequestError(
                400, f"sequence {sid!r} belongs to model {lease.model!r}", "responses_lab.sequence_id"
            )
        if lease.salt != (request.cache_salt or ""):  # its blocks are another tenant's
            raise RequestError(400, f"sequence {sid!r} belongs to another cache_salt", "cache_salt")
        if lease.busy:
            raise RequestError(409, f"sequence {sid!r} has a request running", "responses_lab.sequence_id")

    def end_request(self, request: CompletionRequest, sequence: GpuSequence, lease: Lease | None) -> None:
        """After the stream, whichever way it ended: a pinned sequence is kept (and waits, as a suspended
        response does: ``suspend()`` applies ``pin-suspended``), any other is closed."""
        lab = request.responses_lab
        if lease is None or lab is None:
            sequence.close()
            return
        lease.busy = False
        if lab.pin and not lease.deleted:
            lease.expires_at = time.monotonic() + lab.pin_ttl_s
            sequence.suspend()
            return
        sequence.close()
        if self.leases.get(lab.sequence_id or "") is lease:
            del self.leases[lab.sequence_id or ""]

    def release(self, sequence_id: str) -> bool:
        lease = self.leases.pop(sequence_id, None)
        if lease is None:
            return False
        lease.deleted = True
        lease.sequence.close()  # safe while its request is at a yield: that request returns at once
        return True

    def sweep(self, now: float) -> int:
        expired = [sid for sid, lease in self.leases.items() if not lease.busy and lease.expires_at <= now]
        for sid in expired:
            self.release(sid)
        return len(expired)

    async def stream(
        self, request: CompletionRequest, gpu: MockGPU, output_ids: list[int]
    ) -> AsyncIterator[bytes]:
        """The SSE body: a chunk per token as it comes due (several in one write when a wake-up finds
        several due), the report chunk, ``[DONE]``. An engine fault becomes an error chunk."""
        try:
            sequence, lease = self.sequence_for(request, gpu)
        except RequestError as exc:  # lost a race since the handler's check
            yield sse(_encode(error_body(exc.status, str(exc), exc.param))) + sse(DONE)
            return
        head = _Head(
            "cmpl-" + secrets.token_hex(12), int(time.time()), request.model, bool(request.return_token_ids)
        )
        self.streams += 1
        try:
            text = TextStream(self.tokenizer)
            last = len(output_ids) - 1
            sent = 0
            try:
                async with aclosing(sequence.run_turn(request.prompt, output_ids)) as ticks:
                    async for count in ticks:
                        yield b"".join(
                            head.token(output_ids[i], text, i == last) for i in range(sent, sent + count)
                        )
                        sent += count
            except (
                ContextLengthExceeded
            ) as exc:  # the API tier checks first; this is the engine's own admission
                yield sse(_encode(error_body(400, str(exc))))
            except EngineOverloaded as exc:
                yield sse(_encode(error_body(503, str(exc))))
            except EngineFailure as exc:
                yield sse(_encode(error_body(500, str(exc))))
            else:
                report = sequence.last_report
                if report is None:  # released (DELETE) while it ran: the turn stopped short
                    yield sse(_encode(error_body(409, "the sequence was released while this request ran")))
                else:
                    self.observe(request.model, report)
                    yield sse(
                        _encode(
                            head.final(
                                report, bool(request.stream_options and request.stream_options.include_usage)
                            )
                        )
                    )
            yield sse(DONE)
        finally:
            self.streams -= 1
            self.end_request(request, sequence, lease)

    def observe(self, model: str, report: EngineReport) -> None:
        self.queue_time.labels(model, "0").observe(report.queue_wait_ms / 1e3)
        self.prefill_time.labels(model, "0").observe(report.prefill_ms / 1e3)

    def refuse_if_full(self, gpu: MockGPU) -> None:
        """Overload is answered before the stream starts when it already shows: 503, as vLLM answers a
        full admission queue. (A slot taken meanwhile still ends the stream with a 503 error chunk.)"""
        slots = gpu.slots
        if slots.running >= slots.max_running and slots.waiting >= slots.max_waiting:
            raise RequestError(503, f"{slots.waiting} sequences already waiting (max-waiting)")

    def authorized(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key)


@dataclass
class _Head:
    """What every chunk of one stream repeats, and the two kinds of chunk it sends."""

    id: str
    created: int
    model: str
    token_ids: bool

    def token(self, token: int, text: TextStream, last: bool) -> bytes:
        piece = text.push(token) + (text.flush() if last else "")
        choice = StreamChoice(
            text=piece,
            finish_reason="length" if last else None,
            token_ids=[token] if self.token_ids else None,
        )
        return sse(
            _encode(
                TokenChunk(
                    id=self.id,
                    object="text_completion",
                    created=self.created,
                    model=self.model,
                    choices=[choice],
                )
            )
        )

    def final(self, report: EngineReport, include_usage: bool) -> FinalChunk:
        """vLLM's last chunk (no choice: usage and per-request metrics), plus the modelled report. The
        mock sends it even without ``include_usage`` (then without usage): the report has to travel."""
        usage = None
        if include_usage:
            usage = Usage(
                report.prompt_tokens,
                report.output_tokens,
                report.prompt_tokens + report.output_tokens,
                PromptTokensDetails(report.cached_tokens),
            )
        n = report.output_tokens
        metrics = PerRequestMetrics(
            time_to_first_token_ms=report.prefill_ms,
            generation_time_ms=report.decode_ms,
            queue_time_ms=report.queue_wait_ms,
            mean_itl_ms=report.decode_ms / (n - 1) if n > 1 else None,
            tokens_per_second=n * 1e3 / (report.prefill_ms + report.decode_ms)
            if report.prefill_ms + report.decode_ms > 0
            else None,
        )
        return FinalChunk(
            id=self.id,
            object="text_completion",
            created=self.created,
            model=self.model,
            choices=[],
            usage=usage,
            metrics=metrics,
            responses_lab=report,
        )


class EngineCollector(Collector):
    """vLLM's gauges and counters, read from each model's MockGPU at scrape time (labels as vLLM's:
    ``model_name``, ``engine``); counters get ``_total`` on the wire, as prometheus_client writes vLLM's."""

    def __init__(self, engine: MockEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "engine"]
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=labels
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=labels
        )
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=labels
        )
        queries = CounterMetricFamily(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels=labels,
        )
        hits = CounterMetricFamily(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels=labels
        )
        stored = GaugeMetricFamily(
            "responses_lab_engine_kv_blocks_stored",
            "KV blocks stored, evictable ones included",
            labels=labels,
        )
        # vLLM's counter (v1 engine, vllm/v1/metrics/loggers.py): a running request sent back to the queue
        # because the KV cache was full; its blocks are recomputed when it is admitted again.
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels=labels
        )
        pinned = GaugeMetricFamily(
            "responses_lab_engine_kv_blocks_pinned_suspended",
            "KV blocks pinned by suspended sequences (waiting for a tool), counted against capacity",
            labels=labels,
        )
        steps = CounterMetricFamily(
            "responses_lab_engine_steps", "Engine steps run (one batch each)", labels=labels
        )
        # The mock GPU's KV by part, which vLLM has no name for: the lab's fleet runs (docs/lab.md, "Fleets")
        # read them here.
        blocks = GaugeMetricFamily(
            "responses_lab_engine_kv_blocks",
            "KV blocks: capacity, in use, pinned by suspended sequences",
            labels=[*labels, "part"],
        )
        for name, gpu in self.engine.gpus.items():
            values = gpu.metrics()
            key = [name, "0"]
            running.add_metric(key, values["running"])
            waiting.add_metric(key, values["waiting"])
            usage.add_metric(key, values["kv_usage"])
            queries.add_metric(key, values["prefix_cache_queries"])
            hits.add_metric(key, values["prefix_cache_hits"])
            stored.add_metric(key, values["kv_blocks_stored"])
            preemptions.add_metric(key, values["preemptions"])
            pinned.add_metric(key, values["kv_blocks_pinned_suspended"])
            steps.add_metric(key, values["steps"])
            blocks.add_metric([*key, "capacity"], float(gpu.spec.kv_cache_size))
            blocks.add_metric([*key, "used"], values["kv_blocks_used"])
            blocks.add_metric([*key, "pinned_suspended"], values["kv_blocks_pinned_suspended"])
        yield from (running, waiting, usage, queries, hits, stored, preemptions, pinned, steps, blocks)
        yield GaugeMetricFamily(
            "responses_lab_engine_pinned_sequences",
            "sequences whose KV blocks are held between requests",
            value=len(self.engine.leases),
        )
        yield GaugeMetricFamily(
            "responses_lab_engine_streams",
            "completion requests in flight, queued ones included",
            value=self.engine.streams,
        )


def create_engine_app(
    specs: dict[str, ModelSpec], clock: Clock | None = None, api_key: str | None = None
) -> Starlette:
    engine = MockEngine(specs, clock, api_key)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sweeper = asyncio.get_running_loop().create_task(_sweep(engine), name="engine-pin-sweeper")
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            for sid in list(engine.leases):
                engine.release(sid)

    def refused(exc: RequestError) -> Response:
        return Response(
            _encode(error_body(exc.status, str(exc), exc.param)),
            status_code=exc.status,
            media_type="application/json",
        )

    async def completions(request: Request) -> Response:
        if not engine.authorized(request):
            return refused(RequestError(401, "Unauthorized"))
        try:
            body = _decode_request(await request.body())
        except msgspec.ValidationError as exc:
            return refused(RequestError(400, str(exc)))
        except msgspec.DecodeError as exc:
            return refused(RequestError(400, f"invalid JSON: {exc}"))
        try:
            gpu, output_ids = engine.check(body)
            engine.refuse_if_full(gpu)
            engine.check_lease(body)
        except RequestError as exc:
            return refused(exc)
        if body.stream:
            return StreamingResponse(engine.stream(body, gpu, output_ids), media_type="text/event-stream")
        return await _complete(engine, body, gpu, output_ids)

    async def release(request: Request) -> Response:
        if not engine.authorized(request):
            return refused(RequestError(401, "Unauthorized"))
        found = engine.release(request.path_params["sequence_id"])
        return Response(status_code=204 if found else 404)

    async def models(request: Request) -> Response:
        data: list[dict[str, object]] = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "responses-lab",
                "root": name,
                "parent": None,
                "max_model_len": None,
                "permission": [],
                "settings": spec.public(),
                **spec.provenance(),
            }
            for name, spec in sorted(engine.specs.items())
        ]
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(engine.registry), media_type="text/plain; version=0.0.4")

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/sequences/{sequence_id}", release, methods=["DELETE"]),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/metrics", metrics),
        ],
        lifespan=lifespan,
    )
    app.state.engine = engine
    return app


async def _complete(
    engine: MockEngine, body: CompletionRequest, gpu: MockGPU, output_ids: list[int]
) -> Response:
    """``stream: false``: the whole stream consumed here, answered as vLLM's ``CompletionResponse``."""
    text: list[str] = []
    tokens: list[int] = []
    final: StreamChunk | None = None
    error: ErrorInfo | None = None
    async for data in engine.stream(body, gpu, output_ids):
        for part in data.split(b"\n\n"):
            if not part.startswith(b"data: ") or part[6:] == DONE:
                continue
            chunk = msgspec.json.decode(part[6:], type=StreamChunk)
            error = chunk.error or error
            for choice in chunk.choices:
                text.append(choice.text)
                tokens.extend(choice.token_ids or ())
            final = chunk if chunk.responses_lab is not None else final
    if error is not None or final is None or final.responses_lab is None:
        info = error or error_body(500, "the engine ended without a report").error
        status = int(info.code) if isinstance(info.code, int) else 500
        return Response(_encode({"error": info}), status_code=status, media_type="application/json")
    report = final.responses_lab
    whole = {
        "index": 0,
        "text": "".join(text),
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": tokens if body.return_token_ids else None,
    }
    usage = Usage(
        report.prompt_tokens,
        report.output_tokens,
        report.prompt_tokens + report.output_tokens,
        PromptTokensDetails(report.cached_tokens),
    )
    return Response(
        _encode(
            {
                "id": final.id,
                "object": "text_completion",
                "created": final.created,
                "model": final.model,
                "choices": [whole],
                "usage": usage,
                "metrics": final.metrics,
                "responses_lab": report,
            }
        ),
        media_type="application/json",
    )


async def _sweep(engine: MockEngine) -> None:
    while True:
        await asyncio.sleep(PIN_SWEEP_S)  # a periodic check of pin expiry, not a stand-in for work
        if engine.sweep(time.monotonic()):
            log.info("engine.pins_expired", pinned=len(engine.leases))


def _retention(lab: LabRequest | None) -> tuple[Breakpoint, ...] | None:
    """What the request asks the prefix cache to keep (``LabRequest.retention``); None: all, no lifetime."""
    return tuple(lab.retention) if lab is not None and lab.retention is not None else None
