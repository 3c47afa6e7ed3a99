"""LlamaIndex's ``OpenAIResponses`` (llama-index-llms-openai 0.8.3, pinned in
tests/clients/llamaindex/requirements.txt), unmodified, against ``responses-lab serve`` over HTTP (it has no
WebSocket transport): a ``FunctionAgent`` tool loop continued by a second user turn, a streamed run,
structured output (``astructured_predict``) and ``track_previous_responses`` (the second turn chained by
``previous_response_id``). It needs openai < 3, so it runs in its own environment (``make clients``) as one
process for the module, fed one case a line (tests/clients/llamaindex/rollout.py). The server's log says
which transport served each response. Configuration, as a user writes it: docs/clients.md."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from codex import CLIENTS, KEY, LabServer, lab_process
from helpers import MODEL, clean_env

pytestmark = pytest.mark.process  # every test starts a server and a client

ROLLOUT = Path(__file__).resolve().parent / "clients" / "llamaindex" / "rollout.py"
PYTHON = CLIENTS / "llamaindex" / "venv" / "bin" / "python"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with lab_process(tmp_path_factory.mktemp("llamaindex")) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv: LabServer) -> Iterator[subprocess.Popen[str]]:
    if not PYTHON.exists():
        pytest.fail(
            f"LlamaIndex's environment is missing at {PYTHON}: `make clients` (run by `make test`) makes it "
            "from tests/clients/llamaindex/requirements.txt; its output says why it failed"
        )
    env = {**clean_env(), "LAB_BASE_URL": srv.base_url, "LAB_API_KEY": KEY, "LAB_MODEL": MODEL}
    proc = subprocess.Popen(
        [str(PYTHON), str(ROLLOUT)], env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        yield proc
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()  # end of input: the client's loop ends
        proc.wait(30)
        proc.stdout.close()


def run(client: subprocess.Popen[str], case: str) -> dict[str, Any]:
    """One case in the client's process; what it did (a hang is bounded by pytest-timeout)."""
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write(case + "\n")
    client.stdin.flush()
    line = client.stdout.readline()
    assert line, f"the LlamaIndex client exited ({client.poll()}) before answering {case!r}"
    result: dict[str, Any] = json.loads(line)
    assert "error" not in result, result
    return result


def over_http(lines: list[dict[str, Any]], modes: list[str]) -> None:
    assert [line["mode"] for line in lines] == modes, lines
    assert {line["status"] for line in lines} == {"completed"}, lines


def test_function_agent_tool_loop_then_a_second_turn(srv: LabServer, client: subprocess.Popen[str]) -> None:
    mark = srv.mark()
    result = run(client, "tool_loop")
    assert result["calls"] == ["grep def mean", "read_file a.py"], result
    assert result["answers"] == ["Found it.", "Read it."], result
    lines = srv.ended_since(mark)
    over_http(lines, ["http"] * 4)  # the whole history re-sent each time (store: false)
    assert [line["calls"] for line in lines] == [["grep"], [], ["read_file"], []], lines


def test_streamed(srv: LabServer, client: subprocess.Popen[str]) -> None:
    mark = srv.mark()
    result = run(client, "streamed")
    assert result["calls"] == ["grep def median"], result
    text = [delta for delta in result["deltas"] if delta]
    assert len(text) > 1 and "".join(text) == result["answer"] == "Streamed answer here.", result
    chat = [delta for delta in result["chat_deltas"] if delta]
    assert len(chat) > 1 and "".join(chat) == "A B C", result
    over_http(srv.ended_since(mark), ["http"] * 3)  # the agent's two responses, then astream_chat's


def test_structured_predict(srv: LabServer, client: subprocess.Popen[str]) -> None:
    mark = srv.mark()
    result = run(client, "structured")
    assert result["object"] == {"city": "Oslo", "celsius": -3}, result
    over_http(srv.ended_since(mark), ["http"])


def test_track_previous_responses(srv: LabServer, client: subprocess.Popen[str]) -> None:
    mark = srv.mark()
    result = run(client, "previous_response")
    assert result["answers"] == ["One.", "Two."], result
    # the second turn sent only its message, chained to the stored first response
    over_http(srv.ended_since(mark), ["http", "http-prev"])
