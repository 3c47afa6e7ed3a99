"""What each design redoes per turn, declared once: one row per mode, read by the transports and the pipeline.

A design is a transport plus the state it keeps between turns; everything else (the stages, the sampling
loop, billing) is the same ``Pipeline`` for all of them (docs/architecture.md, "The pipeline"). The rules
every design obeys alike are server settings, not rows: which content the safety classifier sees
(``--safety-classify``), where its hop sits (``--safety-placement``), and what each hop costs
(docs/lab.md, "Equal rules"). docs/lab.md, "Five designs", prints ``markdown()``; a test holds the two equal.

Adding a design: one ``Design`` row here, and the transport that speaks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proto.core.response import MODES, Mode

# What a request's validation and scan cover: "input" — every item the request carries (the whole history
# when the client re-sends it); "new" — only the items the server has not held before (the rest is its own).
Coverage = Literal["input", "new"]
# Whose rendering (tokens) a turn reuses: "none" — rendered from scratch; "item-cache" — per item body,
# across requests of one API key; "connection" — the previous response's, held by the connection;
# "response" — the open response's own.
Reuse = Literal["none", "item-cache", "connection", "response"]
# When the model is resolved (and ``--resolve-hop-ms`` paid): "request" — every request; "key" — once per
# API key and model; "connection" — once per connection and model (again on a cache miss); "response" —
# once per response, whatever its number of turns.
Resolves = Literal["request", "key", "connection", "response"]
# What a turn reads from the store (each read pays ``--store-hop-ms``): "none"; "chain" — every link of the
# ``previous_response_id`` chain, every request; "chain-on-miss" — the chain only when the connection's
# cache does not hold the previous response. A conversation's items are read by every design that names one.
Reads = Literal["none", "chain", "chain-on-miss"]
# The modelled per-request API work (``--api-cost-ms`` + ``--api-cost-ms-per-1k``): "full", "base" (the
# item cache does the per-token part), "none" (no per-request server at all).
ApiCost = Literal["full", "base", "none"]


@dataclass(frozen=True)
class Design:
    mode: Mode
    transport: str  # what carries it
    sends: str  # what the client sends per turn
    covers: Coverage  # what is validated and scanned (and classified under ``--safety-classify new``)
    reuse: Reuse
    resolves: Resolves
    reads: Reads
    api_cost: ApiCost
    appends: bool  # a turn after a tool call is an append to the open response, not a new request
    keep_warm: bool  # its KV prefix is pinned while it waits for tool outputs (only a suspended response)

    def scans(self) -> str:
        """What a turn validates and scans."""
        if self.covers == "new":
            return "new items"
        return "whole input; unseen bodies scanned" if self.reuse == "item-cache" else "whole input"

    def hops(self) -> str:
        """Which hops a turn pays, and when (the knobs of docs/lab.md, "Profiles")."""
        if self.reuse == "item-cache":
            classifier = "per request with an unseen body"
        else:
            classifier = "per create and per append" if self.appends else "per request"
        resolve = {
            "request": "every request",
            "key": "once per key and model",
            "connection": "once per connection and model",
            "response": "once per response",
        }[self.resolves]
        store = {
            "none": "",
            "chain": "; store: each chain link",
            "chain-on-miss": "; store: chain on a miss",
        }[self.reads]
        return f"classifier: {classifier}; resolve: {resolve}{store}"


DESIGNS: dict[Mode, Design] = {
    row.mode: row
    for row in (
        Design("http", "HTTP", "the whole history", "input", "none", "request", "none", "full", False, False),
        Design(
            "http-cached",
            "HTTP + `X-Responses-Lab-Cache: items`",
            "the whole history",
            "input",
            "item-cache",
            "key",
            "none",
            "base",
            False,
            False,
        ),
        Design(
            "http-prev",
            "HTTP",
            "`previous_response_id` + new items",
            "new",
            "none",
            "request",
            "chain",
            "full",
            False,
            False,
        ),
        Design(
            "ws",
            "GA WebSocket",
            "`previous_response_id` + new items",
            "new",
            "connection",
            "connection",
            "chain-on-miss",
            "none",
            False,
            False,
        ),
        Design(
            "longlived",
            "long-lived WebSocket",
            "one create, then appends",
            "new",
            "response",
            "response",
            "none",
            "none",
            True,
            True,
        ),
    )
}
assert tuple(DESIGNS) == MODES, "one row per mode, in MODES' order"

_HEADER = (
    "| mode | transport | client sends | validated + scanned | rendering reused | model resolved "
    "| store reads | API cost | KV kept warm | hops |"
)


def markdown() -> str:
    """The table docs/lab.md prints (between its ``designs`` markers)."""
    lines = [_HEADER, "|" + "---|" * _HEADER.count(" | ") + "---|"]
    for d in DESIGNS.values():
        lines.append(
            f"| `{d.mode}` | {d.transport} | {d.sends} | {d.scans()} | {d.reuse} | {d.resolves} | {d.reads} "
            f"| {d.api_cost} | {'yes' if d.keep_warm else 'no'} | {d.hops()} |"
        )
    return "\n".join(lines) + "\n"
