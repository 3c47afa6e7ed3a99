"""``responses-lab bench --client codex``: the real, unmodified Codex CLI as the lab's client (docs/lab.md,
"The real agent").

Each rollout is one ``codex exec`` in a fresh workspace (the demo's buggy repository, proto/demo/fixture.py)
and a fresh ``CODEX_HOME``, configured as a user configures a custom provider (docs/clients.md, "Codex CLI").
The mock model follows the task's directive script (docs/protocol.md, "The directive script"), so Codex runs
every tool for real: its shell (``exec_command``) and its freeform ``apply_patch`` change the workspace.

* **Modes**: Codex 0.171 over HTTP (``codex-http``) and over GA WebSocket mode (``codex-ws``), and Codex
  0.107's v1 transport over the long-lived protocol (``codex-longlived``, ``?protocol=longlived``), each
  from the directory ``make clients`` installs it into. A binary that is missing or is not the pinned
  version is a :class:`CodexUnavailable` before anything starts: the run fails with the reason, never
  skips.
* **Design**: per model (the speed factor) one server, then rollout index ``i`` runs every mode once in row
  ``i`` of the Williams design (proto/lab/design.py), after one uncounted warm-up rollout per mode.
* **Timings** come from Codex's own rollout file (``$CODEX_HOME/sessions/…/rollout-*.jsonl``, its line
  timestamps): E2E = ``task_started`` → ``task_complete``; a tool's time = its call item → its first result
  (as proto/lab/codex_rollout.py reads them); the non-tool time = E2E − the tools' times. The server's
  per-turn reports come from its ``response_ended`` log lines (``lab_turns``, ``phases_ms``). No terminal
  output is read for a figure.
* **Exactly once**: a rollout's call ids in the server's log (``call_ids``) equal, in order, the call items
  in Codex's rollout file, each with exactly one result; the tools' names are the task's; and the workspace
  holds each shell step's marker line once and the patch's own file. Anything else is a
  :class:`CodexRunError`, and the run fails.
* **The synthetic client on the same plan**: per model, the lab's own client replays the rounds of the
  first ``codex-http`` rollout (proto/lab/codex_rollout.py: its prompt and output sizes) with each tool's
  median time over every Codex rollout of that model, in ``http``, ``ws`` and ``longlived``
  (``responses-lab bench`` itself, into ``OUT/synthetic/MODEL``). The comparison pairs each client's gains.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from proto.demo.fixture import FIXED_STATS, make_repo
from proto.lab.config import BenchConfig, profile_named
from proto.lab.records import CpuTime, TreeCpuSampler
from proto.lab.run.design import mode_order
from proto.lab.run.runner import server_flags
from proto.lab.workload.codex_rollout import RESULTS, derive_rounds
from proto.processes import ChildServer

ROOT = Path(__file__).resolve().parents[3]
KEY = "sk-lab-codex-0001"
RUN_TIMEOUT_S = 600.0  # a guard against a hung client (a 65 tok/s rollout takes seconds), not a figure
MODELS = ("mock-65tps", "mock-1000tps", "mock-4000tps")
QUICK_ROLLOUTS = 3
SYNTHETIC_MODES = ("http", "ws", "longlived")


def clients_dir() -> Path:
    """Where ``make clients`` installs them: ``.cache/clients``, or ``$RESPONSES_LAB_CLIENTS_DIR``."""
    return Path(os.environ.get("RESPONSES_LAB_CLIENTS_DIR") or ROOT / ".cache" / "clients")


class CodexUnavailable(RuntimeError):
    """A Codex CLI the run needs is not installed or does not run (the reason is in the message)."""


class CodexRunError(RuntimeError):
    """A Codex rollout that did not run the task as scripted (which check failed, and Codex's output tail)."""


# ---- the modes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodexMode:
    name: str
    package: str  # tests/clients/<package>: the pinned npm package ``make clients`` installs
    version: str
    server_mode: str  # what the server's log says served it
    synthetic: str  # the lab client's mode it stands beside

    def binary(self) -> Path:
        return clients_dir() / self.package / "node_modules" / ".bin" / "codex"

    def config(self, base_url: str, model: str) -> str:
        """The ``config.toml`` a user writes (docs/clients.md, "Codex CLI"): a custom provider with its key
        in an environment variable; the catalog settings that make 0.171 offer ``apply_patch``; for 0.107,
        its documented WebSocket switch, the query parameter that selects the long-lived protocol, and the
        feature that offers its freeform ``apply_patch`` (0.107 reads no provider catalog)."""
        lines = [
            f'model = "{model}"',
            'model_provider = "lab"',
            "[model_providers.lab]",
            'name = "responses-lab"',
            f'base_url = "{base_url}"',
            'env_key = "LAB_API_KEY"',
            'wire_api = "responses"',
        ]
        if self.server_mode in ("ws", "longlived"):
            lines.append("supports_websockets = true")
        if self.server_mode == "longlived":
            lines += ['query_params = { protocol = "longlived" }', "[features]"]
            lines += ["responses_websockets = true", "apply_patch_freeform = true"]
        else:
            lines += [
                f'model_catalog_url = "{base_url}/models"',
                "[features]",
                "api_key_model_discovery = true",
            ]
        return "\n".join(lines) + "\n"


MODES = (
    CodexMode("codex-http", "codex", "0.171.0", "http", "http"),
    CodexMode("codex-ws", "codex", "0.171.0", "ws", "ws"),
    CodexMode("codex-longlived", "codex-v1", "0.107.0", "longlived", "longlived"),
)
BASELINE = "codex-http"


def codex_binaries(modes: Sequence[CodexMode] = MODES) -> dict[str, Path]:
    """Each mode's Codex binary, checked: installed, runnable, the pinned version; else
    :class:`CodexUnavailable` saying how to get it."""
    found: dict[str, Path] = {}
    for mode in modes:
        binary = mode.binary()
        if not binary.exists():
            raise CodexUnavailable(
                f"Codex CLI {mode.version} ({mode.name}) is not installed at {binary}: run `make clients` "
                f"(npm install of tests/clients/{mode.package}/package.json)"
            )
        if shutil.which("node") is None:
            raise CodexUnavailable(
                "node is not on PATH: Codex CLI's npm package starts with `node bin/codex.js`"
            )
        try:
            out = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=60, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise CodexUnavailable(f"{binary} does not run: {exc}") from exc
        if mode.version not in out:
            raise CodexUnavailable(f"{binary} is {out.strip()!r}, not {mode.version}: run `make clients`")
        found[mode.name] = binary
    return found


# ---- the task ---------------------------------------------------------------------------------------

MARKERS = ".lab-markers"  # each shell step appends its own line: counted per rollout
PATCHED = ".lab-patched"  # the patch adds it beside its fix of stats.py
FIX = (
    "*** Begin Patch\n*** Update File: stats.py\n@@\n"
    "-    for i in range(len(values) - 1):\n+    for i in range(len(values)):\n"
    f"*** Add File: {PATCHED}\n+patched\n*** End Patch\n"
)
SUMMARY = "Fixed the off-by-one in stats.mean; both tests pass."


@dataclass(frozen=True)
class Step:
    tool: str  # exec_command | apply_patch
    argument: str  # the shell command, or the patch
    marker: str = ""  # a shell step's marker line

    def directive(self) -> str:
        if self.tool == "apply_patch":
            return "!call apply_patch " + json.dumps(self.argument)
        return "!call exec_command " + json.dumps(
            {"cmd": f"{self.argument}; printf '{self.marker}\\n' >> {MARKERS}"}
        )


def _shell(marker: str, command: str) -> Step:
    return Step("exec_command", command, marker)


# The demo's coding task (proto/demo/script.py) with Codex's own tools: look, fail, patch, pass. The last
# test appends its marker only when the tests pass (``&&`` inside the step's command).
TASKS: dict[str, tuple[Step, ...]] = {
    "fix-mean": (
        _shell("grep", "grep -n 'def mean' stats.py test_stats.py"),
        _shell("read", "cat stats.py"),
        _shell("test-before", "python3 test_stats.py"),
        Step("apply_patch", FIX),
        _shell("test-after", f"python3 test_stats.py && printf 'passed\\n' >> {MARKERS}"),
    ),
    "fix-mean-short": (
        _shell("grep", "grep -n 'range' stats.py"),
        Step("apply_patch", FIX),
        _shell("test-after", f"python3 test_stats.py && printf 'passed\\n' >> {MARKERS}"),
    ),
}


def task_prompt(steps: Sequence[Step]) -> str:
    return "\n".join(
        [
            "The tests of this repository fail. Fix the bug.",
            *(s.directive() for s in steps),
            f"!say {SUMMARY}",
        ]
    )


def expected_markers(steps: Sequence[Step]) -> Counter[str]:
    want = Counter(s.marker for s in steps if s.marker)
    if any(s.marker == "test-after" for s in steps):
        want["passed"] += 1
    return want


def check_workspace(work: Path, steps: Sequence[Step]) -> dict[str, int]:
    """The workspace's count of each step's effect; :class:`CodexRunError` unless each is there once."""
    lines = (work / MARKERS).read_text().split() if (work / MARKERS).exists() else []
    seen = Counter(lines)
    patches = sum(1 for s in steps if s.tool == "apply_patch")
    if patches:
        ok = (work / PATCHED).is_file() and (work / PATCHED).read_text() == "patched\n"
        seen["apply_patch"] = int(ok and (work / "stats.py").read_text() == FIXED_STATS)
    want = expected_markers(steps)
    if patches:
        want["apply_patch"] = 1
    if seen != want:
        raise CodexRunError(f"the workspace shows {dict(seen)}, the task wants each once: {dict(want)}")
    return dict(sorted(seen.items()))


# ---- one rollout ------------------------------------------------------------------------------------


class CodexRollout(msgspec.Struct, frozen=True):
    """One measured Codex rollout: its timings from Codex's rollout file, the server's report of it from the
    server's log, and the counts that show every tool ran once."""

    mode: str
    model: str
    index: int
    position: int  # where this mode ran in its index's order (0 = first)
    e2e_s: float  # task_started -> task_complete
    tool_s: float  # the tools' times, summed (call item -> first result; serial calls)
    non_tool_s: float  # e2e_s - tool_s: the model's turns as Codex waited for them, and Codex's own work
    turns: int  # model calls (token_count rounds)
    tool_ms: list[float]  # each call's time, in order
    call_ids: list[str]  # from Codex's rollout file, in order
    server_call_ids: list[str]  # from the server's log, in order
    markers: dict[str, int]  # the workspace's counts
    responses: int  # responses the server ended for this rollout (a GA prewarm included)
    prewarm: int  # of them, responses that sampled nothing (``generate: false``)
    server_turns: int
    input_tokens: int
    output_tokens: int
    prefill_ms: float  # the server's report, summed over the rollout's turns
    queue_wait_ms: float
    decode_ms: float
    phases_ms: float  # the API phases the server timed, summed
    rollout_file: str  # kept under OUT, relative to it


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass
class Timings:
    e2e_s: float
    calls: list[tuple[str, str, float]]  # (call id, name, ms)
    results: Counter[str]


def rollout_timings(path: Path) -> Timings:
    """E2E and every call's time from a Codex rollout file's own timestamps (module docstring)."""
    start = end = None
    emitted: dict[str, tuple[str, float]] = {}
    first: dict[str, float] = {}
    results: Counter[str] = Counter()
    for text in path.read_text(encoding="utf-8").splitlines():
        if not text.strip():
            continue
        line = json.loads(text)
        payload, kind = line.get("payload") or {}, line.get("type")
        event, t = payload.get("type"), _at(line["timestamp"])
        if kind == "event_msg" and event == "task_started" and start is None:
            start = t
        elif kind == "event_msg" and event == "task_complete":
            end = t
        elif kind == "response_item" and event in ("function_call", "custom_tool_call"):
            emitted[str(payload.get("call_id"))] = (str(payload.get("name")), t)
        elif event in RESULTS:
            call = str(payload.get("call_id"))
            if kind == "response_item":
                results[call] += 1
            first.setdefault(call, t)
    if start is None or end is None:
        raise CodexRunError(f"{path.name}: no task_started / task_complete: the rollout did not finish")
    calls = [
        (call, name, (first[call] - t) * 1e3 if call in first else float("nan"))
        for call, (name, t) in emitted.items()
    ]
    return Timings(end - start, calls, results)


def ended_lines(output: str) -> list[dict[str, Any]]:
    """The server's ``response_ended`` log lines, in order."""
    out = []
    for text in output.splitlines():
        if '"response_ended"' in text:
            with contextlib.suppress(ValueError):
                line = json.loads(text)
                if line.get("event") == "response_ended":
                    out.append(line)
    return out


def codex_env(home: Path) -> dict[str, str]:
    drop = ("OPENAI_", "CODEX_", "RESPONSES_LAB_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "CODEX_HOME": str(home), "HOME": str(home), "LAB_API_KEY": KEY, "NO_COLOR": "1"}


async def _exec(binary: Path, home: Path, work: Path, prompt: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(binary), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt,
        cwd=work, env=codex_env(home), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CodexRunError(f"{binary} did not finish within {RUN_TIMEOUT_S:.0f} s") from None
    return proc.returncode or 0, out.decode(errors="replace")


async def run_rollout(
    mode: CodexMode,
    binary: Path,
    server: ChildServer,
    model: str,
    steps: Sequence[Step],
    keep: Path | None,
    index: int = -1,
    position: int = 0,
) -> CodexRollout:
    """One ``codex exec`` of the task in a fresh workspace and ``CODEX_HOME``, checked (module docstring);
    its rollout file copied to ``keep`` (None: a warm-up, not kept)."""
    mark = len(ended_lines(server.output()))
    with tempfile.TemporaryDirectory(prefix="responses-lab-codex-") as scratch:
        home, work = Path(scratch) / "home", make_repo(Path(scratch) / "work")
        home.mkdir()
        (home / "config.toml").write_text(mode.config(f"{server.http_url}/v1", model))
        code, output = await _exec(binary, home, work, task_prompt(steps))
        tail = output[-3000:]
        if code != 0:
            raise CodexRunError(f"{mode.name} ({binary}) exited with {code}:\n{tail}")
        files = sorted((home / "sessions").rglob("rollout-*.jsonl"))
        if len(files) != 1:
            raise CodexRunError(f"{mode.name}: {len(files)} rollout files under {home / 'sessions'}, not one")
        markers = check_workspace(work, steps)
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files[0], keep)
        path = keep or files[0]
        timings = rollout_timings(path)
        rounds = derive_rounds(path)
    lines = await _lines_since(server, mark, steps)
    return _record(mode, model, index, position, steps, timings, len(rounds), lines, markers, path, tail)


async def _lines_since(
    server: ChildServer, mark: int, steps: Sequence[Step], timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """The server's lines for this rollout once they hold every call (each is written before its response's
    terminal event leaves, so they are there by the time Codex has its answer; the wait is a guard)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = ended_lines(server.output())[mark:]
        if sum(len(line.get("call_ids", [])) for line in lines) >= len(steps) or time.monotonic() > deadline:
            return lines
        await asyncio.sleep(0.02)


def _record(
    mode: CodexMode,
    model: str,
    index: int,
    position: int,
    steps: Sequence[Step],
    timings: Timings,
    rounds: int,
    lines: list[dict[str, Any]],
    markers: dict[str, int],
    path: Path,
    tail: str,
) -> CodexRollout:
    def fail(why: str) -> CodexRunError:
        return CodexRunError(f"{mode.name} on {model}: {why}\nCodex's output ends:\n{tail}")

    served = [line for line in lines if line["turns"] > 0]
    if {line["mode"] for line in served} != {mode.server_mode}:
        raise fail(
            f"the server logged modes {sorted({line['mode'] for line in served})}, not {mode.server_mode}"
        )
    if any(line["status"] != "completed" for line in lines):
        raise fail(f"statuses {[line['status'] for line in lines]}")
    server_ids = [cid for line in lines for cid in line.get("call_ids", [])]
    names = [name for line in lines for name in line.get("calls", [])]
    ids = [call for call, _, _ in timings.calls]
    if names != [s.tool for s in steps]:
        raise fail(f"the server's model called {names}, the task {[s.tool for s in steps]}")
    if server_ids != ids or len(set(ids)) != len(ids):
        raise fail(f"call ids: the server's log {server_ids}, Codex's rollout file {ids}")
    if any(timings.results[call] != 1 for call in ids):
        raise fail(f"results per call in Codex's rollout file: {dict(timings.results)}")
    tool_ms = [ms for _, _, ms in timings.calls]
    reports = [turn for line in lines for turn in line.get("lab_turns", [])]
    tool_s = sum(tool_ms) / 1e3
    return CodexRollout(
        mode=mode.name,
        model=model,
        index=index,
        position=position,
        e2e_s=timings.e2e_s,
        tool_s=tool_s,
        non_tool_s=timings.e2e_s - tool_s,
        turns=rounds,
        tool_ms=tool_ms,
        call_ids=ids,
        server_call_ids=server_ids,
        markers=markers,
        responses=len(lines),
        prewarm=sum(1 for line in lines if line["turns"] == 0),
        server_turns=sum(int(line["turns"]) for line in lines),
        input_tokens=sum(int(line["input_tokens"]) for line in lines),
        output_tokens=sum(int(line["output_tokens"]) for line in lines),
        prefill_ms=sum(float(t["prefill_ms"]) for t in reports),
        queue_wait_ms=sum(float(t["queue_wait_ms"]) for t in reports),
        decode_ms=sum(float(t["decode_ms"]) for t in reports),
        phases_ms=sum(float(ms) for line in lines for ms in line.get("phases_ms", {}).values()),
        rollout_file=str(path),
    )


# ---- the run ----------------------------------------------------------------------------------------


@dataclass
class Options:
    models: tuple[str, ...]
    rollouts: int
    warmup: int
    task: str
    out: Path
    seed: int
    quick: bool
    synthetic: bool


def _server(model: str, seed: int) -> ChildServer:
    """This project's server as the lab starts it (the ``local`` profile, the mock GPU's jitter seeded) with
    its log at ``info``: the per-turn reports and call ids the checks read."""
    config = BenchConfig(models=(model,), seed=seed)
    return ChildServer([*server_flags(profile_named("local"), config), "--log-level", "info"], api_key=KEY)


async def run_codex(
    options: Options, binaries: dict[str, Path], console: Console
) -> tuple[dict[str, list[CodexRollout]], dict[str, CpuTime | None]]:
    """Every model's Codex rollouts: one server per model, the warm-up, then the indices in Williams order.
    With them, per model, the CPU and run-queue wait of every process of the lab's over the measured
    rollouts (Codex and its tools, the server, the lab), sampled (proto/lab/records.py, TreeCpuSampler)."""
    steps = TASKS[options.task]
    names = [m.name for m in MODES]
    by_name = {m.name: m for m in MODES}
    out: dict[str, list[CodexRollout]] = {}
    cpu: dict[str, CpuTime | None] = {}
    for model in options.models:
        rollouts: list[CodexRollout] = []
        with _server(model, options.seed) as server:
            for mode in MODES:
                for _ in range(options.warmup):
                    await run_rollout(mode, binaries[mode.name], server, model, steps, None)
            async with TreeCpuSampler() as sampled:
                for index in range(options.rollouts):
                    for position, name in enumerate(mode_order(names, index)):
                        keep = options.out / "codex" / model / f"{name}-{index}.jsonl"
                        r = await run_rollout(
                            by_name[name], binaries[name], server, model, steps, keep, index, position
                        )
                        rollouts.append(
                            msgspec.structs.replace(r, rollout_file=str(keep.relative_to(options.out)))
                        )
                        console.print(
                            f"{model} {name} #{index}: E2E {r.e2e_s:.2f} s, tools {r.tool_s:.2f} s, "
                            f"{r.turns} turns, {len(r.call_ids)} calls each once",
                            highlight=False,
                        )
        cpu[model] = sampled.cpu()
        out[model] = rollouts
    return out, cpu


def synthetic_plan(rollouts: Sequence[CodexRollout], root: Path, path: Path) -> Path:
    """The lab client's plan for one model: the rounds of its first ``codex-http`` rollout (prompt and output
    sizes), each tool's time the median of that call over every Codex rollout of the model; as TraceLab
    round-trace JSONL (docs/lab.md, "Trace replay")."""
    template = next(r for r in rollouts if r.mode == BASELINE)
    rows = derive_rounds(root / template.rollout_file)
    medians = [statistics.median(r.tool_ms[k] for r in rollouts) for k in range(len(template.tool_ms))]
    k = 0
    for row in rows:
        for tool in row["tools"]:
            tool["tool_wall_latency_ms"] = round(medians[k], 3)
            k += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def run_synthetic(
    model: str, plan: Path, options: Options, bench: Callable[[list[str]], int]
) -> dict[str, Any]:
    """``responses-lab bench`` on the plan: the lab's own client in ``http``, ``ws`` and ``longlived``, the
    same rollouts, warm-up and seed as the Codex side; its results.json. ``bench`` is ``responses-lab
    bench``'s main, handed over so that this module does not import the command line that dispatches here."""

    out = options.out / "synthetic" / model
    argv = [
        "--workload", str(plan), "--model", model, "--modes", ",".join(SYNTHETIC_MODES), "--profile", "local",
        "--sessions", "1", "--rollouts", str(options.rollouts), "--warmup", str(max(options.warmup, 1)),
        "--seed", str(options.seed), "--pings", "20", "--no-predict", "--no-plots", "--out", str(out),
    ]  # fmt: skip
    if bench(argv) != 0:
        raise CodexRunError(f"the synthetic run failed: responses-lab bench {' '.join(argv)}")
    results: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return results
