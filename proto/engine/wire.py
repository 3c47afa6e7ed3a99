"""The messages of the engine hop: the subset of vLLM's ``/v1/completions`` the API tier uses, as vLLM
spells it (``vllm/entrypoints/openai/completion/protocol.py``: ``CompletionRequest``,
``CompletionStreamResponse``; ``vllm/entrypoints/generate/base/protocol.py``: ``PerRequestMetrics``), plus
one extension field each way for what vLLM has no field for (``responses_lab``).

A stream is server-sent events, one ``data: {json}\\n\\n`` per chunk and ``data: [DONE]\\n\\n`` at the end,
as vLLM writes them. Every chunk with a choice carries that choice's new tokens (``token_ids`` when the
request asked ``return_token_ids``); the last chunk has no choice and carries ``usage`` (cached tokens in
``prompt_tokens_details``), ``metrics`` and, from the mock engine, the ``responses_lab`` timing report. An
error during the stream is a chunk ``{"error": {...}}`` (vLLM's ``ErrorResponse``), then ``[DONE]``.

Decoding is tolerant (unknown fields ignored, every field defaulted), so a chunk from a vLLM version with
more fields, or from the mock engine with fewer, reads the same.
"""

from __future__ import annotations

import msgspec

from sampler.engine import Breakpoint, EngineReport

DONE = b"[DONE]"


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class LabRequest(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The mock engine's request extension (``responses_lab``; vLLM ignores fields it does not know).

    ``sequence_id`` names the response's engine sequence across its turns; ``pin`` asks the engine to hold
    its KV blocks after this turn, for at most ``pin_ttl_s`` (or until ``DELETE /v1/sequences/{id}``):
    a long-lived response waiting for a tool keeps its prefix warm. ``output_token_ids`` are the tokens
    the API's mock model says: the engine paces and caches exactly those, so the prefix it stores is the
    conversation's own and the next turn's prompt hits it (a real vLLM samples its own tokens, and only
    the prompt part of a turn is a prefix of the next one).
    """

    sequence_id: str | None = None
    pin: bool = False
    pin_ttl_s: float = 600.0
    output_token_ids: list[int] | None = None
    retention: list[Breakpoint] | None = None


class CompletionRequest(msgspec.Struct, omit_defaults=True, kw_only=True):
    model: str
    prompt: list[int]  # token ids: the only prompt form the API tier sends
    max_tokens: int = 16  # vLLM's default
    min_tokens: int = 0
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    # vLLM's per-request prefix-cache scope: cached blocks are shared only between requests of one salt
    # (an API tier sends its tenant's; absent: the shared, unsalted cache, as before).
    cache_salt: str | None = None
    responses_lab: LabRequest | None = None


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class PerRequestMetrics(msgspec.Struct, omit_defaults=True):
    """vLLM's per-request timing (``--enable-per-request-metrics``): TTFT from scheduling, i.e. the
    prefill; queue time before it; generation time from the first token to the last."""

    time_to_first_token_ms: float | None = None
    generation_time_ms: float | None = None
    queue_time_ms: float | None = None
    mean_itl_ms: float | None = None
    tokens_per_second: float | None = None


class StreamChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    text: str = ""
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ErrorInfo(msgspec.Struct, kw_only=True):
    message: str = ""
    type: str = ""
    param: str | None = None
    code: int | str | None = None


class StreamChunk(msgspec.Struct, kw_only=True):
    """Any chunk of a stream, as the API tier reads it (every field defaulted, unknown ones ignored)."""

    id: str = ""
    object: str = ""
    created: int = 0
    model: str = ""
    choices: list[StreamChoice] = msgspec.field(default_factory=list)
    usage: Usage | None = None
    metrics: PerRequestMetrics | None = None
    responses_lab: EngineReport | None = None  # the mock engine's modelled report (its phases_ms empty)
    error: ErrorInfo | None = None


class TokenChunk(msgspec.Struct, kw_only=True):
    """A chunk with tokens, as the mock engine writes it (vLLM's fields, always present)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[StreamChoice]


class FinalChunk(TokenChunk, kw_only=True, omit_defaults=True):
    """The last chunk, as the mock engine writes it: no choice, the usage (when asked for), vLLM's
    per-request metrics and the ``responses_lab`` report."""

    usage: Usage | None = None
    metrics: PerRequestMetrics | None = None
    responses_lab: EngineReport | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


def error_body(status: int, message: str, param: str | None = None) -> ErrorResponse:
    """vLLM's error envelope (``code`` is the HTTP status, ``type`` the exception class name)."""
    return ErrorResponse(
        ErrorInfo(
            message=message, type=_ERROR_TYPES.get(status, "InternalServerError"), param=param, code=status
        )
    )


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    409: "ConflictError",
    429: "TooManyRequestsError",
    503: "ServiceUnavailableError",
}


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class EventStream:
    """Server-sent events → their ``data`` payloads. Push the bytes as they arrive; each call returns the
    payloads completed so far. Comments (``: keep-alive``, vLLM's ``--sse-keep-alive-interval``) and other
    fields are skipped; CRLF line ends are accepted."""

    def __init__(self) -> None:
        self._buffer = b""

    def push(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *events, self._buffer = buffer.split(b"\n\n")
        payloads = []
        for event in events:
            lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(lines))
        return payloads

    @property
    def pending(self) -> bool:
        """Bytes of an event not yet ended (a stream that stops here was cut)."""
        return bool(self._buffer.strip())
