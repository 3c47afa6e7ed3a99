"""The terminal timeline a person can follow: condensed events, each suspension and resumption, tool
times, tokens/s per item, then the terminal response's usage and per-turn report."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from proto.client.longlived import ClientEvent, RolloutResult
from proto.demo.script import SCRIPT_LINES, TOOLS


@dataclass
class _ItemStats:
    kind: str
    label: str
    added: float
    deltas: int = 0
    first: float | None = None
    last: float | None = None

    def rate(self) -> float | None:
        """Deltas per second between the first and last delta (one delta per token for ASCII text)."""
        if self.first is None or self.last is None or self.deltas < 2 or self.last <= self.first:
            return None
        return (self.deltas - 1) / (self.last - self.first)


_QUIET = frozenset(
    {
        "response.in_progress",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.function_call_arguments.done",
        "client.tool.start",
    }
)


class Timeline:
    """Prints one line per meaningful moment of the rollout; counts the rest."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0: float | None = None
        self.kinds: Counter[str] = Counter()
        self.items: dict[str, _ItemStats] = {}
        self.tool_ms: list[float] = []
        self.suspensions = 0
        self._outputs: list[tuple[str, str]] = []  # tool outputs not yet shown
        self._waiting_since: tuple[str, float] | None = None  # (what, when) until the next token arrives

    def tool_output(self, name: str, output: str) -> None:
        self._outputs.append((name, output))

    def on_event(self, event: ClientEvent) -> None:
        data, kind = event.data, event.type
        self.kinds[kind] += 1
        if self.t0 is None:
            self.t0 = event.t
        if kind.endswith(".delta"):
            self._delta(event)
            return
        if kind in _QUIET:
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)
        elif kind == "error":
            self._print(event, "bold red", "✗ error", escape(json.dumps(data.get("error", data))))
        else:
            self._print(event, "dim", kind, "")

    # ------------------------------------------------------------------------------ handlers
    def _create(self, event: ClientEvent) -> None:
        self._print(
            event, "bold", "→ response.create", f"{len(SCRIPT_LINES)} scripted turns, {len(TOOLS)} tools"
        )
        self._waiting_since = ("create", event.t)

    def _created(self, event: ClientEvent) -> None:
        response = event.data.get("response", {})
        self._print(event, "bold", "← response.created", f"{response.get('id')} · {response.get('model')}")

    def _item_added(self, event: ClientEvent) -> None:
        item = event.data.get("item", {})
        kind = str(item.get("type"))
        label = {"function_call": f"call {item.get('name')}", "message": "message"}.get(kind, kind)
        self.items[str(item.get("id"))] = _ItemStats(kind, label, event.t)
        if kind == "web_search_call":
            query = (item.get("action") or {}).get("query", "")
            self._print(
                event, "magenta", "⌕ web_search", f"hosted, runs on the server: {escape(repr(query))}"
            )

    def _delta(self, event: ClientEvent) -> None:
        stats = self.items.get(str(event.data.get("item_id")))
        if stats is None:
            return
        stats.deltas += 1
        if stats.first is None:
            stats.first = event.t
        stats.last = event.t
        if self._waiting_since is not None:
            what, since = self._waiting_since
            self._waiting_since = None
            self._print(
                event, "dim", "  first token", f"[dim]{(event.t - since) * 1e3:.1f} ms after the {what}[/]"
            )

    def _item_done(self, event: ClientEvent) -> None:
        item = event.data.get("item", {})
        stats = self.items.get(str(item.get("id")))
        if stats is None or stats.kind == "web_search_call":
            if stats is not None:
                sources = (item.get("action") or {}).get("sources") or []
                titles = _clip("; ".join(str(s.get("title")) for s in sources), 50)
                took = (event.t - stats.added) * 1e3
                self._print(
                    event,
                    "magenta",
                    "⌕ web_search done",
                    f"{len(sources)} sources in {took:.1f} ms: {escape(titles)}",
                )
                self._waiting_since = ("web_search (no round-trip)", event.t)
            return
        if stats.kind == "function_call":
            detail = _clip(str(item.get("arguments", "")), 60)
        else:
            detail = _clip(" ".join(str(part.get("text", "")) for part in item.get("content", [])), 60)
        rate = stats.rate()
        speed = f"{rate:,.0f} tok/s" if rate is not None else "–"
        self._print(
            event, "cyan", f"◆ {stats.label}", f"{escape(detail)} [dim]· {stats.deltas} deltas · {speed}[/]"
        )

    def _web_search_step(self, event: ClientEvent) -> None:
        step = event.type.rsplit(".", 1)[-1]
        if step != "completed":
            self._print(event, "magenta", "  web_search", f"[dim]{step}[/]")

    def _done(self, event: ClientEvent) -> None:
        self.suspensions += 1
        pending = event.data.get("pending_calls", [])
        names = ", ".join(str(p.get("name")) for p in pending)
        self._print(
            event, "yellow", "⏸ response.done", f"suspended, waiting for {len(pending)} call(s): {names}"
        )

    def _tool_done(self, event: ClientEvent) -> None:
        name, ms = str(event.data.get("name")), float(event.data.get("duration_ms", 0.0))
        self.tool_ms.append(ms)
        output = next((o for n, o in reversed(self._outputs) if n == name), "")
        self._outputs = [(n, o) for n, o in self._outputs if not (n == name and o is output)]
        self._print(event, "green", f"⚙ {name}", f"{ms:7.1f} ms → {escape(_summary(output))}")

    def _append(self, event: ClientEvent) -> None:
        self._print(
            event, "yellow", "▶ response.append", f"{event.data.get('outputs')} output(s) sent: resumed"
        )
        self._waiting_since = ("append", event.t)

    def _terminal(self, event: ClientEvent) -> None:
        response = event.data.get("response", {})
        reason = (response.get("incomplete_details") or {}).get("reason") or (
            response.get("error") or {}
        ).get("message")
        style = "bold green" if event.type == "response.completed" else "bold red"
        self._print(
            event,
            style,
            f"■ {event.type}",
            f"status {response.get('status')}" + (f": {escape(str(reason))}" if reason else ""),
        )

    def _print(self, event: ClientEvent, style: str, label: str, detail: str) -> None:
        """One timeline line: ms since response.create, a plain label in ``style``, markup ``detail``."""
        at = (event.t - (event.t if self.t0 is None else self.t0)) * 1e3
        self.console.print(
            f"[dim]{at:9.1f} ms[/]  [{style}]{escape(f'{label:<19}')}[/] {detail}", highlight=False
        )

    # ------------------------------------------------------------------------------ summary
    def summary(self, result: RolloutResult) -> None:
        response = result.response
        lab = response.get("lab") or {}
        turns = lab.get("turns") or []
        table = Table(title="turns (the server's report: response.lab.turns)", title_justify="left")
        for column in (
            "turn",
            "prompt tok",
            "cached",
            "prefill ms",
            "queue ms",
            "decode ms",
            "out tok",
            "tok/s",
        ):
            table.add_column(column, justify="right")
        for t in turns:
            decode = float(t.get("decode_ms", 0.0))
            out = int(t.get("output_tokens", 0))
            table.add_row(
                str(t.get("turn")),
                str(t.get("prompt_tokens")),
                str(t.get("cached_tokens")),
                f"{float(t.get('prefill_ms', 0.0)):.1f}",
                f"{float(t.get('queue_wait_ms', 0.0)):.1f}",
                f"{decode:.1f}",
                str(out),
                f"{out / decode * 1e3:,.0f}" if decode > 0 else "–",
            )
        self.console.print(table)
        # the whole rollout's
        usage = (response.get("lab") or {}).get("usage_total") or response.get("usage") or {}
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        decode_ms = sum(float(t.get("decode_ms", 0.0)) for t in turns)
        out_tokens = int(usage.get("output_tokens", 0))
        start = result.events[0].t if self.t0 is None and result.events else self.t0
        total_s = result.events[-1].t - start if result.events and start is not None else 0.0
        streamed = [
            s for s in self.items.values() if s.first is not None and s.last is not None and s.deltas > 1
        ]
        span = sum((s.last or 0.0) - (s.first or 0.0) for s in streamed)
        seen = f"{sum(s.deltas - 1 for s in streamed) / span:,.0f}" if span > 0 else "–"
        deltas = sum(n for k, n in self.kinds.items() if k.endswith(".delta"))
        server_events = sum(n for k, n in self.kinds.items() if not k.startswith("client."))
        rows = (
            [
                ("total time", f"{total_s * 1e3:,.1f} ms (response.create → {response.get('status')})"),
                (
                    "turns",
                    f"{len(turns)} sampling segments, {self.suspensions} suspensions, {result.appends} "
                    f"appends",
                ),
                ("local tools", f"{len(self.tool_ms)} calls, {sum(self.tool_ms):,.1f} ms in tools"),
                (
                    "usage",
                    f"input {usage.get('input_tokens', 0):,} (cached {cached:,}) · output {out_tokens:,}",
                ),
                (
                    "tokens/s",
                    f"{out_tokens / decode_ms * 1e3:,.0f} modelled decode · {seen} seen by the client",
                ),
                (
                    "events",
                    f"{server_events} from the server ({deltas} deltas, not printed) · {result.bytes_sent:,} "
                    f"bytes sent",
                ),
            ]
            if decode_ms > 0
            else [("total time", f"{total_s * 1e3:,.1f} ms"), ("usage", json.dumps(usage))]
        )
        for name, value in rows:
            self.console.print(f"  [bold]{name:<12}[/] {value}", highlight=False)


_HANDLERS: dict[str, Callable[[Timeline, ClientEvent], None]] = {
    "client.create": Timeline._create,
    "response.created": Timeline._created,
    "response.output_item.added": Timeline._item_added,
    "response.output_item.done": Timeline._item_done,
    "response.web_search_call.in_progress": Timeline._web_search_step,
    "response.web_search_call.searching": Timeline._web_search_step,
    "response.web_search_call.completed": Timeline._web_search_step,
    "response.done": Timeline._done,
    "client.tool.done": Timeline._tool_done,
    "client.append": Timeline._append,
    "response.completed": Timeline._terminal,
    "response.incomplete": Timeline._terminal,
    "response.failed": Timeline._terminal,
}


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _summary(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return "(empty)"
    if len(lines) == 1:
        return _clip(lines[0], 70)
    return f"{_clip(lines[0], 30)} … {_clip(lines[-1], 28)} ({len(lines)} lines)"
