"""OpenAI's Codex CLI, unmodified (npm @openai/codex, pinned in tests/clients/codex), against this server:
``codex exec`` with a stranger's provider config runs a scripted rollout that calls its
shell (``exec_command``), its freeform ``apply_patch`` and ``view_image``, really changes the files in its
working directory and ends with the scripted answer, over HTTP and over WebSocket mode. The server's own
log says which transport served each response."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from codex import (
    PATCH,
    VIEW_IMAGE,
    LabServer,
    apply_patch,
    codex_bin,
    codex_exec,
    environ_has_node,
    lab_server,
    png,
    provider_config,
    rollout_prompt,
    shell,
)

pytestmark = pytest.mark.process  # every test starts a server or a process

ANSWER = "All three tools ran."
IMAGE_TOKENS = 255  # a 4 x 4 PNG at detail auto: 170 for its one tile + 85 (sampler/media.py)


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "pixel.png").write_bytes(png(4, 4))
    return work


def _assert_rollout(
    server: LabServer, mode: str, run_output: str, returncode: int, last: str, work: Path
) -> None:
    assert returncode == 0, run_output
    assert last == ANSWER, run_output
    # the shell made it, apply_patch changed it
    assert (work / "notes.txt").read_text() == "two\n", run_output
    ended = [line for line in server.ended() if line["turns"] > 0]  # (a GA warm-up samples nothing)
    assert ended and {line["mode"] for line in ended} == {mode}, ended
    assert [line["status"] for line in ended] == ["completed"] * 4, ended  # shell, patch, image, answer
    # the reasoning item's tokens; Codex sent it back, and went on
    assert ended[0]["output_tokens"] >= 30, ended
    # view_image's output carried the picture: the turn after it costs the image's tokens more
    grew = [b["input_tokens"] - a["input_tokens"] for a, b in itertools.pairwise(ended)]
    assert grew[2] >= IMAGE_TOKENS, grew


async def _full_rollout(tmp_path: Path, websockets: bool) -> None:
    environ_has_node()
    binary = codex_bin("codex")
    async with lab_server(tmp_path) as server:
        work = _workdir(tmp_path)
        # `!reason 30`: a reasoning item (with encrypted_content: Codex asks for it) that Codex sends back
        prompt = rollout_prompt(
            "!reason 30 " + shell("printf 'one\\n' > notes.txt"),
            apply_patch(PATCH),
            VIEW_IMAGE,
            f"!say {ANSWER}",
        )
        run = await codex_exec(
            binary, tmp_path / "home", work, provider_config(server, websockets=websockets), prompt
        )
        _assert_rollout(
            server, "ws" if websockets else "http", run.output, run.returncode, run.last_message, work
        )
        if websockets:
            assert {line.get("protocol") for line in server.ended()} == {"ga"}


async def test_codex_http_runs_shell_apply_patch_and_view_image(tmp_path: Path) -> None:
    await _full_rollout(tmp_path, websockets=False)


async def test_codex_websocket_runs_shell_apply_patch_and_view_image(tmp_path: Path) -> None:
    await _full_rollout(tmp_path, websockets=True)


async def test_codex_without_the_catalog_still_runs_its_shell_and_view_image(tmp_path: Path) -> None:
    """The bare provider config (no catalog): Codex runs the model on fallback metadata and offers no
    apply_patch (docs/protocol.md, "Model objects"), but its shell and view_image work and the answer is the
    script's."""
    environ_has_node()
    binary = codex_bin("codex")
    async with lab_server(tmp_path) as server:
        work = _workdir(tmp_path)
        prompt = rollout_prompt(shell("printf 'two\\n' > notes.txt"), VIEW_IMAGE, "!say Shell and image ran.")
        run = await codex_exec(
            binary, tmp_path / "home", work, provider_config(server, catalog=False), prompt
        )
        assert run.returncode == 0, run.output
        assert run.last_message == "Shell and image ran.", run.output
        assert (work / "notes.txt").read_text() == "two\n"
        assert {line["mode"] for line in server.ended()} == {"http"}
