"""``responses-lab bench --client codex``'s command line and figures (docs/lab.md, "The real agent"): the
options, each client's percentiles and paired gains, their comparison, results.json and report.md. The
rollouts themselves are :mod:`proto.lab.run.codex_client`'s."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from proto.helpfmt import HelpFormatter
from proto.lab.analysis.stats import MIN_ROLLOUTS, SIGN, Gain, paired_gain, percentiles
from proto.lab.records import WAIT_SHARE, CpuTime, provenance
from proto.lab.report.results import clean, utc
from proto.lab.run.codex_client import (
    BASELINE,
    MODELS,
    MODES,
    QUICK_ROLLOUTS,
    TASKS,
    CodexRollout,
    CodexRunError,
    CodexUnavailable,
    Options,
    codex_binaries,
    run_codex,
    run_synthetic,
    synthetic_plan,
    task_prompt,
)

# ---- the figures ------------------------------------------------------------------------------------


def _gain(mode: Sequence[float], base: Sequence[float], baseline: str, metric: str) -> dict[str, Any]:
    g: Gain = paired_gain(mode, base, baseline=baseline, metric=metric)
    return dict(msgspec.to_builtins(g))


def client_and_wire_ms(r: CodexRollout) -> float:
    """A rollout's non-tool time a turn that the server's report does not account for (its modelled prefill
    and decode, its API phases): Codex's own work and the wire, in ms."""
    return (1e3 * r.non_tool_s - r.prefill_ms - r.decode_ms - r.phases_ms) / max(r.turns, 1)


def codex_summary(rollouts: Sequence[CodexRollout]) -> dict[str, Any]:
    """Per mode: percentiles, per-turn means, and the paired gains against ``codex-http`` (pairs by index) on
    E2E, the non-tool time and the client-and-wire time a turn (:func:`client_and_wire_ms`). Everything here
    is a function of the rollout records, so a kept results.json's ``rollouts`` recompute it."""
    by_mode: dict[str, dict[int, CodexRollout]] = {}
    for r in rollouts:
        by_mode.setdefault(r.mode, {})[r.index] = r
    base = by_mode.get(BASELINE, {})
    out: dict[str, Any] = {}
    for name, runs in by_mode.items():
        rs = list(runs.values())
        turns = sum(r.turns for r in rs) or 1
        row: dict[str, Any] = {
            "codex_version": next(m.version for m in MODES if m.name == name),
            "rollouts": len(rs),
            "e2e_s": msgspec.to_builtins(percentiles([r.e2e_s for r in rs])),
            "non_tool_s": msgspec.to_builtins(percentiles([r.non_tool_s for r in rs])),
            "tool_s": msgspec.to_builtins(percentiles([r.tool_s for r in rs])),
            "non_tool_ms_per_turn": 1e3 * sum(r.non_tool_s for r in rs) / turns,
            "server_ms_per_turn": sum(r.prefill_ms + r.decode_ms + r.phases_ms for r in rs) / turns,
            "prewarm_per_rollout": sum(r.prewarm for r in rs) / len(rs),
            "calls_per_rollout": sum(len(r.call_ids) for r in rs) / len(rs),
            "gains": {},
        }
        if name != BASELINE and base:
            pairs = [(runs[i], base[i]) for i in sorted(runs) if i in base]
            row["gains"] = {
                "e2e": _gain([a.e2e_s for a, _ in pairs], [b.e2e_s for _, b in pairs], BASELINE, "e2e"),
                "non_tool": _gain(
                    [a.non_tool_s for a, _ in pairs], [b.non_tool_s for _, b in pairs], BASELINE, "non_tool"
                ),
                "client_and_wire": _gain(
                    [client_and_wire_ms(a) for a, _ in pairs],
                    [client_and_wire_ms(b) for _, b in pairs],
                    BASELINE,
                    "client_and_wire",
                ),
            }
        out[name] = row
    return out


def synthetic_summary(results: dict[str, Any]) -> dict[str, Any]:
    """The lab client's runs on the plan, in the same shape: percentiles, per-turn means and paired gains
    against ``http`` on E2E and on the non-tool time (E2E − the tool waits it slept)."""
    runs = {run["mode"]: run for run in results["runs"]}
    records = {m: {r["index"]: r for r in run["rollout_records"]} for m, run in runs.items()}
    base = records.get("http", {})
    out: dict[str, Any] = {}
    for mode, recs in records.items():
        rs = list(recs.values())
        turns = sum(int(r["turns"]) for r in rs) or 1
        row: dict[str, Any] = {
            "rollouts": len(rs),
            "e2e_s": msgspec.to_builtins(percentiles([r["e2e_s"] for r in rs])),
            "non_tool_s": msgspec.to_builtins(percentiles([r["e2e_s"] - r["tool_wait_s"] for r in rs])),
            "non_tool_ms_per_turn": 1e3 * sum(r["e2e_s"] - r["tool_wait_s"] for r in rs) / turns,
            "server_ms_per_turn": (runs[mode].get("prefill_ms_per_turn") or 0.0)
            + (runs[mode].get("decode_ms_per_turn") or 0.0)
            + sum((runs[mode].get("phases_ms") or {}).values()),
            "ttft_ms_p50": runs[mode].get("ttft_ms_p50"),
            "turn_overhead_ms_p50": runs[mode].get("turn_overhead_ms_p50"),
            "gains": {},
        }
        if mode != "http" and base:
            pairs = [(recs[i], base[i]) for i in sorted(recs) if i in base]
            row["gains"] = {
                "e2e": _gain([a["e2e_s"] for a, _ in pairs], [b["e2e_s"] for _, b in pairs], "http", "e2e"),
                "non_tool": _gain(
                    [a["e2e_s"] - a["tool_wait_s"] for a, _ in pairs],
                    [b["e2e_s"] - b["tool_wait_s"] for _, b in pairs],
                    "http",
                    "non_tool",
                ),
            }
        out[mode] = row
    return out


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    if None in (a.get("low"), a.get("high"), b.get("low"), b.get("high")):
        return None
    return bool(a["low"] <= b["high"] and b["low"] <= a["high"])


def comparison(codex: dict[str, Any], synthetic: dict[str, Any]) -> list[dict[str, Any]]:
    """Per design, both clients' gains side by side; ``agree``: the two intervals overlap (None: too few
    pairs for an interval); and where a turn's non-tool time goes for each client: ``server`` (what the
    server's report accounts for: modelled prefill and decode, its API phases) and ``client_and_wire`` (the
    rest: the client's own work and the loopback hops)."""
    rows = []
    for mode in MODES:
        if mode.name == BASELINE or mode.name not in codex or mode.synthetic not in synthetic:
            continue
        c, s = codex[mode.name], synthetic[mode.synthetic]
        row: dict[str, Any] = {"codex_mode": mode.name, "synthetic_mode": mode.synthetic}
        for metric in ("e2e", "non_tool"):
            cg, sg = c["gains"].get(metric, {}), s["gains"].get(metric, {})
            row[metric] = {"codex": cg, "synthetic": sg, "agree": _overlap(cg, sg)}
        row["per_turn_ms"] = {
            name: {
                "non_tool": side["non_tool_ms_per_turn"],
                "server": side["server_ms_per_turn"],
                "client_and_wire": side["non_tool_ms_per_turn"] - side["server_ms_per_turn"],
            }
            for name, side in (("codex", c), ("synthetic", s))
        }
        rows.append(row)
    return rows


def _pct(g: dict[str, Any]) -> str:
    if not g or g.get("gain") is None:
        return "–"
    if g.get("low") is None:
        return f"{100 * g['gain']:+.1f} % (too few pairs)"
    return f"{100 * g['gain']:+.1f} % [{100 * g['low']:+.1f}, {100 * g['high']:+.1f}]"


def _agreement(row: dict[str, Any]) -> str:
    words = {True: "intervals overlap", False: "intervals disjoint", None: "no interval"}
    return ", ".join(f"{metric}: {words[row[metric]['agree']]}" for metric in ("e2e", "non_tool"))


def _row(design: str, client: str, side: dict[str, Any]) -> str:
    gains, non_tool, server = side["gains"], side["non_tool_ms_per_turn"], side["server_ms_per_turn"]
    return (
        f"| {design} | {client} | {side['e2e_s']['p50']:.3f} | {non_tool:.1f} | {server:.1f} | "
        f"{non_tool - server:.1f} | "
        f"{_pct(gains.get('e2e', {}))} | "
        f"{_pct(gains.get('non_tool', {}))} |"
    )


def codex_noise(cell: dict[str, Any]) -> list[str]:
    """A model's line on how much the lab's processes (Codex and its tools, the server, the lab) waited for a
    core over its measured Codex rollouts, flagged noisy above WAIT_SHARE (docs/lab.md, "Statistics");
    nothing for a file written before the lab sampled it."""
    cpu = CpuTime(**cell["lab_cpu"]) if cell.get("lab_cpu") else None
    if cpu is None or cpu.wait_share is None:
        return []
    flag = f" **noisy: above {WAIT_SHARE:.0%}**" if cpu.noisy else ""
    return [
        f"Codex's rollouts: the lab's processes waited for a core {cpu.wait_share:.1%} of their "
        f"{cpu.run_ms / 1e3:.1f} s of CPU{flag}.",
        "",
    ]


def report_markdown(results: dict[str, Any]) -> str:
    """report.md: both clients' gains side by side per model, and where they differ, from results.json."""
    lines = [
        "# The real agent beside the lab's client",
        "",
        f"Command: `{results['command']}`. {SIGN}. Codex's gains are against `{BASELINE}` (Codex 0.171 over "
        "HTTP; `codex-longlived` is Codex 0.107), the lab client's against `http`; 95 % bootstrap intervals. "
        "Non-tool time = E2E - the tools' times; server = what the server's report accounts for per turn "
        "(modelled prefill and decode, API phases); the rest of a turn is the client's own work and the "
        "wire.",
        "",
    ]
    if results["rollouts"] < MIN_ROLLOUTS:
        quick = " (--quick)" if results["quick"] else ""
        lines += [
            f"**{results['rollouts']} rollouts per mode: fewer than a default run's {MIN_ROLLOUTS}{quick}.**",
            "",
        ]
    for model, cell in results["models"].items():
        lines += [f"## {model}", "", *codex_noise(cell)]
        lines.append(
            "| design | client | E2E p50 s | non-tool ms/turn | server ms/turn | client+wire ms/turn | "
            "gain E2E | gain non-tool |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        codex, synthetic = cell["codex"], cell.get("synthetic") or {}
        for mode in MODES:
            if mode.name in codex:
                c = codex[mode.name]
                lines.append(_row(mode.server_mode, f"{mode.name} ({c['codex_version']})", c))
            if mode.synthetic in synthetic:
                lines.append(_row(mode.server_mode, "lab client", synthetic[mode.synthetic]))
        lines.append("")
        for row in cell.get("comparison", []):
            c, s = row["per_turn_ms"]["codex"], row["per_turn_ms"]["synthetic"]
            lines.append(
                f"- `{row['codex_mode']}` vs `{row['synthetic_mode']}`: {_agreement(row)}. "
                "Client and wire a turn: "
                f"Codex {c['client_and_wire']:.1f} ms, the lab client {s['client_and_wire']:.1f} ms; server: "
                f"{c['server']:.1f} and {s['server']:.1f} ms."
            )
        lines.append("")
    return "\n".join(lines)


def results_json(
    options: Options,
    argv: Sequence[str],
    codex: dict[str, list[CodexRollout]],
    synthetic: dict[str, dict[str, Any]],
    wall_s: float,
    cpu: dict[str, CpuTime | None] | None = None,
) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for model, rollouts in codex.items():
        cell: dict[str, Any] = {"codex": codex_summary(rollouts), "rollouts": msgspec.to_builtins(rollouts)}
        lab_cpu = (cpu or {}).get(model)
        cell["lab_cpu"] = None if lab_cpu is None else msgspec.to_builtins(lab_cpu)
        if model in synthetic:
            cell["synthetic"] = synthetic_summary(synthetic[model])
            cell["synthetic_out"] = f"synthetic/{model}"
            cell["comparison"] = comparison(cell["codex"], cell["synthetic"])
        models[model] = cell
    return {
        "format": "codex-client/1",
        "command": "responses-lab bench " + " ".join(argv),
        "generated": utc(time.time()),
        "wall_s": wall_s,
        "provenance": msgspec.to_builtins(provenance()),
        "sign": SIGN,
        "quick": options.quick,
        "rollouts": options.rollouts,
        "warmup": options.warmup,
        "seed": options.seed,
        "task": {"name": options.task, "prompt": task_prompt(TASKS[options.task])},
        "modes": [
            {"name": m.name, "codex": m.version, "server_mode": m.server_mode, "synthetic": m.synthetic}
            for m in MODES
        ],
        "models": models,
    }


# ---- the command ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="responses-lab bench --client codex",
        description='the real Codex CLI as the lab\'s client (docs/lab.md, "The real agent")',
    )
    run = parser.add_argument_group("the run: client, speeds, rollouts, task")
    output = parser.add_argument_group("output")
    run.add_argument("--client", choices=("codex",), required=True, help="the real client: Codex CLI")
    run.add_argument(
        "--model", default=None, help=f"comma list (default: {','.join(MODELS)}; --quick: mock-4000tps)"
    )
    run.add_argument(
        "--rollouts",
        type=int,
        default=None,
        help=f"measured rollouts per mode (default {MIN_ROLLOUTS}; --quick {QUICK_ROLLOUTS})",
    )
    run.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="uncounted rollouts per mode and model (default 1; --quick 0)",
    )
    run.add_argument(
        "--task",
        choices=sorted(TASKS),
        default=None,
        help="the repository task (default fix-mean; --quick fix-mean-short)",
    )
    run.add_argument("--seed", type=int, default=1, help="the mock GPU's jitter (and the synthetic run's)")
    run.add_argument(
        "--no-synthetic", action="store_true", help="Codex only: skip the lab client's run on the same plan"
    )
    output.add_argument(
        "--out", type=Path, default=Path("bench-out"), help="results.json, report.md, the rollout files"
    )
    run.add_argument(
        "--quick", action="store_true", help="one speed, fewer rollouts, the short task (and says so)"
    )
    return parser


def options_from(argv: Sequence[str]) -> Options:
    args = _parser().parse_args(argv)
    models = tuple(
        m.strip()
        for m in (args.model or ("mock-4000tps" if args.quick else ",".join(MODELS))).split(",")
        if m.strip()
    )
    rollouts = (
        args.rollouts if args.rollouts is not None else (QUICK_ROLLOUTS if args.quick else MIN_ROLLOUTS)
    )
    warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    if rollouts < 1 or warmup < 0:
        raise SystemExit("--rollouts must be >= 1, --warmup >= 0")
    task = args.task or ("fix-mean-short" if args.quick else "fix-mean")
    return Options(models, rollouts, warmup, task, args.out, args.seed, args.quick, not args.no_synthetic)


def main(argv: Sequence[str], bench: Callable[[list[str]], int]) -> int:
    """``responses-lab bench --client codex [flags]``: exit 0; 1 when Codex is unavailable or a rollout did
    not run the task as scripted (the reason on stderr, nothing written)."""
    options = options_from(argv)
    console = Console()
    started = time.perf_counter()
    try:
        binaries = codex_binaries()  # not installed or not runnable: fail before anything starts
        codex, cpu = asyncio.run(run_codex(options, binaries, console))
        synthetic = {}
        if options.synthetic:
            for model, rollouts in codex.items():
                plan = synthetic_plan(
                    rollouts, options.out, options.out / "synthetic" / f"{model}-plan.jsonl"
                )
                synthetic[model] = run_synthetic(model, plan, options, bench)
    except (CodexUnavailable, CodexRunError) as exc:
        Console(stderr=True).print(f"responses-lab bench: {exc}", highlight=False, soft_wrap=True)
        return 1
    results = results_json(options, argv, codex, synthetic, time.perf_counter() - started, cpu)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "results.json").write_text(json.dumps(clean(results), indent=1) + "\n", encoding="utf-8")
    report = report_markdown(results)
    (options.out / "report.md").write_text(report + "\n", encoding="utf-8")
    console.print(report, highlight=False, soft_wrap=True)
    if options.rollouts < MIN_ROLLOUTS:
        console.print(
            f"{options.rollouts} rollouts per mode: fewer than a default run's {MIN_ROLLOUTS}",
            highlight=False,
        )
    console.print(
        f"wall {time.perf_counter() - started:.1f} s; wrote {options.out / 'results.json'}, "
        f"{options.out / 'report.md'}"
    )
    return 0
