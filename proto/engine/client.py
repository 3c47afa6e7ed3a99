"""The API tier's side of the engine hop: ``sampler.engine.Engine`` over vLLM's completions API.

``RemoteEngine`` holds one aiohttp session (a pool of keep-alive HTTP/1.1 connections, one per stream in
flight) to one engine: the mock engine (``responses-lab engine``) or a real vLLM. aiohttp rather than
httpx (already a dependency) because the hop reads one small SSE chunk per token, and aiohttp spends less
client CPU per streamed event (measured on the engine hop's kind of stream; the figures are in the docs'
engine-hop decisions, not here).

Each turn is one streamed request for exactly N tokens (``max_tokens`` = ``min_tokens`` = N,
``ignore_eos``); every chunk releases the tokens it carries (``return_token_ids``; an engine that sends no
ids counts as a token per chunk, its final usage settling the count), so the mock model's own tokens go out
at the engine's pace. The timing report comes from the mock engine's ``responses_lab`` field,
else from vLLM's ``metrics`` (``--enable-per-request-metrics``) and ``usage.prompt_tokens_details``
(``--enable-prompt-tokens-details``); without those the prefill is the measured time to the first token,
hop included, and no hop is reported. The hop itself, ``engine_hop``, is measured: the time from sending
the request to reading its first token, minus the queue wait and prefill the engine reports.

Failures are typed as the in-process mock GPU's: the engine refusing for load (HTTP 429/503, or such an
error chunk) is ``EngineOverloaded`` (``server_overloaded``); anything else — unreachable, an error status
or error chunk, a connection that breaks or ends early, a stream that stalls for ``timeout_s`` on the
server's clock, a wrong token count — is ``EngineFailure`` (``engine_failure``). Abandoning a turn closes
its connection, which ends the request in the engine (its slot goes to the next waiter); closing a
sequence that pinned its prefix queues a ``DELETE /v1/sequences/{id}``, sent by the engine's own task.

A turn is admitted work (docs/protocol.md, "Admission"): when the engine refuses it for load before its
stream starts (the status line), the turn waits and asks again, backing off up to ``retry_s``, for at most
``timeout_s``; only then does it fail ``server_overloaded``. Each refusal also closes the API tier's door for
``retry_s`` (``refusing``): new creates are refused there, typed, instead of joining the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import aiohttp
import msgspec
import structlog

from proto.engine.wire import DONE, CompletionRequest, EventStream, LabRequest, StreamChunk, StreamOptions
from sampler.clock import Clock
from sampler.engine import Breakpoint, EngineFailure, EngineOverloaded, EngineReport
from sampler.models import ModelLimits

log = structlog.get_logger("proto.engine.client")
_encode = msgspec.json.Encoder().encode
_decode_chunk = msgspec.json.Decoder(StreamChunk).decode
_OVERLOADED = frozenset({429, 503})
RELEASE_QUEUE = 4096  # pins waiting to be released; past it a pin is left to its TTL (and counted)
RELEASE_DRAIN_S = 2.0  # at shutdown, queued releases get this long to go out


class RemoteEngine:
    """One engine in another process: its models, the connection pool, the stall watchdog, the releases."""

    def __init__(
        self,
        url: str,
        clock: Clock,
        *,
        timeout_s: float = 300.0,
        pin_ttl_s: float = 660.0,
        connections: int = 1024,
        api_key: str | None = None,
        retry_s: float = 1.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.clock = clock
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.refused_until = 0.0  # the server clock's time until which the engine said it is full
        self.refusals = 0
        self.pin_ttl_s = pin_ttl_s
        self.connections = connections
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.cards: list[dict[str, Any]] = []
        self.models: dict[str, RemoteModel] = {}
        self.lab_extension = False  # the engine is the mock engine: it speaks ``responses_lab``
        self.in_flight: set[RemoteSequence] = set()
        self.pinned: set[str] = set()  # sequence ids the engine may be holding blocks for
        self.releases: asyncio.Queue[str] | None = None
        self.releases_failed = 0
        self.releases_dropped = 0
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("RemoteEngine.start() has not run")
        return self._session

    async def start(self, wait_s: float = 30.0) -> None:
        """Open the pool, read the engine's models (waiting up to ``wait_s`` for it to answer: it may be
        starting beside us), start the watchdog and the releaser."""
        connector = aiohttp.TCPConnector(
            limit=self.connections, limit_per_host=self.connections, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
        )
        self.releases = asyncio.Queue(RELEASE_QUEUE)
        end = time.monotonic() + wait_s  # real time: a start-up wait, not a protocol limit
        while True:
            try:
                async with self.session.get(self.url + "/v1/models") as response:
                    response.raise_for_status()
                    cards = (await response.json())["data"]
                break
            except (aiohttp.ClientError, OSError) as exc:
                if time.monotonic() >= end:
                    await self.session.close()
                    raise RuntimeError(
                        f"the engine at {self.url} did not answer /v1/models within {wait_s} s: {exc}"
                    ) from exc
                await asyncio.sleep(0.1)  # polling a process that is still starting
        self.cards = [dict(card) for card in cards]
        self.models = {
            card["id"]: RemoteModel(self, card["id"], card_limits(card), card_capacity(card))
            for card in self.cards
        }
        self.lab_extension = bool(self.cards) and all(
            card.get("owned_by") == "responses-lab" for card in self.cards
        )
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._watch(), name="engine-watchdog"),
            loop.create_task(self._release(), name="engine-releaser"),
        ]

    async def aclose(self) -> None:
        """Send the releases still queued (bounded), stop the tasks, close the pool."""
        if self.releases is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELEASE_DRAIN_S):  # real time: shutdown's grace, as Server.drain's
                    await self.releases.join()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    def refusing(self) -> float:
        """How much longer the engine is taken to be full (seconds; 0: it is not), after its last refusal."""
        return max(0.0, self.refused_until - self.clock.now())

    def metrics(self) -> dict[str, float]:
        return {
            "streams_open": float(len(self.in_flight)),
            "refusals": float(self.refusals),
            "sequences_pinned": float(len(self.pinned)),
            "releases_pending": float(self.releases.qsize() if self.releases else 0),
            "releases_failed": float(self.releases_failed),
            "releases_dropped": float(self.releases_dropped),
        }

    def release(self, sequence_id: str) -> None:
        """Queue the release of a pin (never blocks: ``close()`` is synchronous)."""
        assert self.releases is not None
        try:
            self.releases.put_nowait(sequence_id)
        except asyncio.QueueFull:
            self.releases_dropped += 1  # the engine's pin TTL takes it back
            self.pinned.discard(sequence_id)

    async def _release(self) -> None:
        assert self.releases is not None
        while True:
            sequence_id = await self.releases.get()
            try:
                async with self.session.delete(f"{self.url}/v1/sequences/{sequence_id}") as response:
                    if response.status not in (204, 404):  # 404: the engine had nothing (expired, restarted)
                        self.releases_failed += 1
            except (aiohttp.ClientError, OSError):
                self.releases_failed += (
                    1  # the engine is gone or unreachable: its TTL or its restart frees it
                )
            finally:
                self.pinned.discard(sequence_id)
                self.releases.task_done()

    async def _watch(self) -> None:
        """Every quarter of the timeout, on the server's clock: a stream with no progress for
        ``timeout_s`` (no headers, no chunk) is given up on."""
        clock = self.clock
        while True:
            await clock.sleep_until(clock.now() + self.timeout_s / 4)
            now = clock.now()
            for sequence in list(self.in_flight):
                if now - sequence.progress >= self.timeout_s:
                    sequence.stall(f"the engine sent nothing for {self.timeout_s:g} s")


def card_limits(card: dict[str, Any]) -> ModelLimits:
    """A model's limits from its ``/v1/models`` card: the mock engine's ``settings`` (its knobs), vLLM's
    ``max_model_len``, else the catalogue's defaults — never unbounded: the loop sizes every turn by them."""
    settings = card.get("settings") or {}
    window = int(settings.get("max-model-len") or card.get("max_model_len") or ModelLimits.context_window)
    bound_by = "max-model-len"
    if settings.get("kv-cache-size") is not None and settings.get("block-size") is not None:
        kv_tokens = int(settings["kv-cache-size"]) * int(settings["block-size"])
        if kv_tokens < window:
            window, bound_by = kv_tokens, "the KV cache: kv-cache-size x block-size"
    output = int(settings.get("max-output-tokens") or min(ModelLimits.max_output_tokens, window))
    return ModelLimits(window, output, bound_by)


def card_capacity(card: dict[str, Any]) -> int | None:
    """The sequences the engine holds at once for a model, running and waiting (the mock engine's
    ``max-num-seqs`` + ``max-waiting``); ``None`` when its card does not say (a real vLLM)."""
    settings = card.get("settings") or {}
    running, waiting = settings.get("max-num-seqs"), settings.get("max-waiting")
    if running is None or waiting is None:
        return None
    return int(running) + int(waiting)


class RemoteModel:
    """One model the engine serves: ``sampler.engine.Engine``."""

    def __init__(
        self, engine: RemoteEngine, name: str, limits: ModelLimits | None = None, capacity: int | None = None
    ) -> None:
        self.engine = engine
        self.name = name
        self.limits = limits or ModelLimits()
        self.capacity = capacity

    def open(self, keep_warm: bool = True, salt: str = "", affinity: str = "") -> RemoteSequence:
        """``affinity``: one engine, nothing to route (several: ``proto.engine.routing``)."""
        return RemoteSequence(
            self.engine,
            self.name,
            pin=keep_warm and self.engine.lab_extension,
            limits=self.limits,
            salt=salt,
        )


class RemoteSequence:
    """One response's turns on the engine: ``sampler.engine.EngineSequence``."""

    def __init__(
        self,
        engine: RemoteEngine,
        model: str,
        pin: bool,
        limits: ModelLimits | None = None,
        salt: str = "",
    ) -> None:
        self.engine = engine
        self.model = model
        self.pin = pin
        self.salt = salt  # vLLM's cache_salt: sent with every turn, omitted when empty
        self.limits = limits or ModelLimits()
        self.sequence_id = "seq_" + secrets.token_hex(12)
        self.last_report: EngineReport | None = None
        # Once the first tokens arrived (the prefill is done): the prompt, what a cut turn bills. The engine
        # says its cached tokens only in the last chunk, so a cut turn reports none.
        self.live: EngineReport | None = None
        # Sent with every turn to an engine that takes the lab's extension (the mock engine); vLLM's own
        # cache decides what it keeps.
        self.retention: tuple[Breakpoint, ...] | None = None
        self.progress = 0.0  # the server clock's time of the last sign of life from the engine
        self._busy = False
        self._closed = False
        self._stalled: str | None = None
        self._request: asyncio.Task[aiohttp.ClientResponse] | None = None
        self._response: aiohttp.ClientResponse | None = None

    async def run_turn(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], every_s: float = 0.0
    ) -> AsyncGenerator[int, None]:
        """``every_s`` (``--coalesce-ms``): tokens the engine streams within that long of the last yield are
        held and yielded with the next chunk that arrives later (or at the end): the engine paces, we merge.
        """
        if self._closed or self._busy:
            raise RuntimeError("sequence closed" if self._closed else "a turn is already running")
        engine, n = self.engine, len(output_ids)
        self._busy, self._stalled, self.last_report, self.live = True, None, None, None
        self.progress = engine.clock.now()
        engine.in_flight.add(self)
        finished = False
        try:
            body = self._body(prompt_ids, output_ids)
            sent_at = time.perf_counter()
            response = await self._admitted(body)
            events, sent, first_at, final = EventStream(), 0, 0.0, StreamChunk()
            held, floor = 0, 0.0  # tokens not yet yielded (every_s), and when the next yield may come
            while True:
                data = await self._read(response)
                if not data:
                    raise EngineFailure(
                        self._stalled
                        or f"the engine's stream ended after {sent} of {n} tokens, without [DONE]"
                    )
                self.progress = engine.clock.now()
                due = 0
                for payload in events.push(data):
                    if payload == DONE:
                        finished = True
                        break
                    chunk = _decode(payload)
                    if chunk.error is not None:
                        raise _failure(chunk.error.code, chunk.error.message)
                    for choice in chunk.choices:
                        due += len(choice.token_ids) if choice.token_ids is not None else 1
                    if (
                        chunk.usage is not None
                        or chunk.metrics is not None
                        or chunk.responses_lab is not None
                    ):
                        final = chunk
                        if chunk.usage is not None and chunk.usage.completion_tokens > sent + due:
                            due = chunk.usage.completion_tokens - sent  # chunks that carried several tokens
                if due and not first_at:
                    first_at = time.perf_counter()
                    self.live = EngineReport(len(prompt_ids), 0, (first_at - sent_at) * 1e3, 0.0, 0.0, 0)
                due = min(due, n - sent)  # N = 0 asks the engine for one token, which is not said
                if due:
                    sent += due
                    held += due
                if held and (finished or sent == n or not every_s or time.perf_counter() >= floor):
                    floor = time.perf_counter() + every_s
                    count, held = held, 0
                    yield count
                    if self._closed:
                        return  # closed under our feet (as GpuSequence): the caller wants nothing more
                if finished:
                    break
            if sent != n:
                raise EngineFailure(f"the engine streamed {sent} of {n} tokens")
            while await self._read(response):  # to the body's end, so the connection goes back to the pool
                pass
            self.last_report = _report(len(prompt_ids), n, final, sent_at, first_at or time.perf_counter())
        finally:
            self._end(finished)

    def suspend(self) -> None:
        """Nothing to send: the engine applied its pin policy when the turn ended (``pin``)."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._end(False)
        if self.sequence_id in self.engine.pinned:
            self.engine.release(self.sequence_id)

    def stall(self, reason: str) -> None:
        """The watchdog gives up on this stream: the pending request or read fails with ``reason``."""
        self._stalled = reason
        if self._request is not None and not self._request.done():
            self._request.cancel()
        if self._response is not None:
            self._response.close()

    # ------------------------------------------------------------------------------------ internals
    def _body(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> bytes:
        n = len(output_ids)
        lab = None
        if self.engine.lab_extension:
            lab = LabRequest(
                sequence_id=self.sequence_id if self.pin else None,
                pin=self.pin,
                pin_ttl_s=self.engine.pin_ttl_s,
                output_token_ids=list(output_ids) if n else None,
                retention=list(self.retention) if self.retention is not None else None,
            )
            if self.pin:
                self.engine.pinned.add(self.sequence_id)  # from now on the engine may hold blocks for it
        request = CompletionRequest(
            model=self.model,
            prompt=list(prompt_ids),
            max_tokens=max(n, 1),
            min_tokens=max(n, 1),
            ignore_eos=True,
            stream=True,
            # The token ids of each chunk: a chunk may carry several tokens (vLLM merges the outputs of an API
            # process that lags behind its engine core). vLLM also echoes the prompt's ids in its first chunk:
            # that cost is part of its hop.
            stream_options=StreamOptions(include_usage=True),
            return_token_ids=True,
            cache_salt=self.salt or None,
            responses_lab=lab,
        )
        return _encode(request)

    async def _admitted(self, body: bytes) -> aiohttp.ClientResponse:
        """``_open``, asking again while the engine refuses for load (see the module's docstring)."""
        engine = self.engine
        give_up = engine.clock.now() + engine.timeout_s
        wait = min(0.01, engine.retry_s)
        while True:
            try:
                return await self._open(body)
            except EngineOverloaded:
                now = engine.clock.now()
                engine.refusals += 1
                engine.refused_until = max(engine.refused_until, now + engine.retry_s)
                if now + wait >= give_up:
                    raise
            self.progress = now  # the engine answered: no stall for the watchdog
            await engine.clock.sleep_until(now + wait)
            wait = min(wait * 2, engine.retry_s)

    async def _open(self, body: bytes) -> aiohttp.ClientResponse:
        """POST and wait for the status line: in a task of its own, so the watchdog can give up on it."""
        engine = self.engine
        post = engine.session.post(
            engine.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        request = self._request = asyncio.ensure_future(post)
        try:
            response = await request
        except asyncio.CancelledError:
            if request.done() and not request.cancelled() and request.exception() is None:
                request.result().close()  # the status line came just as we were cancelled: end that request
            task = asyncio.current_task()
            if self._stalled is not None and (task is None or not task.cancelling()):
                raise EngineFailure(self._stalled) from None
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineFailure(
                f"the engine at {engine.url} is unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self._request = None
        self._response = response
        if response.status != 200:
            try:
                message = (await response.text())[:500]
            except (aiohttp.ClientError, OSError):
                message = ""
            raise _failure(response.status, message or response.reason or "")
        return response

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        try:
            return await response.content.readany()
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineFailure(
                self._stalled or f"the engine's stream broke: {type(exc).__name__}: {exc}"
            ) from exc

    def _end(self, finished: bool) -> None:
        """The turn's connection: back to the pool after a whole stream, closed otherwise (which ends the
        request in the engine at once)."""
        response, self._response = self._response, None
        if response is not None:
            if finished:
                response.release()
            else:
                response.close()
        self.engine.in_flight.discard(self)
        self._busy = False


def _decode(payload: bytes) -> StreamChunk:
    try:
        return _decode_chunk(payload)
    except msgspec.DecodeError as exc:
        raise EngineFailure(f"the engine sent a chunk that is not a completion chunk: {exc}") from exc


def _failure(status: int | str | None, message: str) -> Exception:
    code = int(status) if isinstance(status, int) or (isinstance(status, str) and status.isdigit()) else 500
    if code in _OVERLOADED:
        return EngineOverloaded(f"the engine is overloaded ({code}): {message}")
    return EngineFailure(f"the engine failed ({code}): {message}")


def _report(
    prompt_tokens: int, output_tokens: int, final: StreamChunk, sent_at: float, first_at: float
) -> EngineReport:
    """The turn's report from the last chunk: the mock engine's own, else vLLM's metrics and usage."""
    to_first_ms = (first_at - sent_at) * 1e3
    lab, metrics, usage = final.responses_lab, final.metrics, final.usage
    cached = usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else 0
    if lab is not None:
        prefill, queue, decode, cached = lab.prefill_ms, lab.queue_wait_ms, lab.decode_ms, lab.cached_tokens
    elif metrics is not None and metrics.time_to_first_token_ms is not None:
        prefill, queue, decode = (
            metrics.time_to_first_token_ms,
            metrics.queue_time_ms or 0.0,
            metrics.generation_time_ms or 0.0,
        )
    else:  # no timing from the engine: the prefill as the API saw it, hop included, and no hop span
        return EngineReport(prompt_tokens, cached, to_first_ms, 0.0, 0.0, output_tokens)
    return EngineReport(
        prompt_tokens,
        cached,
        prefill,
        queue,
        decode,
        output_tokens,
        {"engine_hop": to_first_ms - prefill - queue},
        # the mock engine's prefix cache writes (vLLM reports none: docs/protocol.md, "Prompt caching")
        written_tokens=lab.written_tokens if lab is not None else 0,
        written_by_ttl=dict(lab.written_by_ttl) if lab is not None else {},
        expired_tokens=lab.expired_tokens if lab is not None else 0,
        block_size=lab.block_size if lab is not None else 0,
    )
