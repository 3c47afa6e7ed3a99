"""Server settings: one dataclass, every field a flag of ``responses-lab serve`` and an environment
variable ``RESPONSES_LAB_<FLAG>`` (flags win over the environment, the environment over defaults)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: list[str] = field(default_factory=list)  # none: the server runs open (loopback only)
    # Usage ledger + response store: a SQLite file (embedded), ":memory:" for throwaway runs, or a
    # postgresql://… URL shared by every worker and host (proto/server/storage/database.py).
    db: str = "responses-lab.db"
    # How long one SQLite statement waits for another writer's lock before it fails: a store write then
    # ends its response `store_unavailable`; the ledger retries with backoff (docs/operations.md,
    # "Databases").
    db_busy_timeout_s: float = 10.0
    # Several servers on this SQLite file on purpose (the lab's reconnect pairs): no claim on the file.
    # Without it a second server on a file another live process serves is refused (docs/operations.md,
    # "Databases"); either way reconcile bills only owners that are provably dead.
    db_shared: bool = False
    progress_interval_s: float = 1.0  # a streaming turn updates its crash trace (ledger progress) this often
    workers: int = 1
    # auto | uvloop | asyncio — auto: uvloop when installed
    # (docs/decisions/0009-uvloop-and-httptools-pinned.md)
    loop: str = "auto"
    http: str = "auto"  # auto | httptools | h11 — auto: httptools when installed
    default_policy: str = "echo"  # without directives: echo | random[:seed] | trace:NAME
    safety: str = "annotate"  # annotate | block | off
    model_override: list[str] = field(default_factory=list)  # "mock-1000tps:inter-token-latency=0.5"
    # The engine: "" = the mock GPU in process (one per worker); a URL = any engine speaking vLLM's
    # completions API (`responses-lab engine`, `vllm serve`), shared by every worker (docs/engine.md, "`serve
    # --engine URL`").
    # `--workers N` without one starts a `responses-lab engine` for the workers to share. Several URLs,
    # comma-separated: replicas of one engine, a sequence routed to one by --engine-routing
    # (docs/engine.md, "Replicas and routing").
    engine: str = ""
    engine_routing: str = "prefix-aware"  # random | least-loaded | prefix-aware | sticky
    engine_routing_seed: int = -1  # the random policy's seed (-1: drawn by the OS)
    engine_api_key: str = ""  # `Authorization: Bearer` for the engine (`vllm serve --api-key`)
    engine_timeout_s: float = (
        300.0  # a stream with no byte from the engine this long (queued too): engine_failure
    )
    engine_connections: int = 1024  # the keep-alive pool: one connection per stream in flight
    resolve_hop_ms: float = 0.0  # modelled remote routing service (the hop the seed removed)
    safety_hop_ms: float = 0.0  # modelled remote safety classifier
    # The safety rules, alike for every design (docs/lab.md, "Equal rules"): what the classifier sees —
    # user (user messages only) | new (all new content: tool outputs too; an append pays what a create
    # pays) | all (the whole input, history included) — and whether its hop runs before the prefill or
    # beside it (the first token waits for whichever ends last, as async moderation does).
    safety_classify: str = "new"
    safety_placement: str = "before"
    # Modelled store round trip, paid per store read a request's context makes (each link of a
    # previous_response_id chain, a conversation, a GA WebSocket cache miss's chain): an in-process SQLite
    # read is not what a networked store costs (docs/lab.md, "Profiles").
    store_hop_ms: float = 0.0
    # Modelled per-request API cost of the HTTP modes (docs/lab.md, "Profiles"): vLLM 0.32's own /v1/responses
    # work
    # before its engine measured ~5 ms + ~1.7 ms per 1 k history tokens. Added on top of this server's real
    # work, per request of http and http-prev (http-cached: the base only; its cache does the per-token part).
    api_cost_ms: float = 0.0
    api_cost_ms_per_1k: float = 0.0
    item_cache_tokens: int = 4_000_000  # http-cached: token ids the item cache may hold (LRU past it)
    max_frame_bytes: int = 16 * 2**20  # past it: close 1009
    max_input_items: int = 2048
    max_tools: int = 128
    max_pending_calls: int = 64
    max_queued_items: int = (
        2048  # long-lived: user messages appended while sampling, waiting for the next turn
    )
    tool_timeout_s: float = (
        600.0  # a suspended response waits this long for outputs: incomplete, tool_timeout
    )
    # Admission (docs/protocol.md, "Admission"): responses open at once per model, suspended ones included;
    # a create past it is refused before anything starts (429 rate_limit_exceeded). 0: the engine's
    # max-num-seqs + max-waiting (shared by --workers on one engine), the most that can never overflow its
    # waiting queue; a larger value is capped to that. With an engine that does not say (a real vLLM): this.
    max_admitted: int = 0
    # The retry hint of a refused create (retry-after-ms, retry-after), drawn within ±50 % of this so that
    # the refused clients do not all come back at the same instant.
    retry_after_ms: float = 1000.0
    # A request head (the WebSocket upgrade's included) must arrive whole this long after its first byte:
    # else 408 and close (nginx's client_header_timeout and its default). At most this many connections
    # wait for theirs; past it the longest-waiting is closed. 0: a quarter of the file-descriptor limit, at
    # most 1 024 (docs/operations.md, "Unfinished request heads").
    header_timeout_s: float = 60.0
    max_unfinished_headers: int = 0
    idle_timeout_s: float = 3600.0
    connection_max_age_s: float = 3600.0  # GA WebSocket: websocket_connection_limit_reached
    # Merge a stream's deltas within this window into one event (the GPU wakes at most this often; its
    # token deadlines do not move). 0: one delta per token, as OpenAI streams (docs/operations.md,
    # "`responses-lab serve`").
    coalesce_ms: float = 0.0
    # Accept permessage-deflate when a client offers it (the websockets client and Codex do by default).
    # Off by measurement: negotiated, it took 3.5× the server CPU per streamed token (4.3–4.8 vs 1.1–1.4 µs
    # flat out) to shrink a delta frame from 189 to 10 bytes, a saving a loopback or LAN does not need
    # (docs/decisions/0010-permessage-deflate-off.md).
    ws_per_message_deflate: bool = False
    # TLS (uvicorn's own ssl options): a PEM certificate chain and its key; both empty: plain HTTP and ws://.
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    send_queue: int = 4096  # frames buffered per connection before the sampler waits for the client
    send_timeout_s: float = (
        30.0  # slow reader: one frame not written for this long closes the connection 1008
    )
    shutdown_grace_s: float = 10.0  # SIGTERM: open sessions get this long to end (error event, close 1001)
    log_level: str = "warning"
    log_text: bool = False  # log message text (debug only; never keys)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every field a flag, in its group (``proto/server/flags.py``), its help ending with its default and
    its environment variable. The flags' own defaults stay ``None``: unset, the variable or the field's
    default applies (``from_args``)."""
    from proto.server.flags import GROUPS

    defaults = Settings()
    where = {name: title for title, helps in GROUPS.items() for name in helps}
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    for f in dataclasses.fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        title = where.get(f.name)
        group = groups[title] if title else groups.setdefault("other", parser.add_argument_group("other"))
        text = GROUPS[title][f.name].replace("%", "%%") if title else ""  # argparse formats help with %
        shown = _shown(getattr(defaults, f.name))
        env = "RESPONSES_LAB_" + f.name.upper()
        helped = f"{text} (default: {shown}; env {env})" if text else ""
        if kind == "bool":
            group.add_argument(flag, action="store_true", default=None, help=helped)
        elif kind.startswith("list"):
            group.add_argument(flag, action="append", default=None, help=helped, metavar=f.name.upper())
        else:
            group.add_argument(flag, type=_CONVERT[kind], default=None, help=helped)


def _shown(value: object) -> str:
    if value is True or value is False:
        return "on" if value else "off"
    if value == "" or value == []:
        return "none"
    return str(value).replace("%", "%%")


_CONVERT: dict[str, Any] = {"str": str, "int": int, "float": float}


def from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
            continue
        raw = env.get("RESPONSES_LAB_" + f.name.upper())
        if raw is None:
            continue
        kind = str(f.type)
        if kind == "bool":
            values[f.name] = raw.lower() in ("1", "true", "yes", "on")
        elif kind.startswith("list"):
            values[f.name] = [part for part in raw.split(",") if part]
        else:
            values[f.name] = _CONVERT[kind](raw)
    return Settings(**values)


def resolve_loop(choice: str) -> str:
    """The event loop uvicorn gets, never "auto" (uvicorn's own auto would pick silently; the lab records
    what ran). uvloop when installed: with the timerfd clock both loops keep deadlines to tens of µs, and
    uvloop costs less CPU per frame (docs/decisions/0009-uvloop-and-httptools-pinned.md)."""
    if choice == "auto":
        return "uvloop" if _installed("uvloop") else "asyncio"
    if choice not in ("uvloop", "asyncio"):
        raise SystemExit(f"--loop must be auto, uvloop or asyncio, not {choice!r}")
    return choice


def resolve_http(choice: str) -> str:
    if choice == "auto":
        return "httptools" if _installed("httptools") else "h11"
    if choice not in ("httptools", "h11"):
        raise SystemExit(f"--http must be auto, httptools or h11, not {choice!r}")
    return choice


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_bind(settings: Settings) -> None:
    """An open server (no API keys) may only listen on loopback; a key that is empty is no key."""
    check_keys(settings.api_key)
    check_host(settings.host, bool(settings.api_key))


def check_keys(keys: list[str]) -> None:
    """An empty or blank API key is a configuration error, never a key: ``--api-key "$KEY"`` with ``KEY``
    unset would otherwise count as keyed (the non-loopback guard passes) and match a blank bearer token
    (docs/operations.md, "Security")."""
    for key in keys:
        if not key.strip():
            raise SystemExit(
                f"refusing to start: --api-key (or RESPONSES_LAB_API_KEY) holds an empty key ({key!r});"
                " give each key a value, or none to run open on loopback"
            )


def check_host(host: str, keyed: bool) -> None:
    """``check_bind`` for any server of ours (the API, the engine): without a key, loopback only."""
    if keyed:
        return
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise SystemExit(
            f"refusing to bind {host!r} without --api-key: an open server may only listen on loopback "
            "(127.0.0.1, ::1, localhost)"
        )
