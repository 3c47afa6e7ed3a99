"""The seed's curve and the SMG axis, from the fast model (``analysis/predict.py``): each mode's E2E and
TTFT against ``http`` as decode speed goes 65 → 4 000 tokens/s (each speed with its hardware class's
prefill), as the rollout grows 8 → 40 turns, and as the hops get dearer. One session; the workload is
coding-agent (its length, for the turn curve, from ``workload/synthetic.py``); tool times × the run's
``--tool-time-scale``. The ``sweep`` list of results.json (docs/lab.md, "results.json") and two PNGs come from
here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from proto.lab.analysis.predict import Calibration, Hops, predict_cell
from proto.lab.config import PEER_MODES, PROFILES
from proto.lab.workload.synthetic import coding_agent
from proto.lab.workload.traces import Replay, from_workload
from sampler.models import MODELS, ModelSpec
from sampler.policy import workload_from_json

SPEEDS = (65, 130, 250, 500, 1000, 2000, 4000)
TURNS = (8, 12, 16, 20, 25, 30, 35, 40)
SAFETY_HOPS_MS = (0, 5, 10, 20, 35, 50, 75, 100)  # the resolve hop at a tenth, as in the profiles
GPU_CLASS, WAFER_CLASS = "mock-65tps", "mock-1000tps"


def speed_model(tps: float) -> ModelSpec:
    """A decode speed with its class's prefill: GPU-served below 500 tokens/s, wafer-scale from there
    (the seed's story: 65 on GPUs, 1 000 and bursts of 4 000 on wafer-scale hardware)."""
    base = MODELS[GPU_CLASS if tps < 500 else WAFER_CLASS]
    return dataclasses.replace(base.override(tokens_per_s=tps), name=f"{base.name}@{tps:g}")


@functools.cache
def coding(turns: int) -> Replay:
    return from_workload(workload_from_json(coding_agent(turns)))


def _point(
    cal: Calibration,
    modes: Sequence[str],
    replay: Replay,
    spec: ModelSpec,
    hops: Hops,
    profile: str,
    scale: float,
    **extra: Any,
) -> list[dict[str, Any]]:
    preds = {mode: predict_cell(cal, mode, replay, spec, hops, tool_time_scale=scale) for mode in modes}
    base = preds.get("http")
    rows = []
    for mode, p in preds.items():
        rows.append(
            {
                "mode": mode,
                "model": spec.name,
                "decode_tps": round(spec.tokens_per_s, 3),
                "prefill_us_per_token": spec.prefill_time_per_token_ms * 1e3,
                "prefill_overhead_ms": spec.prefill_overhead_ms,
                "turns": len(replay.sessions[0].rounds),
                "profile": profile,
                "workload": replay.name,
                "tool_time_scale": scale,
                "safety_hop_ms": hops.safety_ms,
                "resolve_hop_ms": hops.resolve_ms,
                "predicted_e2e_s": p.e2e_s_p50,
                "predicted_ttft_ms_p50": p.ttft_ms_p50,
                "predicted_e2e_vs_http": None if base is None else p.e2e_s_p50 / base.e2e_s_p50 - 1,
                "predicted_ttft_vs_http": None if base is None else p.ttft_ms_p50 / base.ttft_ms_p50 - 1,
                **extra,
            }
        )
    return rows


def sweep(cal: Calibration, modes: Sequence[str], tool_time_scale: float) -> list[dict[str, Any]]:
    """The fast model's curves for ``modes``: this server's own (a peer's mode has no fit to compose)."""
    modes = [mode for mode in modes if mode not in PEER_MODES]
    rows: list[dict[str, Any]] = []
    for profile in ("local", "production-like"):
        hops = Hops.of(PROFILES[profile])
        for tps in SPEEDS:
            rows += _point(
                cal, modes, coding(30), speed_model(tps), hops, profile, tool_time_scale, curve="speed"
            )
        for turns in TURNS:
            rows += _point(
                cal,
                modes,
                coding(turns),
                MODELS["mock-1000tps"],
                hops,
                profile,
                tool_time_scale,
                curve="turns",
            )
    for safety in SAFETY_HOPS_MS:
        hops = Hops(float(safety), safety / 10.0)
        rows += _point(
            cal,
            modes,
            coding(30),
            MODELS["mock-1000tps"],
            hops,
            f"safety {safety} ms",
            tool_time_scale,
            curve="hops",
        )
    return rows


def write_curves(rows: Sequence[dict[str, Any]], out: Any, colors: dict[str, str]) -> list[Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for curve, x_key, x_label, name in (
        (
            "speed",
            "decode_tps",
            "decode speed (tokens/s, log; < 500: GPU prefill, ≥ 500: wafer-scale)",
            "gain_vs_speed.png",
        ),
        ("turns", "turns", "turns per rollout", "gain_vs_turns.png"),
        ("hops", "safety_hop_ms", "safety hop (ms; resolve hop a tenth)", "gain_vs_hops.png"),
    ):
        points = [r for r in rows if r.get("curve") == curve and r["mode"] != "http"]
        if not points:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
        for ax, key, label in (
            (axes[0], "predicted_e2e_vs_http", "E2E vs http"),
            (axes[1], "predicted_ttft_vs_http", "TTFT p50 vs http"),
        ):
            for mode in dict.fromkeys(r["mode"] for r in points):
                for profile, style in (("local", "--"), ("production-like", "-"), ("", "-")):
                    sel = [
                        r
                        for r in points
                        if r["mode"] == mode
                        and (r["profile"] == profile or (not profile and curve == "hops"))
                    ]
                    if not sel or (curve == "hops" and profile):
                        continue
                    xs = [r[x_key] for r in sel]
                    ys = [100 * r[key] for r in sel if r[key] is not None]
                    tag = f"{mode}" + (f" ({profile})" if profile else "")
                    ax.plot(xs[: len(ys)], ys, style, marker=".", color=colors.get(mode), label=tag)
            if curve == "speed":
                ax.set_xscale("log")
            ax.axhline(0, color="#999999", lw=0.8)
            ax.set_xlabel(x_label)
            ax.set_ylabel(f"{label} (%)")
            ax.set_title(f"predicted (fast model): {label}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
