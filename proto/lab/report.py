"""The lab's outputs: results.json (SPEC §6), results.csv, the PNG plots and the printed table."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

BASELINE = "http"
MODE_ORDER = ("http", "http-prev", "ws", "longlived")
MODE_COLORS = {"http": "#d62728", "http-prev": "#ff7f0e", "ws": "#1f77b4", "longlived": "#2ca02c"}


def clean(value: Any) -> Any:
    """NaN/inf → null, so results.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def cell_key(run: dict[str, Any]) -> tuple[str, str, str]:
    return (run["workload"], run["model"], run.get("profile", ""))


def cells(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """(workload, model, profile) → mode → run, in first-seen order."""
    out: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for run in runs:
        out.setdefault(cell_key(run), {})[run["mode"]] = run
    return out


def ratio(run: dict[str, Any], base: dict[str, Any] | None, key: str) -> float | None:
    if base is None or not base.get(key) or run.get(key) is None:
        return None
    return float(run[key]) / float(base[key])


def write_json(results: dict[str, Any], out: Path) -> Path:
    path = out / "results.json"
    path.write_text(json.dumps(clean(results), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


CSV_FIELDS = ("profile", "workload", "model", "mode", "sessions", "rollouts", "turns", "e2e_s_p50", "ttft_ms_p50",
              "ttft_ms_p90", "tpot_ms_p50", "itl_ms_p99", "turn_overhead_ms_p50", "turn_overhead_ms_p90",
              "prefill_ms_per_turn", "server_cpu_ms_per_turn", "client_bytes_sent_per_turn", "input_tokens",
              "cached_tokens", "output_tokens", "e2e_vs_http", "ttft_vs_http", "overhead_first_turn_ms",
              "overhead_last_turn_ms")


def write_csv(results: dict[str, Any], out: Path) -> Path:
    path = out / "results.csv"
    runs = results["runs"]
    phase_names = sorted({name for run in runs for name in run["phases_ms"]})
    by_cell = cells(runs)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*CSV_FIELDS, *(f"phase_{n}_ms_per_turn" for n in phase_names)])
        for run in runs:
            base = by_cell[cell_key(run)].get(BASELINE)
            by_turn = run["turn_overhead_ms_by_turn"]
            row = dict(run, **run["usage"], e2e_vs_http=ratio(run, base, "e2e_s_p50"), ttft_vs_http=ratio(run, base, "ttft_ms_p50"),
                       overhead_first_turn_ms=by_turn[0] if by_turn else None,
                       overhead_last_turn_ms=by_turn[-1] if by_turn else None)
            writer.writerow([_fmt(row.get(k)) for k in CSV_FIELDS] + [_fmt(run["phases_ms"].get(n, 0.0)) for n in phase_names])
    return path


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    return "" if value is None else value


# ---- the table ----------------------------------------------------------------------------------


def print_table(results: dict[str, Any], console: Console) -> None:
    """Per (workload, model): latency, then cost; rows are modes, profiles side by side."""
    runs = results["runs"]
    profiles = list(dict.fromkeys(r.get("profile", "") for r in runs))
    groups: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = {}
    for run in runs:
        groups.setdefault((run["workload"], run["model"]), {}).setdefault(run["mode"], {})[run.get("profile", "")] = run
    floor = results["floor"]["ws_ping_rtt_ms_p50"]
    for (workload, model), modes in groups.items():
        title = f"{workload} · {model} · p50s · floor = WebSocket ping RTT p50 {floor:.3f} ms"
        latency = Table(title=title, title_justify="left")
        cost = Table(title=f"{workload} · {model} · per turn", title_justify="left")
        latency.add_column("mode", no_wrap=True)
        cost.add_column("mode", no_wrap=True)
        for p in profiles:
            short = _SHORT.get(p, p)
            latency.add_column(f"{short}\nE2E s", justify="right")
            latency.add_column(f"{short}\nvs http", justify="right")
            latency.add_column(f"{short}\nTTFT ms", justify="right")
            latency.add_column(f"{short}\novh ms", justify="right")
            cost.add_column(f"{short}\nserver CPU ms", justify="right")
            cost.add_column(f"{short}\nKiB sent", justify="right")
        for mode in sorted(modes, key=_mode_rank):
            lat: list[str] = []
            cst: list[str] = []
            for p in profiles:
                run = modes[mode].get(p)
                if run is None:
                    lat += ["–"] * 4
                    cst += ["–"] * 2
                    continue
                r = ratio(run, modes.get(BASELINE, {}).get(p), "e2e_s_p50")
                vs = "" if r is None or mode == BASELINE else f"{(r - 1) * 100:+.1f}%"
                lat += [f"{run['e2e_s_p50']:.2f}", vs, f"{run['ttft_ms_p50']:.1f}", f"{run['turn_overhead_ms_p50']:.2f}"]
                cpu = run["server_cpu_ms_per_turn"]
                cst += ["–" if cpu is None else f"{cpu:.1f}", f"{run['client_bytes_sent_per_turn'] / 1024:.1f}"]
            latency.add_row(mode, *lat)
            cost.add_row(mode, *cst)
        console.print(latency)
        console.print(cost)


_SHORT = {"production-like": "prod-like"}


def _mode_rank(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


# ---- plots --------------------------------------------------------------------------------------


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_cell = cells(results["runs"])
    labels = [" · ".join(x for x in (p, w, m) if x) for (w, m, p) in by_cell]
    paths = []

    def grid(title: str) -> tuple[Any, list[Any]]:
        n = len(by_cell)
        cols = min(n, 2)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
        fig.suptitle(title)
        flat = [ax for row in axes for ax in row]
        for ax in flat[n:]:
            ax.set_visible(False)
        return fig, flat[:n]

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    # E2E by mode: one group per cell.
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(by_cell) + 2), 4.5))
    width = 0.8 / len(MODE_ORDER)
    for i, mode in enumerate(MODE_ORDER):
        xs, ys = [], []
        for j, modes in enumerate(by_cell.values()):
            if mode in modes:
                xs.append(j + (i - 1.5) * width)
                ys.append(modes[mode]["e2e_s_p50"])
        if xs:
            ax.bar(xs, ys, width, label=mode, color=MODE_COLORS[mode])
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("rollout E2E p50 (s)")
    ax.set_title("End to end per rollout, by mode")
    ax.legend()
    save(fig, "e2e_by_mode.png")

    fig, axes = grid("API overhead per turn (TTFT − modelled prefill − queue wait), median over rollouts")
    for ax, label, modes in zip(axes, labels, by_cell.values(), strict=True):
        for mode in sorted(modes, key=_mode_rank):
            ys = modes[mode]["turn_overhead_ms_by_turn"]
            ax.plot(range(len(ys)), ys, marker=".", label=mode, color=MODE_COLORS.get(mode))
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("turn index")
        ax.set_ylabel("overhead (ms)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    save(fig, "overhead_by_turn.png")

    phase_names = sorted({n for run in results["runs"] for n in run["phases_ms"]})
    fig, axes = grid("Server phases per turn (mean ms) and the rest of the API overhead")
    cmap = plt.get_cmap("tab20")
    for ax, label, modes in zip(axes, labels, by_cell.values(), strict=True):
        order = sorted(modes, key=_mode_rank)
        bottoms = [0.0] * len(order)
        for k, name in enumerate([*phase_names, "unattributed"]):
            heights = []
            for mode in order:
                run = modes[mode]
                if name == "unattributed":  # mean overhead no timed server phase covers: framing, loop, network
                    known = sum(run["phases_ms"].values())
                    heights.append(max(run.get("turn_overhead_ms_mean", 0.0) - known, 0.0))
                else:
                    heights.append(run["phases_ms"].get(name, 0.0))
            color = "#bbbbbb" if name == "unattributed" else cmap(k % 20)
            ax.bar(order, heights, bottom=bottoms, label=name, color=color)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        ax.set_title(label, fontsize=9)
        ax.set_ylabel("ms per turn")
        ax.legend(fontsize=7)
    save(fig, "phases_by_mode.png")

    fig, axes = grid("TTFT CDF (every measured turn)")
    for ax, label, modes in zip(axes, labels, by_cell.values(), strict=True):
        for mode in sorted(modes, key=_mode_rank):
            xs = sorted(modes[mode].get("ttft_ms_all") or [])
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=mode, color=MODE_COLORS.get(mode))
        ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("TTFT (ms, log)")
        ax.set_ylabel("fraction of turns")
        ax.legend(fontsize=8)
    save(fig, "ttft_cdf.png")
    return paths
