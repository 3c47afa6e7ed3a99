"""``POST /v1/responses`` (JSON or SSE) and the stored-response endpoints: a thin adapter.

Three modes, told apart by the body and one header:

* ``http`` — the client re-sends the whole history: every request validates, scans, renders and
  tokenizes all of it, and resolves the model.
* ``http-cached`` — the same request with the header ``X-Responses-Lab-Cache: items``: the server's item
  cache (``proto/server/stages/item_cache.py``) skips the scan and tokenization of every body it has seen, and
  the model resolution after the first request (the seed's step before WebSockets). Ignored with
  ``previous_response_id`` (that is ``http-prev``).
* ``http-prev`` — ``previous_response_id`` plus only the new items: the chain is loaded from the store
  (one row per earlier response), re-rendered and re-tokenized in full (as vLLM does); only the new items
  are validated and scanned. A create with ``conversation`` runs in this mode too: the conversation's
  items are loaded and re-rendered in full, and scanned with the new ones (docs/protocol.md,
  "Conversations").

The response ends at the first local function call (``completed`` with the calls in its output), as in
OpenAI's API; the client answers with a new request.

Faults: a JSON reply whose response *failed* has sent nothing yet, so it answers as OpenAI does for a
request that failed — the OpenAI error body with the code's status (``store_unavailable`` 503,
``engine_failure`` 500, ``context_length_exceeded`` 400, …), never a plain-text 500; a fault of the
pre-inference work (a store read) likewise. A JSON client that goes away before its reply cancels the
response (billed for what it produced), as an SSE client does.

Shutdown (``stop``, from ``Server.drain``): every response in flight is cut at once, as the WebSocket
sessions' are, billed for what it delivered, and answered typed — a JSON reply is the 503
``server_shutting_down`` error body, an SSE stream ends with one ``error`` event of that code.

``background: true`` hands the response to its owner (``proto/server/background.py``) and answers at once;
its cancel and the replay of its events (``GET …?stream=true``) are here too (docs/protocol.md,
"Background mode").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proto.core.actions import new_response_id
from proto.core.codec import CACHE_HEADER, decode_body
from proto.core.create import CreateLimits, check_outputs, validate_create
from proto.core.errors import ClientError
from proto.core.events import CreateBody, ErrorDetail, ServerEvent, StreamError
from proto.core.items import Item, listed
from proto.core.longlived import Cancel
from proto.core.response import Mode
from proto.core.work import WorkCounters
from proto.server.auth import Auth, error_response
from proto.server.background import BackgroundResponses, check_background, not_found, starting_after
from proto.server.designs import DESIGNS
from proto.server.driver import ResponseDriver
from proto.server.pipeline import (
    Context,
    Pipeline,
    Prepared,
    Source,
    count_input_tokens,
    timed,
    typed_faults,
)
from proto.server.stages.chain import resolve_references
from proto.server.stages.compact import compact_window
from proto.server.stages.conversation import load_context
from proto.server.storage.store import StoreError, StoreUnavailable
from proto.server.transports import encoding

_encoder = msgspec.json.Encoder()
_items_decoder = msgspec.json.Decoder(list[dict[str, Any]])
JSON = "application/json"


def sse_frame(event: ServerEvent) -> bytes:
    return _sse(str(type(event).__struct_config__.tag), _encoder.encode(event))


def _sse(kind: str, data: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class _OneRequest:
    """The ``EventSink`` of one HTTP response: it ends at its first local call, nothing is appended to
    it, and it is cut only when the client goes away. ``queue`` is where SSE frames go (``None``: a JSON
    reply, nothing is framed — the Response object is the reply)."""

    def __init__(self, queue: asyncio.Queue[bytes | None] | None) -> None:
        self.queue = queue
        self.error_replaces_failure = queue is None  # a JSON reply: HttpResponses.create answers the error

    def opened(self) -> bool:
        return True

    async def send(self, events: Sequence[ServerEvent]) -> None:
        if self.queue is not None:
            for event in events:
                await self.queue.put(sse_frame(event))

    def offer(self, events: Sequence[ServerEvent]) -> bool:
        queue = self.queue
        if queue is None:
            return True  # a JSON reply: nothing is framed
        if 0 < queue.maxsize < queue.qsize() + len(events):
            return False
        for event in events:
            queue.put_nowait(sse_frame(event))
        return True

    suspends = False  # a response ends at its first local call: the calls are in its output

    def queued(self) -> list[Item]:
        return []

    def cut(self) -> Cancel | None:
        return None

    def end_at_boundary(self) -> str | None:
        return None


class HttpResponses:
    def __init__(self, auth: Auth, pipeline: Pipeline) -> None:
        self.auth = auth
        self.pipeline = pipeline
        settings = pipeline.settings
        self.limits = CreateLimits(settings.max_input_items, settings.max_tools)
        self.running: set[asyncio.Task[ServerEvent]] = set()  # every response in flight (its driver's task)
        self.stopping = False
        self.background = BackgroundResponses(pipeline)  # they outlive their requests: docs/protocol.md

    def stop(self) -> None:
        """The server shuts down: cut every response in flight (each is billed and answered typed)."""
        self.stopping = True
        for task in list(self.running):
            task.cancel()
        self.background.stop()

    def _run(self, driver: ResponseDriver, name: str) -> asyncio.Task[ServerEvent]:
        task = asyncio.create_task(driver.run(), name=name)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        # The driver gives its admission place back when it ends; this too when the task was cut before the
        # driver ran (docs/protocol.md, "Admission").
        task.add_done_callback(lambda _: driver.prepared.ticket.release())
        if self.stopping:
            task.cancel()  # started as the server stops: it ends at once, billed and answered like the rest
        return task

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.auth.guard(self.create), methods=["POST"]),
            Route("/v1/responses/compact", self.auth.guard(self.compact), methods=["POST"]),
            Route("/v1/responses/input_tokens", self.auth.guard(self.input_tokens), methods=["POST"]),
            Route("/v1/responses/{response_id}", self.auth.guard(self.retrieve), methods=["GET"]),
            Route("/v1/responses/{response_id}", self.auth.guard(self.delete), methods=["DELETE"]),
            Route(
                "/v1/responses/{response_id}/input_items", self.auth.guard(self.input_items), methods=["GET"]
            ),
            Route("/v1/responses/{response_id}/cancel", self.auth.guard(self.cancel), methods=["POST"]),
        ]

    # ------------------------------------------------------------------------------------ create
    async def create(self, request: Request, key: str) -> Response:
        created = time.time()
        try:
            raw = await self._read_body(request)
            body = decode_body(
                await encoding.decode(
                    raw, request.headers.get("content-encoding"), self.pipeline.settings.max_frame_bytes
                )
            )
            with typed_faults():
                check_background(body.background, body.stores)
                cached = request.headers.get(CACHE_HEADER, "").strip().lower() == "items"
                # the keep-alive TCP connection, as an L4 balancer sees it: sticky routing's key
                peer = request.client
                connection = f"tcp_{peer.host}:{peer.port}" if peer is not None else ""
                prepared = await self._prepare(body, key, cached, connection)
        except ClientError as exc:
            return error_response(exc)
        if body.background:
            return await self._background(prepared, key, created, bool(body.stream))
        if body.stream:
            return self._stream(prepared, key, created)
        driver = ResponseDriver(self.pipeline, prepared, _OneRequest(None), key, created)
        await _unless_disconnected(request, self._run(driver, "http-response"))
        response = prepared.rollout.builder.response  # the reply is the Response object itself, as it ended
        if response.status == "failed" and response.error is not None:
            return error_response(ClientError(response.error.code, response.error.message))
        if response.status == "cancelled" and self.stopping:
            return error_response(_shutting_down())
        return Response(_encoder.encode(response), media_type=JSON)

    async def _read_body(self, request: Request) -> bytes:
        """The body, refused past ``--max-frame-bytes`` (the WebSocket frame limit, so one request is
        accepted or refused alike in every transport) without buffering more than that."""
        limit = self.pipeline.settings.max_frame_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # chunked, or a content-length that lied
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _prepare(
        self, body: CreateBody, key: str, cached: bool = False, connection: str = ""
    ) -> Prepared:
        items, work = validate_create(
            body, self.pipeline.engines.names(), self.limits, refuse_background=False
        )
        phases: dict[str, float] = {}
        mode: Mode = "http-cached" if cached else "http"
        source: Source = "none"
        if body.previous_response_id is not None or body.conversation is not None:
            mode = "http-prev"  # server-held history: a stored chain or a conversation
            source = "chain" if body.previous_response_id is not None else "conversation"
        with timed(phases, "store_load"):
            items = await resolve_references(self.pipeline.store, items, key, work)
            history = await load_context(self.pipeline.conversations, body, items, key, work)
        check_outputs(history, items)
        return await self.pipeline.prepare(
            Context(
                new_response_id(),
                body,
                DESIGNS[mode],
                items,
                work,
                phases,
                history=history,
                source=source,
                api_key_id=key,
                connection=connection,
            )
        )

    def _stream(self, prepared: Prepared, key: str, created: float) -> Response:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=self.pipeline.settings.send_queue)
        driving: list[asyncio.Task[ServerEvent]] = []  # the driver's task, once the body has started it

        async def produce() -> None:
            try:
                driver = ResponseDriver(self.pipeline, prepared, _OneRequest(queue), key, created)
                driving.append(self._run(driver, "sse-driver"))
                await driving[0]
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if not self.stopping or (me is not None and me.cancelling()):
                    # the client went away: nobody waits for the end marker (a full queue would hang here)
                    raise
                # Shutdown cut the response (its driver's task), the client still reads: it hears why.
                await queue.put(_stream_error(_shutting_down(), prepared.rollout.builder.next_sequence()))
            except BaseException:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)
                raise
            await queue.put(None)

        async def frames() -> AsyncIterator[bytes]:
            task = asyncio.create_task(produce(), name=f"sse-{prepared.rollout.builder.response.id}")
            try:
                while (chunk := await queue.get()) is not None:
                    yield chunk
            finally:
                if not task.done():  # the client went away: stop sampling (the driver bills what was done)
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        def orphaned() -> None:
            if not driving:  # the client was gone before the body started: no driver holds the place
                prepared.ticket.release()

        return _Stream(
            orphaned, frames(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )

    # ------------------------------------------------------------------------------------ background
    async def _background(self, prepared: Prepared, key: str, created: float, stream: bool) -> Response:
        """Queued and answered at once (docs/protocol.md, "Background mode"): the queued Response, or
        its events as they are logged (this stream ending does not end the response)."""
        try:
            with typed_faults():
                queued = await self.background.create(prepared, key, created, stream)
        except ClientError as exc:
            return error_response(exc)
        if not stream:
            return Response(queued, media_type=JSON)
        return self._follow(prepared.rollout.builder.response.id, key, -1)

    async def cancel(self, request: Request, key: str) -> Response:
        try:
            with typed_faults():
                response = await self.background.cancel(request.path_params["response_id"], key)
        except ClientError as exc:
            return error_response(exc)
        return Response(response, media_type=JSON)

    async def _resume(self, request: Request, key: str) -> Response:
        """``GET /v1/responses/{id}?stream=true&starting_after=N``: its events from N + 1 on, live."""
        response_id = request.path_params["response_id"]
        try:
            after = starting_after(request.query_params.get("starting_after"))
            with typed_faults():
                await self.background.check_streamable(response_id, key)
        except ClientError as exc:
            return error_response(exc)
        return self._follow(response_id, key, after)

    def _follow(self, response_id: str, key: str, after: int) -> Response:
        async def frames() -> AsyncIterator[bytes]:
            last = after
            try:
                async for number, kind, data in self.background.follow(response_id, key, after):
                    yield _sse(kind, data)
                    last = number
            except (StoreUnavailable, StoreError) as exc:  # the log cannot be read: the client hears why
                yield _stream_error(ClientError("store_unavailable", str(exc)), last + 1)
            except ClientError as exc:  # this server stops; the response runs on elsewhere
                yield _stream_error(exc, last + 1)

        return StreamingResponse(
            frames(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )

    # ------------------------------------------------------------------------------------ compact
    async def compact(self, request: Request, key: str) -> Response:
        """``POST /v1/responses/compact``: the create body's ``model``, ``input``, ``previous_response_id``,
        ``instructions`` (``proto/server/stages/compact.py``); refused as a create would be."""
        try:
            body = await self._body(request)
            with typed_faults():
                items, work = await self._window(body, key)
                resource = compact_window(self.pipeline.tokenizer, body.instructions, items, work)
        except ClientError as exc:
            return error_response(exc)
        return Response(_encoder.encode(resource), media_type=JSON)

    async def input_tokens(self, request: Request, key: str) -> Response:
        """``POST /v1/responses/input_tokens``: the input tokens a create of this body would report
        (``usage.input_tokens`` of its first turn), rendered and tokenized as the model's context is;
        refused as a create would be. Nothing is sampled, stored or billed."""
        try:
            body = await self._body(request)
            with typed_faults():
                items, work = await self._window(body, key)
                count = await count_input_tokens(self.pipeline.tokenizer, work, body, items)
        except ClientError as exc:
            return error_response(exc)
        return Response(
            _encoder.encode({"object": "response.input_tokens", "input_tokens": count}), media_type=JSON
        )

    async def _body(self, request: Request) -> CreateBody:
        return decode_body(await self.body_bytes(request))

    async def body_bytes(self, request: Request) -> bytes:
        """A request's body, decoded (``Content-Encoding``), refused past ``--max-frame-bytes``."""
        raw = await self._read_body(request)
        return await encoding.decode(
            raw, request.headers.get("content-encoding"), self.pipeline.settings.max_frame_bytes
        )

    async def _window(self, body: CreateBody, key: str) -> tuple[list[Item], WorkCounters]:
        """A create body's whole context, validated as a create's: its stored chain
        (``previous_response_id``), then its input with references resolved."""
        items, work = validate_create(
            body, self.pipeline.engines.names(), self.limits, refuse_background=False
        )
        items = await resolve_references(self.pipeline.store, items, key, work)
        history = await load_context(self.pipeline.conversations, body, items, key, work)
        check_outputs(history, items)
        return history + items, work

    # ------------------------------------------------------------------------------------ stored
    async def retrieve(self, request: Request, key: str) -> Response:
        if request.query_params.get("stream", "").lower() == "true":
            return await self._resume(request, key)
        response_id = request.path_params["response_id"]
        stored = await self.pipeline.store.get(response_id, key)
        if stored is None:
            return error_response(not_found(response_id))
        return Response(stored.response_json, media_type=JSON)

    async def delete(self, request: Request, key: str) -> Response:
        response_id = request.path_params["response_id"]
        try:
            with typed_faults():
                await self.background.forget(response_id, key)
        except ClientError as exc:
            return error_response(exc)
        if not await self.pipeline.store.delete(response_id, key):
            return error_response(not_found(response_id))
        return Response(
            _encoder.encode({"id": response_id, "object": "response", "deleted": True}), media_type=JSON
        )

    async def input_items(self, request: Request, key: str) -> Response:
        """OpenAI's list shape; ``order`` (default ``desc``, as OpenAI), ``limit`` (1–100, default 20),
        ``after`` (an item id)."""
        response_id = request.path_params["response_id"]
        raw = await self.pipeline.store.input_items(response_id, key)
        if raw is None:
            return error_response(not_found(response_id))
        items = _items_decoder.decode(raw)
        query = request.query_params
        if query.get("order", "desc") == "desc":
            items.reverse()
        after = query.get("after")
        if after is not None:
            ids = [item.get("id") for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        try:
            limit = max(1, min(100, int(query.get("limit", "20"))))
        except ValueError:
            return error_response(ClientError("invalid_request", "limit must be an integer", "limit"))
        page = [listed(item) for item in items[:limit]]
        body = {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        }
        return Response(_encoder.encode(body), media_type=JSON)


class _Stream(StreamingResponse):
    """An SSE reply that calls ``ended`` once it is over, whatever happened (starlette never starts the body
    of a reply whose client is already gone)."""

    def __init__(self, ended: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ended()


async def _unless_disconnected(request: Request, task: asyncio.Task[ServerEvent]) -> None:
    """Wait for the response, cancelling it if the client goes away first (the driver bills what was done).
    The body was read in full: the only ASGI message left to receive is ``http.disconnect``."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.create_task(disconnected(), name="http-disconnect-watch")
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        with contextlib.suppress(asyncio.CancelledError):  # nobody hears a cut JSON response: it re-raises
            await task


def _stream_error(exc: ClientError, sequence_number: int) -> bytes:
    detail = ErrorDetail(type=exc.type, code=exc.code, message=exc.message, param=exc.param)
    event = StreamError(
        sequence_number=sequence_number, code=exc.code, message=exc.message, param=exc.param, error=detail
    )
    return _sse("error", _encoder.encode(event))


def _shutting_down() -> ClientError:
    return ClientError(
        "server_shutting_down",
        "the server is shutting down; the response was cut and billed for what it delivered",
    )


def _too_large(limit: int) -> ClientError:
    return ClientError("message_too_large", f"the request body exceeds {limit} bytes (--max-frame-bytes)")
