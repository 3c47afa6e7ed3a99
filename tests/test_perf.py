"""``responses-lab perf`` is a command: its help and every subcommand's, a short real ``perf turn`` (the
figure printed beside its floor, the WebSocket ping on the same connection), a short ``perf cpu`` (the
HTTP rollout on proto.client's HttpClient) and ``perf profile`` over a hand-written py-spy file; and the
messages it sends, built with proto.client.messages, as the bytes they have always been on the wire. The
suite's figures themselves are benchmarks, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proto.cli import main as cli_main
from proto.perf.workload import MODEL, TOOLS, rollout_body, say_tokens, stream_body

SUBCOMMANDS = ("turn", "cpu", "stream", "capacity", "rss", "deflate", "topology", "engine", "profile")


def perf(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "proto", "perf", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.process
def test_perf_help_names_every_subcommand_and_the_before_after_flags() -> None:
    text = perf("--help")
    for name in (*SUBCOMMANDS, "--compare", "--server-path"):
        assert name in text


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["perf", name, "--help"])
    assert exited.value.code == 0
    assert f"responses-lab perf {name}" in capsys.readouterr().out


@pytest.mark.process
def test_perf_turn_prints_the_overhead_beside_the_ping_floor() -> None:
    lines = perf("turn", "--contexts", "1000", "--turns", "5", "--append", "100").splitlines()
    header = next(line for line in lines if line.startswith("server"))
    assert "overhead" in header and "ping" in header and "÷ping" in header
    row = next(line for line in lines if line.startswith("this")).split()
    assert row[1] == "1000"  # the context
    overhead, ping = float(row[2].removesuffix("ms")), float(row[4])
    assert overhead > 0 and ping > 0
    assert row[-1].endswith("ms")  # the server's CPU per turn


@pytest.mark.process
def test_perf_cpu_prints_long_lived_beside_http_with_the_full_history() -> None:
    lines = perf("cpu", "--context", "1000", "--turns", "2", "--append", "50").splitlines()
    row = next(line for line in lines if line.startswith("this")).split()
    assert row[1].endswith("ms") and row[2].endswith("ms") and row[3].endswith("%")
    assert float(row[1].removesuffix("ms")) > 0 and float(row[2].removesuffix("ms")) > 0


def test_perf_engine_prints_the_step_loops_cpu_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    """A short real run: 8 sequences on one mock GPU on the real clock (in this process, no server)."""
    assert cli_main(["perf", "engine", "--sequences", "8", "--seconds", "0.3", "--prompt", "20"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "sequences" in line).split()
    assert row[:4] == ["8", "sequences", "8", "running"]
    loop_cpu = float(row[row.index("loop") + 2])
    process_cpu = float(row[row.index("process") + 2])
    assert 0 < loop_cpu < process_cpu  # the process pays the loop and the consumers' wake-ups
    assert row[-1].endswith("%")


def test_the_messages_the_suite_sends_keep_their_bytes_on_the_wire() -> None:
    """The counting clients and the raw connections send ``json.dumps`` of these: the suite's workload, the
    same from one checkout to the next (docs/operations.md, "`responses-lab perf`")."""
    assert (
        json.dumps(say_tokens(7))
        == f'{{"type": "response.create", "model": "{MODEL}", "input": "stream\\n!tokens 7 !say go"}}'
    )
    assert list(stream_body(3, "capacity", "ok")) == ["model", "input"]
    body = rollout_body("!call grep {}", 3, salt=2)
    assert list(body) == ["model", "input", "tools"] and body["tools"] == TOOLS
    assert body["input"] == [
        {"role": "user", "content": "!call grep {}"},
        {"role": "user", "content": " and run test"},
    ]


def test_perf_profile_sums_self_and_inclusive_samples_leaving_the_idle_wait_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tmp_path / "spy.txt"
    raw.write_text(
        "run (a/app.py:1);encode (b/codec.py:9) 3\n"
        "run (a/app.py:1);send (b/ws.py:4) 1\n"
        "run (a/app.py:1);select (selectors.py:468) 100\n"
    )
    assert cli_main(["perf", "profile", str(raw), "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 busy samples")
    assert " 75.0%  encode (codec.py)" in out and "100.0%  run (app.py)" in out
    assert "select" not in out
