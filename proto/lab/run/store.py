"""A long sweep on disk (docs/lab.md, "Long sweeps"): a run's directory holds its manifest and one record per
finished cell, so a crash or a Ctrl-C loses only the group in flight (a group's modes run interleaved and
finish together); ``--resume DIR`` runs the cells that are not there yet, ``--shard I/N`` runs a
deterministic part of them, and ``bench merge`` writes one results.json from several directories.

``DIR/run.json`` (the manifest): the command line (without ``--api-key``), the whole configuration, the
shard, the grid of cells (the whole run's, every shard's), the machine, the fast model's calibration and
curves once measured, the ping floor of each profile once measured, and each attempt (start, wall).
``DIR/cells/<cell>.json`` (a record): the cell's key, its ``runs[]`` entry (predictions included) and its
spans for ``trace.json``. Both are written whole or not at all (``report/results.py``, ``atomic_write``);
a record is written once and never again.

**A shard** is every ``I``-th (profile, workload, model) group of the grid, counting from 1, the groups
sorted by name: all modes of a group run in one shard, so each "vs http" ratio is measured on one machine.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from proto.lab.config import BenchConfig
from proto.lab.records import CellRecord, Provenance
from proto.lab.report.results import (
    FORMAT as RESULTS_FORMAT,
)
from proto.lab.report.results import (
    add_gains,
    apply_prediction,
    atomic_write,
    clean,
    config_json,
    design_json,
    dumps,
    floor_json,
    floors_json,
    machine,
    profiles_json,
    run_record,
    utc,
)
from proto.lab.report.timeline import cell_timeline
from proto.lab.run.runner import CellKey, CellResult

FORMAT = 1
MANIFEST = "run.json"
RECORDS = "cells"


class SweepError(Exception):
    """A run directory, or a set of them, that cannot be resumed or merged as asked; the message says why
    and what to do."""


class NotARun(SweepError):
    """The directory holds no run's manifest (or one of another format)."""


class UnfinishedRun(SweepError):
    """A fresh run would overwrite a directory whose run has cells left: resume it or choose another."""


class ResumeMismatch(SweepError):
    """``--resume DIR`` with a configuration that differs from DIR's: its cells would not be comparable."""


class ShardMismatch(SweepError):
    """Directories that are not shards of one run (another configuration, grid or shard count)."""


class ShardOverlap(SweepError):
    """Directories that hold the same shard or the same cell twice."""


# ---- cells and shards ---------------------------------------------------------------------------


def label(key: CellKey) -> str:
    return " · ".join(key)


def group(key: CellKey) -> tuple[str, str, str]:
    """(profile, workload, model): the cells compared with each other, mode by mode."""
    return key[0], key[1], key[2]


def filename(key: CellKey) -> str:
    """A record's file name: the key made safe for a file system, and never two keys one name (the
    sanitised parts are joined with ``__``; a part's own ``__`` or unsafe characters become ``_``, and a
    key that changed is told apart by a hash)."""
    safe = [re.sub(r"[^A-Za-z0-9.+=-]+", "_", part) for part in key]
    text = "__".join(safe)
    if safe != list(key):
        text += "__" + format(_fnv1a("\0".join(key)), "08x")
    return text + ".json"


def _fnv1a(text: str) -> int:
    """FNV-1a, 32 bits: the same on every machine and Python (``hash()`` of a str is salted per process)."""
    h = 0x811C9DC5
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


@dataclass(frozen=True)
class Shard:
    """``--shard I/N``: the I-th of N parts, 1 ≤ I ≤ N (as Jest's and Playwright's ``--shard``)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise ValueError(f"--shard takes I/N (e.g. 1/4), not {text!r}")
        index, count = int(match[1]), int(match[2])
        if not 1 <= index <= count:
            raise ValueError(f"--shard {text}: I must be 1 … N")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_cells(cells: Sequence[CellKey], shard: Shard | None) -> list[CellKey]:
    """The cells of ``shard``, in the grid's order: every ``count``-th (profile, workload, model) group of
    the grid's groups sorted by name, from the ``index``-th. Over I = 1 … N the shards are disjoint and
    their union is the grid; the assignment depends on the grid alone (not on its order, the machine or
    the time)."""
    if shard is None:
        return list(cells)
    groups = sorted({group(k) for k in cells})
    mine = {g for i, g in enumerate(groups) if i % shard.count == shard.index - 1}
    return [k for k in cells if group(k) in mine]


# ---- the directory ------------------------------------------------------------------------------


def settings(config: BenchConfig) -> dict[str, Any]:
    """What makes two runs' cells comparable: the whole configuration, but the API key (never written)."""
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
    out.pop("api_key", None)
    for name in ("db", "url"):
        if isinstance(out.get(name), str):
            out[name] = _hide_password(str(out[name]))
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _hide_password(text: str) -> str:
    """``postgresql://user:secret@host/db`` → ``postgresql://user:***@host/db``."""
    return re.sub(r"(://[^/:@\s]+):[^@/\s]*@", r"\1:***@", text)


def without(argv: Sequence[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (``--flag V`` or ``--flag=V``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--api-key``'s value or a URL's password: a manifest is shared, keys are not."""
    return [_hide_password(arg) for arg in without(argv, "--api-key")]


@dataclass
class RunDir:
    """One run's directory: its manifest (``data``) and its records."""

    path: Path
    data: dict[str, Any]
    started: float = field(default_factory=time.time)  # this attempt's
    t0: float = field(default_factory=time.perf_counter)

    # -- opening

    @classmethod
    def create(
        cls,
        path: Path,
        argv: Sequence[str],
        config: BenchConfig,
        cells: Sequence[CellKey],
        shard: Shard | None,
        where: Provenance | None = None,
    ) -> RunDir:
        """A fresh run in ``path``. A finished run there is replaced (``--out`` overwrites, as it always
        has); an unfinished one is refused (:class:`UnfinishedRun`): it is hours of cells."""
        if (path / MANIFEST).exists():
            try:
                old = cls.open(path)
            except NotARun:
                old = None
            if old is not None and not old.data.get("complete"):
                done, mine = len(old.done()), len(old.cells())
                raise UnfinishedRun(
                    f"{path} holds an unfinished run ({done} of {mine} cells): resume it with "
                    f"`responses-lab bench --resume {path}`, or remove it, or choose another --out"
                )
        records = path / RECORDS
        if records.is_dir():
            for stale in records.iterdir():
                stale.unlink()
        path.mkdir(parents=True, exist_ok=True)
        run = cls(
            path,
            {
                "format": FORMAT,
                "argv": redacted(argv),
                "command": "responses-lab bench " + shlex.join(redacted(argv)),
                "settings": settings(config),
                "config": config_json(config),
                "profiles": profiles_json(config),
                "shard": None if shard is None else str(shard),
                "grid": [list(k) for k in cells],
                "machine": machine(),
                "provenance": None if where is None else msgspec.to_builtins(where),
                "design": design_json(config),
                "started_utc": utc(time.time()),
                "attempts": [],
                "calibration": None,
                "sweep": [],
                "scenario": None,
                "floor_pings_ms": {},
                "complete": False,
            },
        )
        run.begin(where)
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        manifest = path / MANIFEST
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise NotARun(f"{path} holds no run (no {MANIFEST}): nothing to resume or merge") from None
        except json.JSONDecodeError as exc:
            raise NotARun(f"{manifest} is not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise NotARun(f"{manifest}: not a run manifest of format {FORMAT}")
        return cls(path, data)

    def resume(self, config: BenchConfig, shard: Shard | None, where: Provenance | None = None) -> None:
        """Check that ``config`` and ``shard`` are this run's (:class:`ResumeMismatch` otherwise) and start
        an attempt. The floor and the calibration of the run are kept: a resumed run's cells are composed
        and compared against the same ones as its first cells."""
        diff = differences(settings(config), self.data["settings"])
        if self.data["shard"] != (None if shard is None else str(shard)):
            diff.append(f"shard: {self.data['shard']} vs {shard}")
        if diff:
            raise ResumeMismatch(
                f"{self.path} was run with another configuration, so its cells would not be comparable "
                f"({'; '.join(diff)}): resume it with `responses-lab bench --resume {self.path}` alone (its "
                "own flags), or start a new run with --out"
            )
        ours, here = self.data["machine"], machine()
        moved = [
            k for k in ("cpus", "cpus_usable", "memory_gib", "python", "processor") if ours[k] != here[k]
        ]
        if moved:
            what = ", ".join(f"{k}: {ours[k]} vs {here[k]}" for k in moved)
            raise ResumeMismatch(
                f"{self.path} was measured on another machine ({what}), and its floor and calibration are "
                "that machine's: resume it there, or start the run again here with --out"
            )
        self.begin(where)

    def begin(self, where: Provenance | None = None) -> None:
        """An attempt starts: its start, and where it ran (``where``: the commit may differ between
        attempts; the bench command gives it, a test's directory may not)."""
        self.started, self.t0 = time.time(), time.perf_counter()
        attempt: dict[str, Any] = {"started_utc": utc(self.started), "wall_s": 0.0}
        if where is not None:
            attempt["provenance"] = msgspec.to_builtins(where)
        self.data["attempts"].append(attempt)
        self.save()

    # -- the manifest

    def save(self) -> None:
        self.data["attempts"][-1]["wall_s"] = time.perf_counter() - self.t0
        atomic_write(self.path / MANIFEST, dumps(self.data))

    def shard(self) -> Shard | None:
        text = self.data["shard"]
        return None if text is None else Shard.parse(text)

    def grid(self) -> list[CellKey]:
        return [(a, b, c, d) for a, b, c, d in self.data["grid"]]

    def cells(self) -> list[CellKey]:
        """This directory's part of the grid."""
        return shard_cells(self.grid(), self.shard())

    def wall_s(self) -> float:
        return float(sum(a["wall_s"] for a in self.data["attempts"]))

    # -- records

    def record_path(self, key: CellKey) -> Path:
        return self.path / RECORDS / filename(key)

    def write_record(self, cell: CellResult, prediction: Any) -> Path:
        """The finished cell's record, whole or not at all; never rewritten."""
        key: CellKey = (cell.profile, cell.workload, cell.model, cell.mode)
        run = run_record(cell)
        if prediction is not None:
            apply_prediction(run, prediction)
        path = self.record_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = CellRecord(FORMAT, key, self.data["shard"], run, cell_timeline(cell))
        text = json.dumps(clean(msgspec.to_builtins(record)), separators=(",", ":"), allow_nan=False)
        atomic_write(path, text + "\n")
        self.save()
        return path

    def records(self) -> dict[CellKey, CellRecord]:
        """The finished cells, by key (temporary files of an interrupted write are not records)."""
        out: dict[CellKey, CellRecord] = {}
        folder = self.path / RECORDS
        if not folder.is_dir():
            return out
        for path in sorted(folder.glob("*.json")):
            try:
                record = msgspec.json.decode(path.read_bytes(), type=CellRecord)
            except msgspec.DecodeError as exc:
                raise SweepError(f"{path} is not a cell record ({exc}): move it away and resume") from None
            out[record.key] = record
        return out

    def done(self) -> set[CellKey]:
        return set(self.records())


# ---- results.json from records -----------------------------------------------------------------


def assemble(
    dirs: Sequence[RunDir], command: str | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """results.json and the cells' timelines from one run's directory, or several shards' (checked by
    :func:`check_shards`): the records in the grid's order, the floor over every directory's pings, the
    calibration, curves and scenario of the first shard (each directory's in ``shards``)."""
    first = dirs[0]
    grid = first.grid()
    by_dir = [d.records() for d in dirs]  # each record file read and parsed once
    records: dict[CellKey, CellRecord] = {}
    for found in by_dir:
        records.update(found)
    keys = [k for k in grid if k in records]
    mine = {k for d in dirs for k in d.cells()}
    pings: dict[str, list[float]] = {}
    for d in dirs:
        for profile, xs in d.data["floor_pings_ms"].items():
            pings.setdefault(profile, []).extend(xs)
    floor = floor_json(pings)
    runs = [records[k].run for k in keys]
    add_gains(runs, first.data["settings"].get("seed", 0))
    results: dict[str, Any] = {
        "format": RESULTS_FORMAT,
        "floor": floor,
        "floors": floors_json(runs),
        "runs": msgspec.to_builtins(runs),
        "calibration": first.data["calibration"],
        "sweep": first.data["sweep"],
        "profiles": first.data["profiles"],
        "config": first.data["config"],
        "command": command or first.data["command"],
        "machine": first.data["machine"],
        "provenance": first.data.get("provenance"),
        "design": first.data.get("design"),
        "started_utc": min(d.data["started_utc"] for d in dirs),
        "wall_s": max(d.wall_s() for d in dirs),
        "cells": {
            "done": len(keys),
            "of": len(grid),
            "missing": [label(k) for k in grid if k not in records],
        },
    }
    if first.data["shard"] is not None and len(dirs) == 1:
        results["shard"] = first.data["shard"]
        results["cells"]["of_shard"] = len(mine)
    if first.data.get("scenario") is not None:
        results["scenario"] = first.data["scenario"]
    if len(dirs) > 1:
        results["floor"]["by_shard"] = {
            str(d.data["shard"]): floor_json(d.data["floor_pings_ms"])["ws_ping_rtt_ms_p50"] for d in dirs
        }
        results["shards"] = [
            {
                "shard": d.data["shard"],
                "dir": str(d.path),
                "command": d.data["command"],
                "machine": d.data["machine"],
                "started_utc": d.data["started_utc"],
                "wall_s": d.wall_s(),
                "cells": len(found),
                "calibration": d.data["calibration"],
            }
            for d, found in zip(dirs, by_dir, strict=True)
        ]
    timelines = [records[k].timeline for k in keys]
    if len(dirs) > 1:  # each machine's clock has its own zero: each shard's spans from its own first one
        timelines = _rebased(dirs, by_dir, records, keys)
    return results, timelines


def _rebased(
    dirs: Sequence[RunDir],
    by_dir: Sequence[dict[CellKey, CellRecord]],
    records: dict[CellKey, CellRecord],
    keys: Sequence[CellKey],
) -> list[dict[str, Any]]:
    from proto.lab.report.timeline import origin

    zero: dict[str | None, float] = {}
    for d, found in zip(dirs, by_dir, strict=True):
        zero[d.data["shard"]] = origin([r.timeline for r in found.values()])
    out = []
    for k in keys:
        t = records[k].timeline
        z = zero[records[k].shard]
        tracks = [
            {
                "name": tr["name"],
                "spans": [dict(s, start=s["start"] - z, end=s["end"] - z) for s in tr["spans"]],
            }
            for tr in t["tracks"]
        ]
        out.append(dict(t, tracks=tracks))
    return out


def check_shards(dirs: Sequence[RunDir]) -> None:
    """Refuse directories that are not distinct shards of one run: another configuration or grid
    (:class:`ShardMismatch`), the same shard twice or a cell in two (:class:`ShardOverlap`), a record
    that is not of its directory's shard."""
    first = dirs[0]
    for d in dirs[1:]:
        diff = differences(d.data["settings"], first.data["settings"])
        if d.data["grid"] != first.data["grid"]:
            diff.append("grid: the cells differ")
        if diff:
            raise ShardMismatch(f"{d.path} and {first.path} are not shards of one run: {'; '.join(diff)}")
    shards = [d.shard() for d in dirs]
    counts = {s.count if s else None for s in shards}
    if len(counts) > 1:
        raise ShardMismatch(
            "shards of different counts (or a whole run with shards): "
            + ", ".join(f"{d.path}: {d.data['shard'] or 'whole'}" for d in dirs)
        )
    seen: dict[CellKey, Path] = {}
    for d in dirs:
        mine = set(d.cells())
        for key in d.records():
            if key not in mine:
                raise ShardMismatch(
                    f"{d.path} holds {label(key)}, which is not a cell of its shard {d.shard()}"
                )
            if key in seen:
                raise ShardOverlap(f"{label(key)} is in both {seen[key]} and {d.path}: merge each shard once")
            seen[key] = d.path
    indexes = [s.index if s is not None else 0 for s in shards]
    if len(set(indexes)) != len(indexes):
        raise ShardOverlap("the same shard twice: " + ", ".join(f"{d.path}: {d.data['shard']}" for d in dirs))


def sorted_shards(dirs: Sequence[RunDir]) -> list[RunDir]:
    """By shard index: the first shard's calibration and curves are the merged file's."""

    def index(d: RunDir) -> int:
        shard = d.shard()
        return 0 if shard is None else shard.index

    return sorted(dirs, key=lambda d: (index(d), str(d.path)))
