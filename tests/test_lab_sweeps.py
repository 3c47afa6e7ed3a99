"""Long sweeps (docs/lab.md, "Long sweeps"): every cell's record kept as it finishes, ``--resume DIR``,
``--shard I/N`` and ``bench merge``.

The unit tests build run directories by hand; the ``process`` ones run the real ``responses-lab bench``
on the smallest workload (tests/test_lab_e2e.py's, 1 session, 2 modes × 2 profiles, no calibration) and
interrupt it with a real SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_lab_e2e import TINY
from test_lab_records import made_up_run

from proto.lab.analysis.predict import Prediction
from proto.lab.bench import Eta, interruptible
from proto.lab.bench import main as bench_main
from proto.lab.config import BenchConfig
from proto.lab.report import results as results_module
from proto.lab.report.results import atomic_write
from proto.lab.run import store as store_module
from proto.lab.run.runner import CellKey
from proto.lab.run.store import (
    RECORDS,
    NotARun,
    ResumeMismatch,
    RunDir,
    Shard,
    ShardMismatch,
    ShardOverlap,
    SweepError,
    UnfinishedRun,
    assemble,
    check_shards,
    filename,
    group,
    shard_cells,
)

# ---- shards: a deterministic partition ----------------------------------------------------------

names = st.text(alphabet="abcxyz-_:[]/ 1", min_size=1, max_size=6)
grids = st.lists(st.tuples(names, names, names, names), min_size=0, max_size=40, unique=True)


@pytest.mark.slow
@given(grids, st.integers(1, 9), st.randoms(use_true_random=False))
def test_shards_are_a_partition_of_whole_groups_whatever_the_grids_order(
    cells: list[CellKey], count: int, rng: Any
) -> None:
    parts = [shard_cells(cells, Shard(i, count)) for i in range(1, count + 1)]
    assert sorted(k for part in parts for k in part) == sorted(cells)  # the union, each cell once
    owner = {group(k): i for i, part in enumerate(parts) for k in part}
    assert all(owner[group(k)] == i for i, part in enumerate(parts) for k in part)  # a group is in one
    shuffled = list(cells)
    rng.shuffle(shuffled)
    for i, part in enumerate(parts, 1):  # the same cells, in the order given
        again = shard_cells(shuffled, Shard(i, count))
        assert set(again) == set(part) and again == [k for k in shuffled if k in set(part)]
    sizes = [len({group(k) for k in part}) for part in parts]
    assert max(sizes) - min(sizes) <= 1  # groups dealt round-robin


@pytest.mark.slow
@given(st.lists(st.tuples(names, names, names, names), min_size=2, max_size=30, unique=True))
def test_record_file_names_never_collide(keys: list[CellKey]) -> None:
    files = [filename(k) for k in keys]
    assert len(set(files)) == len(files)
    assert all(re.fullmatch(r"[A-Za-z0-9.+=_-]+\.json", f) for f in files)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2"])
def test_a_shard_is_i_of_n_from_one(text: str) -> None:
    with pytest.raises(ValueError, match="--shard"):
        Shard.parse(text)
    assert str(Shard.parse(" 2 / 3 ")) == "2/3"


# ---- run directories built by hand --------------------------------------------------------------

GRID: list[CellKey] = [
    (profile, "tiny", model, mode)
    for profile in ("local", "production-like")
    for model in ("mock-1000tps", "mock-4000tps")
    for mode in ("http", "ws")
]


MACHINE = {
    "cpus": 2,
    "cpus_usable": 2,
    "memory_gib": 8.0,
    "python": "3.11",
    "platform": "p",
    "processor": "x",
}


@pytest.fixture(autouse=True)
def fixed_machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Directories built by hand describe a made-up machine (``platform.processor()`` runs ``uname``)."""
    if "process" not in request.keywords:
        monkeypatch.setattr(store_module, "machine", lambda: dict(MACHINE))


def _config(**changes: Any) -> BenchConfig:
    config = BenchConfig(
        modes=("http", "ws"), models=("mock-1000tps", "mock-4000tps"), workloads=("tiny",), predict=False
    )
    for name, value in changes.items():
        setattr(config, name, value)
    return config


def _record(run_dir: RunDir, key: CellKey, t0: float = 100.0) -> None:
    """A finished cell's record as RunDir.write_record writes it (its figures made up)."""
    span = {"name": "round 0 (first)", "cat": "client", "start": t0, "end": t0 + 0.5, "args": {}}
    record = {
        "format": 1,
        "key": list(key),
        "shard": run_dir.data["shard"],
        "run": msgspec.to_builtins(made_up_run(*key, e2e_s_p50=0.5)),
        "timeline": {
            "label": " · ".join(key[:3]),
            "mode": key[3],
            "tracks": [{"name": "s", "spans": [span]}],
        },
    }
    atomic_write(run_dir.record_path(key), json.dumps(record) + "\n")


def _shard_dir(tmp: Path, name: str, shard: Shard | None, config: BenchConfig | None = None) -> RunDir:
    run_dir = RunDir.create(tmp / name, ["--out", name], config or _config(), GRID, shard)
    (run_dir.path / RECORDS).mkdir(exist_ok=True)
    run_dir.data["floor_pings_ms"] = {"local": [0.1, 0.2, 0.3]}
    for key in run_dir.cells():
        _record(run_dir, key)
    return run_dir


def test_assemble_holds_exactly_the_shards_records_in_the_grids_order(tmp_path: Path) -> None:
    one, two = _shard_dir(tmp_path, "one", Shard(1, 2)), _shard_dir(tmp_path, "two", Shard(2, 2))
    check_shards([one, two])
    results, timelines = assemble([one, two])
    assert [(r["profile"], r["workload"], r["model"], r["mode"]) for r in results["runs"]] == GRID
    assert results["cells"] == {"done": len(GRID), "of": len(GRID), "missing": []}
    assert [s["shard"] for s in results["shards"]] == ["1/2", "2/2"]
    assert set(results["floor"]["by_shard"]) == {"1/2", "2/2"}
    # each machine's clock from its own zero
    assert min(s["start"] for t in timelines for tr in t["tracks"] for s in tr["spans"]) == 0.0
    partial, _ = assemble([one])
    assert partial["shard"] == "1/2" and partial["cells"]["done"] == len(one.cells()) < len(GRID)
    assert len(partial["cells"]["missing"]) == len(GRID) - len(one.cells())


def test_merge_refuses_the_same_shard_twice_and_a_cell_in_two(tmp_path: Path) -> None:
    one, again = _shard_dir(tmp_path, "one", Shard(1, 2)), _shard_dir(tmp_path, "again", Shard(1, 2))
    with pytest.raises(ShardOverlap, match="both"):
        check_shards([one, again])
    whole, other = _shard_dir(tmp_path, "whole", None), _shard_dir(tmp_path, "other", None)
    with pytest.raises(ShardOverlap):
        check_shards([whole, other])


def test_merge_refuses_shards_of_another_run_count_or_shard(tmp_path: Path) -> None:
    one = _shard_dir(tmp_path, "one", Shard(1, 2))
    more = _shard_dir(tmp_path, "more", Shard(2, 2), _config(sessions=2))
    with pytest.raises(ShardMismatch, match="sessions: 2 vs 4"):
        check_shards([one, more])
    with pytest.raises(ShardMismatch, match="counts"):
        check_shards([one, _shard_dir(tmp_path, "three", Shard(2, 3))])
    with pytest.raises(ShardMismatch, match="counts"):
        check_shards([one, _shard_dir(tmp_path, "whole", None)])
    stray = _shard_dir(tmp_path, "stray", Shard(2, 2))
    _record(stray, one.cells()[0])  # a cell of shard 1 in shard 2's directory
    with pytest.raises(ShardMismatch, match="not a cell of its shard 2/2"):
        check_shards([one, stray])


def test_bench_merge_says_why_it_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = _shard_dir(tmp_path, "one", Shard(1, 2))
    assert bench_main(["merge", str(one.path), str(one.path), "--out", str(tmp_path / "m")]) == 2
    assert "is in both" in capsys.readouterr().err
    assert bench_main(["merge", str(tmp_path / "nothing"), "--out", str(tmp_path / "m")]) == 2
    assert "holds no run" in capsys.readouterr().err
    assert not (tmp_path / "m" / "results.json").exists()


def test_resume_refuses_another_configuration_shard_machine_or_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = _shard_dir(tmp_path, "run", Shard(1, 2))
    with pytest.raises(NotARun):
        RunDir.open(tmp_path / "empty")
    with pytest.raises(ResumeMismatch, match=r"tool_time_scale: 0\.1 vs 1\.0"):
        RunDir.open(run_dir.path).resume(_config(tool_time_scale=0.1), Shard(1, 2))
    with pytest.raises(ResumeMismatch, match="shard: 1/2 vs 2/2"):
        RunDir.open(run_dir.path).resume(_config(), Shard(2, 2))
    RunDir.open(run_dir.path).resume(_config(api_key="another"), Shard(1, 2))  # the key changes nothing
    elsewhere = dict(MACHINE, cpus=64, cpus_usable=64)
    monkeypatch.setattr(store_module, "machine", lambda: elsewhere)
    with pytest.raises(ResumeMismatch, match=r"another machine \(cpus: 2 vs 64"):
        RunDir.open(run_dir.path).resume(_config(), Shard(1, 2))
    # a fresh run over an unfinished one is refused; over a finished one it starts again
    with pytest.raises(UnfinishedRun, match="--resume"):
        RunDir.create(run_dir.path, [], _config(), GRID, None)
    run_dir.data["complete"] = True
    run_dir.save()
    fresh = RunDir.create(run_dir.path, [], _config(), GRID, None)
    assert fresh.done() == set()


def test_the_manifest_keeps_no_api_key_or_password(tmp_path: Path) -> None:
    db = "postgresql://lab:s3cret@db.internal:5432/lab"
    argv = ["--api-key", "sk-1", "--api-key=sk-2", "--quick", "--db", db]
    run_dir = RunDir.create(tmp_path / "r", argv, _config(db=db), GRID, None)
    text = (run_dir.path / "run.json").read_text()
    assert "sk-1" not in text and "sk-2" not in text and "s3cret" not in text
    assert run_dir.data["argv"] == ["--quick", "--db", "postgresql://lab:***@db.internal:5432/lab"]


def test_a_write_that_fails_midway_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cell.json"
    atomic_write(path, '{"done": 1}\n')

    def crash(fd: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(results_module.os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write(path, '{"done": 2, "half": ')
    assert path.read_text() == '{"done": 1}\n'
    assert [p.name for p in tmp_path.glob("*.json")] == ["cell.json"]


def test_a_record_that_is_not_a_cell_record_is_refused_with_the_field_at_fault(tmp_path: Path) -> None:
    run_dir = _shard_dir(tmp_path, "one", None)
    path = run_dir.record_path(run_dir.cells()[0])
    record = json.loads(path.read_text(encoding="utf-8"))
    del record["run"]["usage"]
    atomic_write(path, json.dumps(record) + "\n")
    with pytest.raises(SweepError, match=r"is not a cell record .*`usage` - at `\$\.run`"):
        run_dir.records()


def test_the_eta_is_the_fast_models_walls_scaled_by_the_pace_so_far() -> None:
    a, b, c = GRID[:3]
    walls = {a: (Prediction(), 2.0), b: (Prediction(), 4.0), c: (Prediction(), 6.0)}
    eta = Eta(total=5, done=2, predictions=walls)
    assert eta.remaining_s() == 12.0  # before any cell: the predictions as they are
    eta.last -= 4.0  # the first cell took 4 s, twice its prediction
    line = eta.finished(a)
    assert line.startswith("cell 3/5 done · local · tiny · mock-1000tps · http · 4.0 s · ETA ")
    remaining = eta.remaining_s()
    assert remaining is not None and abs(remaining - 2 * (4.0 + 6.0)) < 0.1
    paced = Eta(total=3, done=0, predictions={})  # no calibration: the mean pace
    assert paced.remaining_s() is None and "ETA –" not in paced.finished(a)


# ---- the real command ----------------------------------------------------------------------------


# TINY with 0.7 s of tool time a call turn (written times: the file says no "tool_times"): a group then
# sleeps ~4 s of its own (2 modes × 3 call turns), so the second group is in flight for seconds after the
# first group's records appear, however slowly the machine runs the rest, and the interrupted run's SIGINT
# lands inside it.
SWEEP = dict(TINY, turns=[dict(t, client_tool_time_s=0.7) if "calls" in t else t for t in TINY["turns"]])


def _flags(root: Path) -> list[str]:
    workload = root / "tiny.json"
    workload.write_text(json.dumps(SWEEP), encoding="utf-8")
    return [
        "--workload",
        str(workload),
        "--modes",
        "http,ws",
        "--model",
        "mock-4000tps",
        "--profile",
        "local,production-like",
        "--sessions",
        "1",
        "--rollouts",
        "1",
        "--pings",
        "20",
        "--no-predict",
        "--no-plots",
    ]


def _records(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / RECORDS).glob("*.json"))}


def _cells(results_json: Path) -> list[tuple[str, str, str, str]]:
    runs = json.loads(results_json.read_text(encoding="utf-8"))["runs"]
    return [(r["profile"], r["workload"], r["model"], r["mode"]) for r in runs]


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep run once, uninterrupted and unsharded."""
    root = tmp_path_factory.mktemp("sweep")
    assert bench_main([*_flags(root), "--out", str(root / "whole")]) == 0
    return root / "whole"


@pytest.mark.process
def test_an_interrupted_sweep_resumes_to_the_uninterrupted_cells(whole: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    log, err = tmp_path / "stdout", tmp_path / "stderr"
    with log.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proto", "bench", *_flags(tmp_path), "--out", str(out)],
            stdout=stdout,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 120
            while not _records(out) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _records(out), "no cell record appeared"
            assert proc.poll() is None, "the run ended before it could be interrupted"
            os.kill(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 130, (log.read_text(), err.read_text())
    said = err.read_text()
    assert f"responses-lab bench --resume {out}" in said and "interrupted" in said
    printed = log.read_text()
    assert re.search(r"cell 1/4 done · local · tiny · mock-4000tps · http · [\d.]+ s · ETA \d", printed)
    kept = _records(out)
    partial = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert 1 <= partial["cells"]["done"] == len(partial["runs"]) == len(kept) < 4
    assert len(partial["cells"]["missing"]) == 4 - len(kept)

    # A fresh run into it is refused: it holds an unfinished run.
    assert bench_main([*_flags(tmp_path), "--out", str(out)]) == 2
    # Another configuration is refused too.
    assert bench_main(["--resume", str(out), *_flags(tmp_path), "--sessions", "2"]) == 2
    assert bench_main(["--resume", str(out)]) == 0

    after = _records(out)
    assert set(after) == set(_records(whole))  # the uninterrupted run's cells
    assert {name: after[name] for name in kept} == kept  # the finished ones untouched, byte for byte
    assert _cells(out / "results.json") == _cells(whole / "results.json")
    manifest = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert manifest["complete"] and len(manifest["attempts"]) == 2
    trace = json.loads((out / "trace.json").read_text(encoding="utf-8"))
    assert sum(e["name"] == "process_name" for e in trace["traceEvents"]) == 4


@pytest.mark.process
def test_two_shards_merged_hold_exactly_their_cells_and_the_whole_runs(whole: Path, tmp_path: Path) -> None:
    one, two, merged = tmp_path / "one", tmp_path / "two", tmp_path / "merged"
    assert bench_main([*_flags(tmp_path), "--shard", "1/2", "--out", str(one)]) == 0
    assert bench_main([*_flags(tmp_path), "--shard", "2/2", "--out", str(two)]) == 0
    assert bench_main([*_flags(tmp_path), "--shard", "3/3", "--out", str(tmp_path / "x")]) == 2  # no cells
    # one profile each: the modes of a (profile, workload, model) group stay on one machine
    assert {c[0] for c in _cells(one / "results.json")} == {"local"}
    assert {c[0] for c in _cells(two / "results.json")} == {"production-like"}
    assert bench_main(["merge", str(two), str(one), "--out", str(merged), "--no-plots"]) == 0
    assert _cells(merged / "results.json") == _cells(whole / "results.json")
    results = json.loads((merged / "results.json").read_text(encoding="utf-8"))
    records = [json.loads(b)["run"] for out in (one, two) for b in _records(out).values()]
    key = lambda r: (r["profile"], r["mode"])  # noqa: E731
    # exactly their records, plus the paired gains assembly computes across a group's records
    assert all("gains" in r for r in results["runs"])
    derived = [{k: v for k, v in r.items() if k != "gains"} for r in results["runs"]]
    assert sorted(derived, key=key) == sorted(records, key=key)
    assert results["cells"]["missing"] == [] and [s["shard"] for s in results["shards"]] == ["1/2", "2/2"]
    assert set(results["floor"]["by_profile"]) == {"local", "production-like"}
    trace = json.loads((merged / "trace.json").read_text(encoding="utf-8"))
    assert sum(e["name"] == "process_name" for e in trace["traceEvents"]) == 4
    assert (merged / "results.csv").read_text().count("\n") == 5
    # a shard with a whole run (of other flags: its workload file is another), a shard twice
    assert bench_main(["merge", str(one), str(whole), "--out", str(tmp_path / "bad")]) == 2
    assert bench_main(["merge", str(one), str(one), "--out", str(tmp_path / "bad")]) == 2


def test_a_run_with_cells_calibrates_over_its_own_workloads_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's largest prompt + 10 % (docs/lab.md, "The fast model"), as before its cells were kept;
    ``--predict`` alone 128 k."""
    from rich.console import Console

    from proto.lab import bench
    from proto.lab.analysis.predict import Calibration
    from proto.lab.run import runner

    ranges: list[int] = []

    async def calibrate(modes: Any, rounds: int, h_max: int, *rest: Any) -> Calibration:
        ranges.append(h_max)
        return Calibration({}, [], 0.0, h_max)

    monkeypatch.setattr(runner, "calibrate", calibrate)
    config = BenchConfig(workloads=("long-context",), turns=4)
    quiet = Console(quiet=True)
    bench._calibrate(config, quiet, for_cells=True)
    bench._calibrate(config, quiet, for_cells=False)
    assert ranges == [runner.h_max_of(runner.replays_of(config)), 128_000]
    assert ranges[0] != 128_000


@pytest.mark.parametrize("swallowed", [False, True])
def test_a_sigint_stops_the_run_even_where_its_cancellation_is_swallowed(swallowed: bool) -> None:
    """The bench's SIGINT handler cancels the run's task and flags the run; where something on the way
    swallows the cancellation (Python 3.11's wait_for returning a result that completed as the cancel
    came), the next turn's check stops it. Either way the run ends in KeyboardInterrupt, never at its end."""
    turns: list[int] = []

    async def sweep(check: Callable[[], None]) -> None:
        for turn in range(200):
            try:
                await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                if not swallowed:
                    raise
            check()  # the next turn
            turns.append(turn)
            if turn == 3:
                os.kill(os.getpid(), signal.SIGINT)

    with interruptible() as interrupted, pytest.raises(KeyboardInterrupt):
        interrupted.run(sweep(interrupted))
    assert 4 <= len(turns) < 10  # stopped within a turn or two of the signal
