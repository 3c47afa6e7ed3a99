"""Codex CLI 0.107.0's v1 WebSocket transport (``response.append``; openai/codex #9128, removed by #13364) on
the long-lived endpoint: the prototype's own real client, unmodified (npm, pinned in
tests/clients/codex-v1). With the script in its prompt it runs a whole rollout on one socket as one
response — create, ``response.done``, ``response.append`` with every tool output, completed — and the usage
it sums over every ``response.done`` and the terminal event equals what the server billed.

Enabled as 0.107 documents it: ``supports_websockets = true`` on the provider and ``[features]
responses_websockets = true``; the provider's ``query_params`` reach ``?protocol=longlived``, or, without
them, the ``OpenAI-Beta: responses_websockets=2026-02-04`` header v1 sends selects the protocol.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from codex import codex_bin, codex_exec, environ_has_node, lab_server, provider_config, shell

pytestmark = pytest.mark.process  # every test starts a server or a process

ANSWER = "Done over v1."


def v1_config(base: str, query: bool) -> str:
    extra = 'query_params = { protocol = "longlived" }' if query else ""
    return base.replace(
        'wire_api = "responses"', f'wire_api = "responses"\nsupports_websockets = true\n{extra}'
    ) + ("[features]\nresponses_websockets = true\n")


def turn_usage(output: str) -> dict[str, Any]:
    """The usage Codex reports for the turn (``codex exec --json``: the sum of what the server sent)."""
    for line in output.splitlines():
        if line.startswith("{") and '"turn.completed"' in line:
            usage: dict[str, Any] = json.loads(line)["usage"]
            return usage
    raise AssertionError(f"no turn.completed in Codex's output:\n{output}")


@pytest.mark.parametrize("query", [True, False], ids=["query-param", "beta-header"])
async def test_codex_v1_runs_a_rollout_as_one_long_lived_response(tmp_path: Path, query: bool) -> None:
    environ_has_node()
    binary = codex_bin("codex-v1")
    async with lab_server(tmp_path) as server:
        work = tmp_path / "work"
        prompt = "\n".join(
            [
                "Make two files and read them.",
                shell("printf 'one\\n' > a.txt"),
                f"{shell('printf two > b.txt')} | {shell('printf three > c.txt')}",  # two calls, one append
                shell("cat a.txt b.txt c.txt"),
                f"!say {ANSWER}",
            ]
        )
        config = v1_config(provider_config(server, catalog=False), query)
        run = await codex_exec(binary, tmp_path / "home", work, config, prompt, "--json")
        assert run.returncode == 0, run.output
        assert run.last_message == ANSWER, run.output
        assert [(work / name).read_text() for name in ("a.txt", "b.txt", "c.txt")] == [
            "one\n",
            "two",
            "three",
        ]
        ended = server.ended()
        # One socket, one response: every tool output went in by response.append. Five turns, not four:
        # 0.107 runs an unknown model on fallback metadata, which sends parallel_tool_calls: false, so
        # the mock model makes the line's two calls one per turn.
        assert [(line["mode"], line["protocol"], line["status"], line["turns"]) for line in ended] == [
            ("longlived", "longlived", "completed", 5)
        ], ended
        usage = turn_usage(run.output)
        assert (usage["input_tokens"], usage["cached_input_tokens"], usage["output_tokens"]) == (
            ended[0]["input_tokens"],
            ended[0]["cached_tokens"],
            ended[0]["output_tokens"],
        ), (usage, ended)
