"""What ``responses-lab serve --help`` says: every ``Settings`` field's group and help text
(docs/operations.md, "`responses-lab serve`", says the same at length), grouped as uvicorn's and vLLM's
servers group theirs. ``add_arguments`` (``proto/server/config.py``) appends each flag's default and its
environment variable. A field missing here is listed under "other" without help, and
``tests/test_cli_help.py`` fails."""

from __future__ import annotations

# group title -> {Settings field -> help}
GROUPS: dict[str, dict[str, str]] = {
    "network": {
        "host": "bind address; without --api-key only loopback is allowed",
        "port": "TCP port (0: any free port)",
        "api_key": "an accepted bearer key (repeatable); with none the server runs open, loopback only",
        "workers": "API processes on one port, sharing the engine and the store (--db: a file or PostgreSQL)",
        "loop": "event loop: auto (uvloop when installed), uvloop or asyncio",
        "http": "HTTP parser: auto (httptools when installed), httptools or h11",
        "ws_per_message_deflate": "accept permessage-deflate when a client offers it (off: measured 3.5x CPU "
        "per streamed token)",
        "ssl_certfile": "serve TLS (https://, wss://) with this PEM certificate chain (with --ssl-keyfile)",
        "ssl_keyfile": "the PEM private key of --ssl-certfile",
    },
    "storage": {
        "db": "response store and usage ledger: a SQLite file, :memory:, or a postgresql:// URL",
        "db_busy_timeout_s": "how long one SQLite statement waits for another writer's lock; a request's "
        "store writes wait this long in all",
        "db_shared": "several servers on this SQLite file on purpose: no claim on it (else a second server "
        "is refused); reconcile still bills only dead owners",
        "progress_interval_s": "how often a streaming turn updates its crash trace in the ledger",
    },
    "model and engine": {
        "default_policy": "what the mock model does without directives: echo, random[:SEED] or "
        "trace:NAME|PATH",
        "model_override": "change a mock model's knobs, e.g. mock-1000tps:inter-token-latency=0.5 "
        "(repeatable)",
        "engine": "an engine in another process (vLLM's completions API) instead of the in-process mock GPU",
        "engine_routing": "with several --engine URLs (replicas): random, least-loaded, prefix-aware or "
        "sticky (prompt_cache_key, else the connection)",
        "engine_routing_seed": "the random routing policy's seed (-1: drawn by the OS)",
        "engine_api_key": "bearer key for --engine (vllm serve --api-key)",
        "engine_timeout_s": "a stream with no byte from the engine this long fails engine_failure",
        "engine_connections": "keep-alive connections to the engine: one per stream in flight",
    },
    "safety": {
        "safety": "safety scan: annotate (flag and go on), block (content_policy error) or off",
        "safety_classify": "what the classifier sees, alike for every design: user (user messages), new "
        "(all new content, tool outputs too) or all (the whole input)",
        "safety_placement": "the classifier's hop before the prefill, or beside it (the first token waits "
        "for the later of the two)",
    },
    "modelled latency (docs/lab.md, Profiles)": {
        "resolve_hop_ms": "a modelled remote model-routing call, slept once per model resolution",
        "safety_hop_ms": "a modelled remote safety classifier, slept once per pre-inference scan",
        "store_hop_ms": "a modelled store round trip, paid per store read a request's context makes",
        "api_cost_ms": "a modelled per-request cost of a Python Responses server, paid by the HTTP modes",
        "api_cost_ms_per_1k": "the same cost's part per 1 000 history tokens (http and http-prev)",
    },
    "limits": {
        "max_frame_bytes": "largest WebSocket message and HTTP body (WS: close 1009; HTTP: 413)",
        "max_input_items": "items per create, and per long-lived append (too_many_items)",
        "max_tools": "tools per create (too_many_tools)",
        "max_pending_calls": "parallel local calls one long-lived suspension may hold",
        "max_queued_items": "long-lived: user messages appended while sampling, waiting for the next turn",
        "tool_timeout_s": "how long a suspended long-lived response waits for its tool outputs",
        "idle_timeout_s": "a WebSocket with no open response and no client frame this long is closed",
        "connection_max_age_s": "WebSocket connection age limit (websocket_connection_limit_reached)",
        "header_timeout_s": "a request head (a WebSocket upgrade's too) must arrive whole this long after "
        "its first byte, else 408 and close (nginx's client_header_timeout)",
        "max_unfinished_headers": "connections waiting for their request head; past it the longest-waiting "
        "is closed (0: a quarter of the file-descriptor limit, at most 1 024)",
    },
    "admission": {
        "max_admitted": "responses open at once per model (429 past it); 0: the engine's max-num-seqs + "
        "max-waiting",
        "retry_after_ms": "the retry hint of a refused create, drawn within +-50% of it",
    },
    "streaming": {
        "coalesce_ms": "merge a stream's deltas within this window into one event (0: one delta per token)",
        "item_cache_tokens": "http-cached: token ids the item cache may hold (LRU past it)",
        "send_queue": "frames buffered per connection before the sampler waits for the client",
        "send_timeout_s": "one frame not written for this long: a slow reader, close 1008",
        "shutdown_grace_s": "on SIGTERM/SIGINT, how long open sessions get to end",
    },
    "logging": {
        "log_level": "structlog level (JSON lines): debug, info, warning, error",
        "log_text": "log the output text on response_ended (debugging; keys are never logged)",
    },
}
