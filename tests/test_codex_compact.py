"""Codex CLI 0.171's remote compaction against this server (docs/protocol.md, "Compaction").

Codex compacts remotely only for a provider it takes for OpenAI's (``codex-rs/model-provider/src/
provider.rs``, ``ConfiguredModelProvider::capabilities``), so this test points the built-in ``openai``
provider here with the documented ``openai_base_url`` key (a custom provider compacts locally). Its
auto-compaction limit (``model_auto_compact_token_limit``) is set below what the scripted rollout reaches,
so Codex compacts mid-rollout the way 0.171 does it, remote compaction v2: a ``/responses`` request (over
GA WebSocket mode, the built-in provider's transport) whose input ends with a ``compaction_trigger`` item,
answered with exactly one ``compaction`` item. Then Codex goes on from the compacted window: the script
continues where it was (each step runs once, in order) and the rollout ends with its answer.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from codex import KEY, codex_bin, codex_exec, environ_has_node, lab_server, shell
from helpers import MODEL

pytestmark = pytest.mark.process  # starts a server and Codex

STEPS = 6
LIMIT = 10_500  # tokens: Codex's own prompt is about 8 200; each step adds about 650


def config(base_url: str) -> str:
    return "\n".join(
        [
            f'model = "{MODEL}"',
            'model_provider = "openai"',
            f'openai_base_url = "{base_url}"',
            f"model_auto_compact_token_limit = {LIMIT}",
            f'model_catalog_url = "{base_url}/models"',
            "[features]",
            "api_key_model_discovery = true",
        ]
    )


def rollout_entries(home: Path) -> list[dict[str, object]]:
    files = sorted(home.glob("sessions/*/*/*/rollout-*.jsonl"))
    assert files, f"Codex wrote no session rollout under {home}"
    return [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]


async def test_codex_remote_compaction_goes_on_from_the_compacted_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ_has_node()
    binary = codex_bin("codex")
    monkeypatch.setenv("CODEX_API_KEY", KEY)  # the built-in provider's key (codex exec reads it)
    steps = [f"!tokens 600 {shell(f'echo {i} >> steps.txt')}" for i in range(STEPS)]
    prompt = "\n".join(["Run the steps.", *steps, "!say finished"])
    async with lab_server(tmp_path) as server:
        run = await codex_exec(binary, tmp_path / "home", tmp_path / "work", config(server.base_url), prompt)
        ended = [line for line in server.ended() if line["turns"] > 0]
    assert run.returncode == 0, run.output[-3000:]
    assert run.last_message == "finished", run.output[-3000:]
    # every step ran once, in order: the compacted window carried the script's position
    assert (tmp_path / "work" / "steps.txt").read_text().split() == [str(i) for i in range(STEPS)]
    # Codex compacted remotely, with this server's compaction item (rlc2:, docs/protocol.md "Compaction")
    entries = rollout_entries(tmp_path / "home")
    compacted = [e for e in entries if e.get("type") == "compacted"]
    assert compacted, run.output[-3000:]
    items = [
        item
        for entry in compacted
        for item in entry["payload"]["replacement_history"]  # type: ignore[index]
        if item.get("type") == "compaction"
    ]
    assert items and all(str(i.get("encrypted_content", "")).startswith("rlc2:") for i in items), items
    # over GA WebSocket mode; the request after a compaction costs fewer input tokens than the one before
    assert {line["mode"] for line in ended} == {"ws"}, ended
    inputs = [line["input_tokens"] for line in ended]
    assert any(later < earlier for earlier, later in itertools.pairwise(inputs)), inputs
