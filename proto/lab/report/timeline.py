"""Where every millisecond goes, as a picture: ``trace.json`` (Chrome trace-event format, opens in Perfetto
and chrome://tracing) and ``timeline.png`` (one rollout of each mode side by side on a time axis).

One process per cell (profile · workload · model · mode), one track per rollout (its session). On a track:

* ``client`` spans: each round's request (send → its end event) and the tool waits, as the client timed
  them on its event loop's clock (``CLOCK_MONOTONIC``);
* ``server`` spans: the pipeline phases the server timed for the round (``response.lab.turns[].phases_ms``:
  store load, safety scan and hop, model resolution and hop, render + tokenize, API-cost knob), laid back
  to back in the pipeline's order so that they end where the round's queue wait starts;
* ``gpu`` spans: queue wait, prefill (ending at the first token the client received) and decode (from it,
  the modelled ``decode_ms``), from the server's report.

The server reports durations, not instants: its spans are placed against the client's first token of the
round, so they carry the loopback delivery (tens of µs) as an offset; the client's own spans are exact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proto.lab.analysis.metrics import RoundTimes, Trace, round_times
from proto.lab.run.runner import CellResult

PHASE_ORDER = (
    "store_load",
    "store_hop",
    "safety",
    "safety_hop",
    "resolve_model",
    "resolve_hop",
    "render_tokenize",
    "api_cost",
    "hosted_tools",
)
COLORS = {"tools": "#9e9e9e", "api": "#d62728", "queue": "#ff7f0e", "prefill": "#1f77b4", "decode": "#2ca02c"}


def cell_timeline(cell: CellResult) -> dict[str, Any]:
    """A cell's spans, as JSON: ``{"label", "mode", "tracks": [{"name", "spans": [...]}]}``, one track per
    rollout. A cell's record keeps it (proto/lab/run/store.py), so ``trace.json`` is written from records: a
    resumed run's and merged shards' as well as a whole run's."""
    return {
        "label": f"{cell.profile} · {cell.workload} · {cell.model}",
        "mode": cell.mode,
        "tracks": [{"name": t.session, "spans": spans(t)} for t in cell.traces],
    }


def spans(trace: Trace) -> list[dict[str, Any]]:
    """The trace's spans as ``{"name", "cat", "start", "end", "args"}`` in seconds on the client's clock."""
    out: list[dict[str, Any]] = []
    for start, end in trace.tool_spans:
        out.append({"name": "tools", "cat": "client", "start": start, "end": end, "args": {}})
    for k, (t, report) in enumerate(zip(round_times(trace.marks), trace.reports, strict=False)):
        kind = trace.kinds[k] if k < len(trace.kinds) else ""
        out.append(
            {
                "name": f"round {k} ({kind})",
                "cat": "client",
                "start": t.sent,
                "end": t.end,
                "args": {
                    "prompt_tokens": report["prompt_tokens"],
                    "cached_tokens": report["cached_tokens"],
                    "output_tokens": report["output_tokens"],
                },
            }
        )
        out += _server(t, report)
    return out


def _server(t: RoundTimes, report: dict[str, Any]) -> list[dict[str, Any]]:
    prefill, queue, decode = (float(report[k]) / 1e3 for k in ("prefill_ms", "queue_wait_ms", "decode_ms"))
    first = t.first
    phases = dict(report.get("phases_ms") or {})
    # The classifier beside the prefill (docs/lab.md, "Equal rules"): its hop ran from the queue's start,
    # and the first token waited ``safety_wait`` for it after the prefill ended.
    waited = phases.pop("safety_wait", None)
    beside = float(phases.pop("safety_hop", 0.0)) / 1e3 if waited is not None else 0.0
    wait = float(waited or 0.0) / 1e3
    done = first - wait  # the prefill's end
    gpu = [
        ("queue", done - prefill - queue, done - prefill),
        ("prefill", done - prefill, done),
        ("decode", first, first + decode),
    ]
    out = [{"name": name, "cat": "gpu", "start": a, "end": b, "args": {}} for name, a, b in gpu if b > a]
    start = done - prefill - queue
    for name, a, b in (("safety_hop", start, start + beside), ("safety_wait", done, first)):
        if b > a:
            out.append({"name": name, "cat": "server", "start": a, "end": b, "args": {"ms": (b - a) * 1e3}})
    cursor = start
    for name in reversed([n for n in PHASE_ORDER if n in phases] + sorted(set(phases) - set(PHASE_ORDER))):
        dur = float(phases[name]) / 1e3
        out.append(
            {
                "name": name,
                "cat": "server",
                "start": cursor - dur,
                "end": cursor,
                "args": {"ms": phases[name]},
            }
        )
        cursor -= dur
    return out


def origin(cells: Sequence[dict[str, Any]]) -> float:
    """The earliest span's start: the trace's time zero."""
    return min((s["start"] for c in cells for t in c["tracks"] for s in t["spans"]), default=0.0)


def chrome_trace(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``cells``: :func:`cell_timeline`'s, in the run's order."""
    events: list[dict[str, Any]] = []
    zero = origin(cells)
    for pid, cell in enumerate(cells, 1):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"{cell['label']} · {cell['mode']}"},
            }
        )
        for tid, track in enumerate(cell["tracks"], 1):
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": tid,
                    "args": {"name": track["name"] or f"rollout {tid}"},
                }
            )
            for span in track["spans"]:
                events.append(
                    {
                        "ph": "X",
                        "name": span["name"],
                        "cat": span["cat"],
                        "pid": pid,
                        "tid": tid,
                        "ts": round((span["start"] - zero) * 1e6, 1),
                        "dur": round((span["end"] - span["start"]) * 1e6, 1),
                        "args": span["args"],
                    }
                )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"clock": "CLOCK_MONOTONIC of the lab's host (client and server on one machine)"},
    }


def write_trace(cells: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    path = out / "trace.json"
    path.write_text(json.dumps(chrome_trace(cells), separators=(",", ":")) + "\n", encoding="utf-8")
    paths = [path]
    png = write_timeline(cells, out / "timeline.png")
    if png is not None:
        paths.append(png)
    return paths


def write_timeline(cells: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """The first cell's first rollout in every mode, one row each, from its own first send."""
    if not cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = cells[0]["label"]
    rows = [(c["mode"], c["tracks"][0]["spans"]) for c in cells if c["label"] == label and c["tracks"]]
    fig, ax = plt.subplots(figsize=(13, 0.7 * len(rows) + 1.6))
    for y, (_mode, track) in enumerate(rows):
        rounds = [s for s in track if s["cat"] == "client" and s["name"] != "tools"]
        t0 = min((s["start"] for s in rounds), default=0.0)  # the rollout's first send
        bars: dict[str, list[tuple[float, float]]] = {k: [] for k in COLORS}
        for s in track:
            if s["cat"] == "client" and s["name"] == "tools":
                bars["tools"].append((s["start"] - t0, s["end"] - s["start"]))
            elif s["cat"] == "gpu":
                bars[s["name"]].append((s["start"] - t0, s["end"] - s["start"]))
        for s in rounds:  # what is neither tools nor GPU: the API, both ends and the wire
            bars["api"].append((s["start"] - t0, s["end"] - s["start"]))
        for name in ("api", "tools", "queue", "prefill", "decode"):
            ax.broken_barh(bars[name], (y - 0.35, 0.7), color=COLORS[name], label=name if y == 0 else None)
    ax.set_yticks(range(len(rows)), [m for m, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the rollout's first request")
    ax.set_title(f"one rollout per mode: {label} (red: API overhead, both ends and the wire)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
