"""Running the real, unmodified Codex CLI against a server of ours: where ``make clients`` installed it,
the config a stranger writes for a custom provider, a scripted prompt, and the server's own log.

The server runs as its own process (``responses-lab serve --log-level info``) so the test reads what an
operator reads: one ``response_ended`` JSON line per response, with its ``mode`` (``http``, ``ws``,
``longlived``) and usage. Codex runs in a fresh ``CODEX_HOME`` and working directory under the test's
tmp path, pointed at 127.0.0.1 only; ``--dangerously-bypass-approvals-and-sandbox`` because the test's
directory is the sandbox (Codex's own needs bubblewrap and user namespaces, which CI may not have).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import subprocess
import time
import zlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from helpers import GUARD, MODEL, auth, clean_env, cli_command, wait_healthy

from proto.processes import free_port

CLIENTS = Path(__file__).resolve().parent.parent / ".cache" / "clients"
KEY = "sk-codex-test-0001"
RUN_TIMEOUT = 180.0  # seconds: a guard against a hung client, not a timing assertion


def client_bin(package: str, command: str, name: str) -> Path:
    """A client's installed command, or a failure that says why it is missing (never a skip)."""
    path = CLIENTS / package / "node_modules" / ".bin" / command
    if not path.exists():
        pytest.fail(
            f"{name} is not installed at {path}: `make clients` (run by `make test`) installs it from npm "
            f"with tests/clients/{package}/package.json; its output says why it failed"
        )
    return path


def codex_bin(package: str) -> Path:
    return client_bin(package, "codex", f"Codex CLI ({package})")


@dataclass
class LabServer:
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ended(self) -> list[dict[str, Any]]:
        """Every ``response_ended`` line the server logged so far (each is written before its response's
        terminal event is sent, so a client that has its answer finds the line)."""
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == "response_ended"]

    def mark(self) -> int:
        """Where the log's ``response_ended`` lines stand now: ``ended_since(mark)`` reads a case's own."""
        return len(self.ended())

    def ended_since(self, mark: int) -> list[dict[str, Any]]:
        return self.ended()[mark:]


@contextlib.asynccontextmanager
async def lab_server(tmp_path: Path, *extra: str) -> AsyncIterator[LabServer]:
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = await asyncio.create_subprocess_exec(
            *cli_command(), "serve", "--port", str(port), "--db", str(tmp_path / "lab.db"),
            "--log-level", "info", "--api-key", KEY,
            "--model-override", f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0", *extra,
            env=clean_env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", headers=auth(KEY), timeout=GUARD
            ) as http:
                await wait_healthy(http)
            yield LabServer(port, log)
        finally:
            server.terminate()
            await asyncio.wait_for(server.wait(), 30)


@contextlib.contextmanager
def lab_process(directory: Path, *extra: str) -> Iterator[LabServer]:
    """``lab_server`` for a module-scoped fixture (no event loop of its own): one server process for every
    case of a client's module, each case reading its own lines of the log (``LabServer.mark``)."""
    port = free_port()
    log = directory / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*cli_command(), "serve", "--port", str(port), "--db", str(directory / "lab.db"),
             "--log-level", "info", "--api-key", KEY,
             "--model-override", f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0", *extra],
            env=clean_env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=GUARD) as http:
                while True:
                    try:
                        http.get("/healthz")
                        break
                    except httpx.TransportError:
                        assert server.poll() is None, log.read_text()
                        assert time.monotonic() < deadline, "the server did not answer /healthz within 60 s"
                        time.sleep(0.02)
            yield LabServer(port, log)
        finally:
            server.terminate()
            server.wait(30)


def provider_config(
    server: LabServer, *, websockets: bool = False, catalog: bool = True, extra: str = ""
) -> str:
    """What a new user writes for a custom provider (Codex's docs, "Custom model providers"), plus the two
    settings that make Codex read the provider's model catalog (proto/server/model_list.py)."""
    lines = [
        f'model = "{MODEL}"',
        'model_provider = "lab"',
        "[model_providers.lab]",
        'name = "responses-lab"',
        f'base_url = "{server.base_url}"',
        'env_key = "LAB_API_KEY"',
        'wire_api = "responses"',
    ]
    if websockets:
        lines.append("supports_websockets = true")
    if catalog:
        lines.append(f'model_catalog_url = "{server.base_url}/models"')
    lines.append(extra)
    if catalog:
        lines += ["[features]", "api_key_model_discovery = true"]
    return "\n".join(lines) + "\n"


@dataclass
class CodexRun:
    returncode: int
    output: str
    last_message: str
    workdir: Path


def _prepare(home: Path, workdir: Path, config: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(config)
    return home / "last_message.txt"


async def codex_exec(
    binary: Path, home: Path, workdir: Path, config: str, prompt: str, *flags: str
) -> CodexRun:
    last = _prepare(home, workdir, config)
    env = {**clean_env(), "CODEX_HOME": str(home), "HOME": str(home), "LAB_API_KEY": KEY, "NO_COLOR": "1"}
    env.pop("OPENAI_API_KEY", None)
    code, text = await run_client(
        [
            str(binary), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--output-last-message", str(last), *flags, prompt,
        ],
        workdir,
        env,
    )  # fmt: skip
    return CodexRun(code, text, last.read_text().strip() if last.exists() else "", workdir)


async def run_client(
    argv: Sequence[str], cwd: Path, env: dict[str, str], stdin: bytes | None = None
) -> tuple[int, str]:
    """A client's command to its end (bounded by RUN_TIMEOUT): its exit status and its output (stdout and
    stderr together). ``stdin``: what it reads (else nothing)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin), RUN_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    finally:
        _end_daemons(cwd)
    return proc.returncode or 0, out.decode(errors="replace")


def _end_daemons(cwd: Path) -> None:
    """A client may leave a daemon of its own behind (Cline CLI starts its hub daemon detached, with
    ``--cwd DIR``): every process that names this run's directory as an argument ends with the run."""
    mark = str(cwd)
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.info["pid"] != os.getpid() and mark in (process.info["cmdline"] or ()):
            with contextlib.suppress(psutil.Error):
                process.terminate()


def session_file(home: Path) -> Path:
    """The rollout file Codex wrote for its session (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``;
    ``exec resume`` appends to the same file)."""
    files = sorted((home / "sessions").rglob("rollout-*.jsonl"))
    if len(files) != 1:
        pytest.fail(f"Codex wrote {len(files)} session files under {home / 'sessions'}, not one: {files}")
    return files[0]


def png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\x80\x10\x10" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def rollout_prompt(*lines: str) -> str:
    return "\n".join(["Make notes.txt, patch it, look at the picture.", *lines])


def shell(cmd: str) -> str:
    return "!call exec_command " + json.dumps({"cmd": cmd})


def apply_patch(patch: str) -> str:
    return "!call apply_patch " + json.dumps(patch)


VIEW_IMAGE = '!call view_image {"path": "pixel.png"}'
PATCH = "*** Begin Patch\n*** Update File: notes.txt\n@@\n-one\n+two\n*** End Patch\n"


def environ_has_node() -> None:
    if not any((Path(p) / "node").exists() for p in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.fail("node is not on PATH: Codex CLI's npm package starts with `node bin/codex.js`")
