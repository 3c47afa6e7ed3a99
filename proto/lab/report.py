"""The lab's outputs for people: the printed table and the PNG plots, both read from results.json
(``proto.lab.results`` shapes and writes it, results.csv too)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from proto.lab.results import BASELINE, cells, ratio
from proto.response import MODES

MODE_ORDER: tuple[str, ...] = MODES  # the order the designs are compared in: each removes work the one before redoes
MODE_COLORS = {"http": "#d62728", "http-prev": "#ff7f0e", "ws": "#1f77b4", "longlived": "#2ca02c"}


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
    labels = [" · ".join(x for x in key if x) for key in by_cell]
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
