"""The lab's outputs for people: the printed table and the PNG plots, both read from results.json
(``proto.lab.report.results`` shapes and writes it, results.csv too)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
from rich import box
from rich.console import Console
from rich.table import Table

from proto.core.response import MODES
from proto.lab.analysis.stats import MIN_ROLLOUTS, Gain, Percentiles
from proto.lab.records import GridRow, RunRecord, run_of
from proto.lab.report.results import BASELINE, cells, figure, ratio

MODE_ORDER: tuple[str, ...] = (
    MODES  # the order the designs are compared in: each removes work the one before redoes
)
MODE_COLORS = {
    "http": "#d62728",
    "http-cached": "#9467bd",
    "http-prev": "#ff7f0e",
    "ws": "#1f77b4",
    "longlived": "#2ca02c",
}


# ---- the table ----------------------------------------------------------------------------------

WIDTH = 80  # every table reads whole in an 80-column terminal (tests/test_lab_traces.py checks it)


def print_table(results: dict[str, Any], console: Console) -> None:
    """Per (workload, model) and profile: latency with the fast model's prediction; then cost per turn."""
    runs = [run_of(r) for r in results["runs"]]
    groups: dict[tuple[str, str], dict[str, dict[str, RunRecord]]] = {}
    for run in runs:
        groups.setdefault((run.workload, run.model), {}).setdefault(run.profile, {})[run.mode] = run
    floor = results["floor"]["ws_ping_rtt_ms_p50"]
    if floor is not None and math.isfinite(floor):  # --predict measures no floor
        console.print(f"floor: WebSocket ping RTT p50 {floor:.3f} ms", width=WIDTH)
    for (workload, model), profiles in groups.items():
        for profile, modes in profiles.items():
            table = Table(
                title=_cut(f"{profile} · {workload} · {model} · p50"),
                title_justify="left",
                box=box.SIMPLE_HEAD,
                padding=(0, 1),
            )
            for name in ("mode", "E2E s", "±http", "predicted", "err", "TTFT ms", "±http", "ovh ms"):
                table.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
            base = modes.get(BASELINE)
            for mode in sorted(modes, key=_mode_rank):
                run = modes[mode]
                e2e, ttft = ratio(run, base, "e2e_s_p50"), ratio(run, base, "ttft_ms_p50")
                pred, err = figure(run, "predicted_e2e_s_p50"), figure(run, "prediction_error")
                table.add_row(
                    mode,
                    f"{run.e2e_s_p50:.2f}",
                    _pct(e2e, mode),
                    "–" if pred is None else f"{pred:.2f}",
                    "–" if err is None else f"{err * 100:+.1f}%",
                    f"{run.ttft_ms_p50:.1f}",
                    _pct(ttft, mode),
                    _ms(run.turn_overhead_ms_p50),  # None: a server without its own report (--url)
                )
            console.print(table, width=WIDTH)
            if any(run.gains is not msgspec.UNSET for run in modes.values()):
                _print_statistics(profile, workload, model, modes, console)
        names = list(profiles)
        cost = Table(
            title=_cut(f"{workload} · {model} · per turn"),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        cost.add_column("mode", no_wrap=True)
        for p in names:
            short = _SHORT.get(p, p)
            cost.add_column(f"{short} CPU ms", justify="right", no_wrap=True)
            cost.add_column(f"{short} KiB sent", justify="right", no_wrap=True)
        for mode in sorted({m for ms in profiles.values() for m in ms}, key=_mode_rank):
            row = [mode]
            for p in names:
                found = profiles[p].get(mode)
                cpu = None if found is None else found.server_cpu_ms_per_turn
                row += [
                    "–" if cpu is None else f"{cpu:.1f}",
                    "–" if found is None else f"{found.client_bytes_sent_per_turn / 1024:.1f}",
                ]
            cost.add_row(*row)
        console.print(cost, width=WIDTH)


def _print_statistics(
    profile: str, workload: str, model: str, modes: dict[str, RunRecord], console: Console
) -> None:
    """A group's spread and paired gains (docs/lab.md, "Statistics"): E2E and TTFT p50 / p90 / p99, and each
    mode's gain against ``http`` and ``http-cached`` with its 95 % interval (negative = faster; "=" when the
    interval holds 0); then how many rollouts, and why the group is flagged noisy."""
    spread = Table(
        title=_cut(f"{profile} · {model} · spread: E2E s, TTFT ms"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
    )
    gain = Table(
        title=_cut(f"{profile} · {model} · paired gain % [95% CI]"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
    )
    for name in ("mode", "E2E p50", "p90", "p99", "TTFT p50", "p90", "p99"):
        spread.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
    for name in ("mode", "E2E vs http", "vs cached", "TTFT vs http", "vs cached"):
        gain.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
    for mode in sorted(modes, key=_mode_rank):
        run = modes[mode]
        spread.add_row(
            mode, *_three(figure(run, "e2e_s_pct"), "{:.2f}"), *_three(figure(run, "ttft_ms_pct"), "{:.1f}")
        )
        gains = figure(run, "gains") or {}
        http, cached = gains.get("http") or {}, gains.get("http-cached") or {}
        gain.add_row(
            _SHORT_MODE.get(mode, mode),
            _gain(http.get("e2e")),
            _gain(cached.get("e2e")),
            _gain(http.get("ttft")),
            _gain(cached.get("ttft")),
        )
    console.print(spread, width=WIDTH)
    console.print(gain, width=WIDTH)
    any_run = next(iter(modes.values()))
    n = min(len(figure(run, "rollout_records") or []) for run in modes.values())
    few = f" (fewer than the {MIN_ROLLOUTS} of a default cell)" if n < MIN_ROLLOUTS else ""
    console.print(
        f"{n} measured rollouts per mode{few}; gain = mode / baseline - 1 per rollout pair, negative = "
        "faster; = : the interval holds 0 (no difference)",
        width=WIDTH,
        highlight=False,
    )
    if figure(any_run, "noisy"):
        console.print("NOISY: " + "; ".join(figure(any_run, "noisy")), width=WIDTH, highlight=False)


def _three(p: Percentiles | None, fmt: str) -> list[str]:
    values = (None, None, None) if p is None else (p.p50, p.p90, p.p99)
    return ["–" if x is None else fmt.format(x) for x in values]


def _gain(g: Gain | None) -> str:
    """``-14[-23,-7]`` (per cent); ``=[-5,+3]`` when the interval holds 0; the point and its pair count
    without an interval."""
    if g is None or g.gain is None:
        return ""
    if g.low is None or g.high is None:
        return f"{g.gain * 100:+.0f} n={g.pairs}"
    head = "=" if g.verdict == "no difference" else f"{g.gain * 100:+.0f}"
    return f"{head}[{g.low * 100:+.0f},{g.high * 100:+.0f}]"


def print_grid(results: dict[str, Any], console: Console) -> None:
    """``--predict``'s grid, per profile: a row per (workload, model), http's predicted E2E p50 and every
    other mode's against it."""
    rows = [msgspec.convert(r, GridRow) for r in results.get("grid") or []]
    groups = cells(rows)
    modes = sorted({r.mode for r in rows}, key=_mode_rank)
    for profile in dict.fromkeys(k[0] for k in groups):
        table = Table(
            title=_cut(f"fast model · {profile} · E2E p50 (predicted, not run)"),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        table.add_column("workload", no_wrap=True, max_width=20)
        table.add_column("model", no_wrap=True, max_width=7)
        table.add_column("http s", justify="right", no_wrap=True)
        for mode in modes:
            if mode != BASELINE:
                table.add_column(_SHORT_MODE.get(mode, mode), justify="right", no_wrap=True, min_width=6)
        for (p, workload, model), by_mode in groups.items():
            if p != profile:
                continue
            base = by_mode.get(BASELINE)
            table.add_row(
                workload.removeprefix("tracelab-"),
                model.removeprefix("mock-"),
                "–" if base is None else f"{base.predicted_e2e_s_p50:.1f}",
                *(
                    _pct(ratio(by_mode[m], base, "predicted_e2e_s_p50") if m in by_mode else None, m)
                    for m in modes
                    if m != BASELINE
                ),
            )
        console.print(table, width=WIDTH)


_SHORT_MODE = {"http-cached": "cached", "http-prev": "prev"}


def _pct(r: float | None, mode: str) -> str:
    return "" if r is None or mode == BASELINE else f"{(r - 1) * 100:+.1f}%"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _cut(title: str) -> str:
    return title if len(title) <= WIDTH - 2 else title[: WIDTH - 3] + "…"


_SHORT = {"production-like": "prod", "local": "local", "remote": "remote"}


def _mode_rank(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


# ---- plots --------------------------------------------------------------------------------------


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    from proto.lab.analysis.sweep import write_curves

    curves = write_curves(results.get("sweep") or [], out, MODE_COLORS)
    if not results["runs"]:
        return curves
    return [*curves, *_run_plots(results, out)]


def _run_plots(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [run_of(r) for r in results["runs"]]
    by_cell = cells(runs)
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
                xs.append(j + (i - (len(MODE_ORDER) - 1) / 2) * width)
                e2e = modes[mode].e2e_s_p50
                ys.append(math.nan if e2e is None else e2e)
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
            by_turn = modes[mode].turn_overhead_ms_by_turn
            ax.plot(range(len(by_turn)), by_turn, marker=".", label=mode, color=MODE_COLORS.get(mode))
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("turn index")
        ax.set_ylabel("overhead (ms)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    save(fig, "overhead_by_turn.png")

    phase_names = sorted({n for run in runs for n in run.phases_ms})
    fig, axes = grid("Server phases per turn (mean ms) and the rest of the API overhead")
    cmap = plt.get_cmap("tab20")
    for ax, label, modes in zip(axes, labels, by_cell.values(), strict=True):
        order = sorted(modes, key=_mode_rank)
        bottoms = [0.0] * len(order)
        for k, name in enumerate([*phase_names, "unattributed"]):
            heights = []
            for mode in order:
                run = modes[mode]
                if (
                    name == "unattributed"
                ):  # mean overhead no timed server phase covers: framing, loop, network
                    known = sum(run.phases_ms.values())
                    heights.append(max((run.turn_overhead_ms_mean or 0.0) - known, 0.0))
                else:
                    heights.append(run.phases_ms.get(name, 0.0))
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
            xs = sorted(x for x in modes[mode].ttft_ms_all if x is not None)
            if xs:
                ax.step(
                    xs,
                    [(i + 1) / len(xs) for i in range(len(xs))],
                    where="post",
                    label=mode,
                    color=MODE_COLORS.get(mode),
                )
        ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("TTFT (ms, log)")
        ax.set_ylabel("fraction of turns")
        ax.legend(fontsize=8)
    save(fig, "ttft_cdf.png")
    return paths
