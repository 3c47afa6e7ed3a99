"""A run's typed records (docs/lab.md, "results.json"): where it ran (:class:`Provenance`), how quiet the
machine was around each cell (:class:`Load`), the floors measured in the run (:class:`Floor`), one
:class:`RolloutRecord` per measured rollout, one :class:`RunRecord` per cell (results.json's ``runs[]``)
and a run directory's :class:`CellRecord` (docs/lab.md, "Long sweeps"). Encoded into results.json with
``msgspec.to_builtins``; read back with ``msgspec.convert`` / ``msgspec.json.decode`` (:func:`run_of`).

**A noisy cell** (flagged in the tables): the lab's own processes (this one and every descendant: the
servers, an engine, a peer) waited in a run queue for a core more than ``WAIT_SHARE`` of the time they ran
during its group (:func:`tree_cpu`, from the kernel's per-thread ``schedstat``), or a floor whose spread
((p90 − p10) ÷ p50) exceeds ``FLOOR_SPREAD``. Where the kernel gives no ``schedstat``, the 1-minute load
average before or after the group above ``LOAD_PER_CORE`` × the usable cores stands in (more runnable
threads than cores: someone waited, though not necessarily the lab).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from proto.lab.analysis.stats import Gain, Percentiles

LOAD_PER_CORE = 1.0
FLOOR_SPREAD = 1.0
WAIT_SHARE = 0.05


class Provenance(msgspec.Struct, frozen=True):
    commit: str | None  # git HEAD of the checkout the lab ran from (None outside a checkout)
    dirty: bool | None  # a tracked file differs from the index (:func:`git_dirty`)
    cpu_model: str
    kernel: str
    cores: int  # os.cpu_count()
    cores_usable: int  # the lab process's affinity
    python: str
    uvloop: str | None  # None: not installed (the server then runs on asyncio's loop)
    # the lab process's CPU scheduling (:func:`scheduling`), its children's too; unset in a file written
    # before the lab read it
    scheduler: str | UnsetType | None = UNSET


def scheduling() -> str | None:
    """The lab process's scheduling policy, as its children inherit it: ``SCHED_OTHER nice 0``, or a
    real-time ``SCHED_RR 10`` (``chrt -r 10``: the lab's processes run before any ordinary process, so
    a machine's other work does not delay them; docs/lab.md, "Kept runs"). None off Linux."""
    if not hasattr(os, "sched_getscheduler"):
        return None
    policy = os.sched_getscheduler(0)
    names = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}
    name = names.get(policy, f"policy {policy}")
    if policy in (os.SCHED_FIFO, os.SCHED_RR):
        return f"{name} {os.sched_getparam(0).sched_priority}"
    return f"{name} nice {os.getpriority(os.PRIO_PROCESS, 0)}"


ROOT = Path(__file__).resolve().parents[2]  # the checkout the lab runs from


def _git_dir(root: Path) -> Path | None:
    """The checkout's git directory (a worktree's ``.git`` is a file naming it)."""
    dot = root / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():
        text = dot.read_text(encoding="utf-8").strip()
        if text.startswith("gitdir:"):
            path = Path(text.removeprefix("gitdir:").strip())
            return path if path.is_absolute() else (root / path).resolve()
    return None


def git_commit(git: Path) -> str | None:
    """HEAD's commit, read from the git directory's files (HEAD, the ref, packed-refs; a worktree's
    ``commondir`` holds the refs), without running git."""
    head = (git / "HEAD").read_text(encoding="utf-8").strip()
    if not head.startswith("ref:"):
        return head or None
    ref = head.removeprefix("ref:").strip()
    common = git
    if (git / "commondir").is_file():
        common = (git / (git / "commondir").read_text(encoding="utf-8").strip()).resolve()
    for base in (git, common):
        if (base / ref).is_file():
            return (base / ref).read_text(encoding="utf-8").strip()
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8").splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    return None


def git_dirty(root: Path, git: Path) -> bool | None:
    """Whether a tracked file's content differs from the index (``git diff`` non-empty), from the index
    file (format 2 or 3) and the files: an entry whose size and mtime match is clean, as git takes it;
    otherwise its blob hash decides. Staged changes are not looked at; None for an index it cannot read."""
    data = (git / "index").read_bytes()
    if data[:4] != b"DIRC" or int.from_bytes(data[4:8], "big") not in (2, 3):
        return None
    count, pos = int.from_bytes(data[8:12], "big"), 12
    for _ in range(count):
        start = pos
        mtime_s, mtime_ns = (
            int.from_bytes(data[pos + 8 : pos + 12], "big"),
            int.from_bytes(data[pos + 12 : pos + 16], "big"),
        )
        mode = int.from_bytes(data[pos + 24 : pos + 28], "big")
        size = int.from_bytes(data[pos + 36 : pos + 40], "big")
        sha = data[pos + 40 : pos + 60]
        flags = int.from_bytes(data[pos + 60 : pos + 62], "big")
        pos += 62 + (2 if flags & 0x4000 else 0)
        end = data.index(b"\0", pos)
        name = data[pos:end].decode("utf-8", "surrogateescape")
        pos = start + ((end - start) // 8 + 1) * 8  # NUL-padded to a multiple of 8
        if mode >> 12 == 0o16 or (flags >> 12) & 3:  # a submodule, or a conflict's stage
            continue
        path = root / name
        try:
            st = path.lstat()
        except OSError:
            return True  # deleted
        if st.st_size == size and int(st.st_mtime) == mtime_s and st.st_mtime_ns % 10**9 == mtime_ns:
            continue
        body = os.readlink(path).encode() if mode >> 12 == 0o12 else path.read_bytes()
        if hashlib.sha1(b"blob %d\0" % len(body) + body, usedforsecurity=False).digest() != sha:
            return True
    return False


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> Provenance:
    from importlib.metadata import PackageNotFoundError, version

    git = _git_dir(ROOT)
    commit: str | None = None
    dirty: bool | None = None
    if git is not None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            commit = git_commit(git)
            dirty = git_dirty(ROOT, git)
    try:
        uvloop: str | None = version("uvloop")
    except PackageNotFoundError:
        uvloop = None
    cores = os.cpu_count() or 1
    return Provenance(
        commit=commit,
        dirty=dirty,
        cpu_model=cpu_model(),
        kernel=platform.release(),
        cores=cores,
        cores_usable=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores,
        python=platform.python_version(),
        uvloop=uvloop,
        scheduler=scheduling(),
    )


class Floor(msgspec.Struct, frozen=True):
    """Round trips of one floor (``ws_ping``: WebSocket ping → pong; ``http_noop``: ``GET /healthz`` through
    the lab's HTTP client stack, send mark to body read) in ms, with their spread."""

    name: str
    n: int
    p10: float | None
    p50: float | None
    p90: float | None
    spread: float | None  # (p90 - p10) / p50


def floor(name: str, rtts_ms: Sequence[float]) -> Floor:
    if not rtts_ms:
        return Floor(name, 0, None, None, None, None)
    p10, p50, p90 = (float(x) for x in np.percentile(np.asarray(rtts_ms, dtype=float), (10, 50, 90)))
    return Floor(name, len(rtts_ms), p10, p50, p90, (p90 - p10) / p50 if p50 > 0 else None)


class CpuTime(msgspec.Struct, frozen=True):
    """The lab's process tree over a group (:func:`tree_cpu`, after − before): milliseconds on a core and
    milliseconds runnable but waiting in a run queue for one."""

    run_ms: float
    wait_ms: float

    @property
    def wait_share(self) -> float | None:
        """The run-queue wait as a share of the time on a core; None with no time on one."""
        return self.wait_ms / self.run_ms if self.run_ms > 0 else None

    @property
    def noisy(self) -> bool:
        """Waited more than ``WAIT_SHARE`` of the time it ran (the module docstring's rule)."""
        return self.run_ms > 0 and self.wait_ms > WAIT_SHARE * self.run_ms


class Load(msgspec.Struct, frozen=True):
    """``os.getloadavg()`` (1, 5, 15 min) just before a group's first rollout and just after its last, and
    the lab's own processes' CPU and run-queue wait over the group (None where the kernel has no
    ``schedstat``; unset in a file written before the lab read it)."""

    before: tuple[float, float, float]
    after: tuple[float, float, float]
    cores: int
    lab_cpu: CpuTime | UnsetType | None = UNSET


def load_now() -> tuple[float, float, float]:
    a, b, c = os.getloadavg()
    return (round(a, 2), round(b, 2), round(c, 2))


def _descendants(root: int) -> list[int]:
    """``root`` and every live process below it, from /proc/<pid>/stat's parent field."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(entry.path, "stat").read_text(encoding="ascii", errors="replace")
            parent[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier]
        tree.extend(frontier)
    return tree


def tree_cpu(root: int | None = None) -> dict[tuple[int, int], tuple[int, int]] | None:
    """Per thread of ``root`` (this process) and its descendants: (ns on a core, ns waiting in a run queue)
    so far, from /proc/<pid>/task/<tid>/schedstat (the kernel's scheduler statistics: its first two
    fields). None where the kernel has none. :func:`cpu_between` subtracts two readings."""
    if not Path("/proc/self/schedstat").exists():
        return None
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for pid in _descendants(os.getpid() if root is None else root):
        with contextlib.suppress(OSError):
            for task in os.scandir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = Path(task.path, "schedstat").read_text(encoding="ascii").split()
                    out[(pid, int(task.name))] = (int(fields[0]), int(fields[1]))
    return out


def cpu_between(
    before: dict[tuple[int, int], tuple[int, int]] | None,
    after: dict[tuple[int, int], tuple[int, int]] | None,
) -> CpuTime | None:
    """The threads' run and wait between two :func:`tree_cpu` readings: a thread born meanwhile counts
    from 0; one that ended meanwhile is missed (the lab's servers outlive their groups)."""
    if before is None or after is None:
        return None
    run = wait = 0
    for key, (r, w) in after.items():
        r0, w0 = before.get(key, (0, 0))
        run += r - r0
        wait += w - w0
    return CpuTime(round(run / 1e6, 3), round(wait / 1e6, 3))


class TreeCpuSampler:
    """:func:`tree_cpu` read every ``period_s`` on the running loop, the readings merged, so a process that
    ends between two readings (``codex exec``, the tools it runs) counts up to its last one: ``async with
    TreeCpuSampler() as sampled: …`` then ``sampled.cpu()``. The lab's long-lived processes are counted
    whole; a short-lived one loses at most its last period, and one that lives less than a period is
    missed. None where the kernel has no ``schedstat``."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.period_s = period_s
        self.before: dict[tuple[int, int], tuple[int, int]] | None = None
        self.seen: dict[tuple[int, int], tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None

    def _read(self) -> None:
        now = tree_cpu()
        if now is not None:
            self.seen.update(now)  # a thread's counters only grow: the latest reading is its total so far

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            self._read()

    async def __aenter__(self) -> TreeCpuSampler:
        self.before = tree_cpu()
        self.seen = dict(self.before or {})
        if self.before is not None:
            self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])  # not awaited bare: a cancellation of ours must not be lost
        self._read()

    def cpu(self) -> CpuTime | None:
        return cpu_between(self.before, self.seen if self.before is not None else None)


def noise(load: Load | None, floors: Sequence[Floor]) -> list[str]:
    """Why a cell is noisy (the module docstring's rule); [] for a quiet one."""
    reasons = []
    if load is not None and isinstance(load.lab_cpu, CpuTime):
        cpu = load.lab_cpu
        if cpu.noisy:
            reasons.append(
                f"the lab's processes waited for a core {cpu.wait_share:.1%} of their CPU time"
                f" > {WAIT_SHARE:.0%}"
            )
    elif load is not None:
        worst = max(load.before[0], load.after[0])
        if worst > LOAD_PER_CORE * load.cores:
            reasons.append(f"load {worst:.2f} > {LOAD_PER_CORE:g} x {load.cores} cores")
    for f in floors:
        if f.spread is not None and f.spread > FLOOR_SPREAD:
            reasons.append(f"{f.name} floor spread {f.spread:.2f} > {FLOOR_SPREAD:g}")
    return reasons


class RolloutRecord(msgspec.Struct, frozen=True):
    """One measured rollout of one mode. ``index`` and ``session`` pair it with the same rollout in every
    other mode (same plan, same ``seed``, same tool times); ``position`` is where this mode ran in that
    index's order (0 = first)."""

    index: int
    session: int
    seed: int | None  # the tool times' seed (None: a trace's own recorded tool times)
    position: int
    e2e_s: float | None  # None: NaN when written (results.json is strict JSON)
    ttft_ms_p50: float | None
    turns: int
    tool_wait_s: float
    status: str
    # the rollout's median turn overhead (docs/lab.md, "Metrics"); UNSET in files written before it
    turn_overhead_ms_p50: float | UnsetType | None = UNSET


# ---- results.json's runs[] ------------------------------------------------------------------------


class Usage(msgspec.Struct):
    """A cell's token usage over its measured rollouts, as the server counted it."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int


class RunRecord(msgspec.Struct, kw_only=True):
    """One ``runs[]`` entry of results.json (docs/lab.md, "results.json"): one cell (profile, workload,
    model, mode) measured. Format 1 (no ``format`` field) has the fields up to ``store_vs_cached``; format 2
    adds the design's (``e2e_s_pct`` … ``noisy``). A peer's cell has ``peer``; a cell the fast model knows
    has the ``predicted_*`` fields; a format-2 run's cells have ``gains``. A field a record lacks is
    ``UNSET`` and is not written; the field order is the file's key order. Not frozen: the predictions and
    the gains are written into a finished cell's record (:func:`~proto.lab.report.results.add_gains`)."""

    mode: str
    workload: str
    model: str
    sessions: int
    e2e_s_p50: float | None
    ttft_ms_p50: float | None
    tpot_ms_p50: float | None
    itl_ms_p99: float | None
    turn_overhead_ms_p50: float | None
    turn_overhead_ms_by_turn: list[float | None]
    server_cpu_ms_per_turn: float | None
    client_bytes_sent_per_turn: float
    usage: Usage
    phases_ms: dict[str, float]  # mean per turn
    # the lab's extras
    profile: str = ""  # "" in files that lack it
    rollouts: int
    turns: int
    statuses: list[str]
    e2e_s: Sequence[float | None]  # every rollout's, sorted
    ttft_ms_p90: float | None
    turn_overhead_ms_mean: float | None
    turn_overhead_ms_p90: float | None
    prefill_ms_per_turn: float | None  # None: the server sent no report of its own (``--url``)
    decode_ms_per_turn: float | None
    tool_wait_s_per_rollout: float
    wall_s: float
    ttft_ms_all: list[float | None]
    # Per round of each session's first rollout, what the server counted: [input, cached, output] tokens.
    usage_by_round: dict[str, list[list[int]]]
    round_kinds: dict[str, int]
    # --reconnect: the turns after a reconnect (the store path) against the cached ones; {} without.
    store_vs_cached: Mapping[str, Mapping[str, float | None]]
    # format 2: the experiment's design (docs/lab.md, "Statistics")
    e2e_s_pct: Percentiles | UnsetType = UNSET
    ttft_ms_pct: Percentiles | UnsetType = UNSET
    rollout_records: list[RolloutRecord] | UnsetType = UNSET
    orders: list[list[str]] | UnsetType = UNSET
    blocks: int | UnsetType = UNSET
    load: Load | UnsetType | None = UNSET
    floors: list[Floor] | UnsetType = UNSET
    # A shaped link's check (proto/lab/run/network.py's LinkCheck, as builtins); None on loopback.
    link: dict[str, Any] | UnsetType | None = UNSET
    noisy: list[str] | UnsetType = UNSET
    # A peer's or a --url server's: who served the cell, how it was timed (docs/lab.md, "Peers").
    peer: dict[str, Any] | UnsetType = UNSET
    # the fast model's prediction for the cell (docs/lab.md, "The fast model")
    predicted_e2e_s_p50: float | UnsetType | None = UNSET
    predicted_ttft_ms_p50: float | UnsetType | None = UNSET
    predicted_parts_s: dict[str, float] | UnsetType = UNSET  # per rollout
    prediction_error: float | UnsetType | None = UNSET
    # baseline → figure (``e2e``, ``ttft``) → the paired gain
    gains: dict[str, dict[str, Gain]] | UnsetType = UNSET


class CellRecord(msgspec.Struct):
    """A run directory's ``cells/<cell>.json``: the cell's key, the shard that ran it, its ``runs[]`` entry
    (predictions included) and its spans for ``trace.json`` (docs/lab.md, "Long sweeps")."""

    format: int
    key: tuple[str, str, str, str]  # (profile, workload, model, mode)
    shard: str | None
    run: RunRecord
    timeline: dict[str, Any]


# ---- results.json ---------------------------------------------------------------------------------


class PingFloor(msgspec.Struct, kw_only=True):
    """results.json's ``floor``: the WebSocket ping round trips over every profile (ms), their count, each
    profile's p50 and, for shards assembled into one file, each shard's p50."""

    ws_ping_rtt_ms_p50: float | None
    ws_ping_rtt_ms_p90: float | None
    pings: int
    by_profile: dict[str, float | None]
    by_shard: dict[str, float | None] | UnsetType = UNSET


class Design(msgspec.Struct, kw_only=True):
    """results.json's ``design`` (docs/lab.md, "Statistics"): the sign convention, the order, the seed, the
    tool times and the jitter, the rollouts per mode, and the noise rule's thresholds (``noisy_when``)."""

    sign: str
    order: str
    seed: int
    tool_times: str
    jitter: dict[str, int | float] | None  # the mock GPU's jitter knobs and their seed
    fresh_server: bool
    rollouts_per_mode: int
    default_rollouts_per_mode_at_least: int
    quick: bool
    noisy_when: dict[str, int | float]


class Cells(msgspec.Struct, kw_only=True):
    """results.json's ``cells``: the grid's cells done, of how many, which are missing (their labels), and a
    single shard's own share of the grid."""

    done: int
    of: int
    missing: list[str]
    of_shard: int | UnsetType = UNSET


class Shard(msgspec.Struct, kw_only=True):
    """One ``shards[]`` entry of results.json assembled from several shards' directories."""

    shard: str | None
    dir: str
    command: str
    machine: dict[str, Any]
    started_utc: str
    wall_s: float
    cells: int
    calibration: dict[str, Any] | None


class GridRow(msgspec.Struct, kw_only=True):
    """One ``grid[]`` row of ``bench --predict`` (docs/lab.md, "The fast model's grid"): a cell, the fast
    model's E2E and TTFT p50 and their ratios − 1 against ``http`` in the same (profile, workload, model),
    its parts per rollout and its real-clock wall."""

    profile: str
    workload: str
    model: str
    mode: str
    sessions: int
    rollouts: int
    rounds: int
    tool_time_scale: float
    predicted_e2e_s_p50: float | None
    predicted_ttft_ms_p50: float | None
    predicted_parts_s: dict[str, float]
    predicted_wall_s: float
    predicted_e2e_vs_http: float | None = None
    predicted_ttft_vs_http: float | None = None


class Results(msgspec.Struct, kw_only=True):
    """A results.json (docs/lab.md, "results.json"), read back with :func:`results_of`. Format 1 (no
    ``format`` field) lacks the design's fields (``floors``, ``provenance``, ``design``); ``grid`` and
    ``calibration_from`` are ``bench --predict``'s; ``cells``, ``shard`` and ``shards`` a run directory's;
    ``scenario`` a scenario's; ``predictions_recomputed`` ``bench repredict``'s. A field a file lacks is
    ``UNSET`` and is not written; the field order is the writers' key order. ``calibration``, ``sweep``,
    ``profiles``, ``config``, ``machine``, ``scenario`` and a shard's ``machine`` stay JSON objects: their
    own modules shape them (the fast model's calibration, the curves, the profiles' factors)."""

    format: int | UnsetType = UNSET
    floor: PingFloor | UnsetType = UNSET
    floors: dict[str, Floor] | UnsetType = UNSET
    runs: list[RunRecord]
    calibration: dict[str, Any] | UnsetType | None = UNSET
    sweep: list[dict[str, Any]] | UnsetType = UNSET
    profiles: dict[str, dict[str, Any]] | UnsetType = UNSET
    config: dict[str, Any] | UnsetType = UNSET
    command: str | UnsetType = UNSET
    machine: dict[str, Any] | UnsetType = UNSET
    provenance: Provenance | UnsetType | None = UNSET
    design: Design | UnsetType | None = UNSET
    started_utc: str | UnsetType = UNSET
    wall_s: float | UnsetType = UNSET
    grid: list[GridRow] | UnsetType = UNSET
    calibration_from: str | UnsetType = UNSET
    cells: Cells | UnsetType = UNSET
    shard: str | UnsetType | None = UNSET
    scenario: dict[str, Any] | UnsetType = UNSET
    predictions_recomputed: dict[str, str] | UnsetType = UNSET
    shards: list[Shard] | UnsetType = UNSET


def results_of(data: Any) -> Results:
    """A results.json read back from JSON (format 1 or 2): ``msgspec.ValidationError`` when it is not
    one."""
    return msgspec.convert(data, Results)


def run_of(data: Any) -> RunRecord:
    """A ``runs[]`` entry read back from JSON (format 1 or 2): ``msgspec.ValidationError`` when it is not
    one."""
    return msgspec.convert(data, RunRecord)
