"""Cline CLI (npm ``cline``, pinned in tests/clients/cline), unmodified, against this server over HTTP (SSE):
``cline auth --provider openai-native --baseurl …`` as a new user configures it, then a scripted task in
its default act mode (which offers the hosted ``web_search``; Cline does not re-send the
``web_search_call`` items: docs/protocol.md, "The directive script", the position) and in ``--yolo``
mode (no web search; the task ends with its ``submit_and_exit`` tool). Each run reads a file, writes one
and, in act mode, searches: the files end as scripted, and every tool ran exactly once, by the server's
log (the calls each response made) and by Cline's own events (what it ran, none failed). Cline runs with
HOME in the test's tmp path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from codex import KEY, LabServer, client_bin, environ_has_node, lab_server, run_client
from helpers import MODEL, clean_env

pytestmark = pytest.mark.process  # every test starts a server and a client

ANSWER = "The task is complete."


def cline_bin() -> Path:
    return client_bin("cline", "cline", "Cline CLI")


def _env(home: Path) -> dict[str, str]:
    """This environment with HOME (and every XDG directory) in the test's tmp path, and nothing of Cline's
    or OpenAI's own settings: Cline reads only what the test configures."""
    env = {
        k: v
        for k, v in clean_env().items()
        if not k.startswith(("CLINE_", "OPENAI_", "XDG_")) and k not in ("NODE_OPTIONS",)
    }
    xdg = {f"XDG_{d.upper()}_HOME": str(home / f".{d}") for d in ("config", "data", "cache", "state")}
    return {**env, **xdg, "HOME": str(home), "NO_COLOR": "1"}


@dataclass
class ClineRun:
    returncode: int
    output: str
    events: list[dict[str, Any]]

    def tools(self) -> list[dict[str, Any]]:
        """Each tool Cline ran (its ``content_end`` of a tool), in order."""
        return [
            e["event"]
            for e in self.events
            if e.get("type") == "agent_event"
            and e["event"].get("type") == "content_end"
            and e["event"].get("contentType") == "tool"
        ]

    def result(self) -> dict[str, Any]:
        results = [e for e in self.events if e.get("type") == "run_result"]
        assert len(results) == 1, self.output
        return results[0]


def _failed(output: Any) -> bool:
    """Whether a tool's output says it failed anywhere (``success: false`` or an ``error``)."""
    if isinstance(output, dict):
        return (
            output.get("success") is False or bool(output.get("error")) or any(map(_failed, output.values()))
        )
    if isinstance(output, list):
        return any(map(_failed, output))
    return False


async def cline_task(server: LabServer, home: Path, work: Path, prompt: str, *flags: str) -> ClineRun:
    environ_has_node()
    binary = cline_bin()
    env = _env(home)
    auth = ["--provider", "openai-native", "--apikey", KEY, "--modelid", MODEL, "--baseurl", server.base_url]
    code, out = await run_client([str(binary), "auth", *auth], work, env)
    assert code == 0, out
    assert (home / ".cline").is_dir(), "cline auth wrote its settings outside the test's HOME"
    # --timeout: Cline's own bound on the task (seconds), inside the test's guard
    code, out = await run_client(
        [str(binary), "--json", "--timeout", "150", "-c", str(work), *flags, prompt], work, env
    )
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return ClineRun(code, out, events)


def _calls(server: LabServer) -> list[str]:
    """The tools the model called, response by response, from the server's log."""
    return [name for line in server.ended() for name in line["calls"]]


def _assert_ran_once_each(server: LabServer, run: ClineRun, tools: list[str]) -> None:
    assert run.returncode == 0, run.output
    assert run.result()["finishReason"] == "completed", run.output
    assert _calls(server) == tools, server.ended()
    ended = server.ended()
    assert {line["mode"] for line in ended} == {"http"} and {line["status"] for line in ended} == {
        "completed"
    }
    ran = run.tools()
    assert [tool["toolName"] for tool in ran] == tools, run.output
    assert not [tool for tool in ran if tool.get("error") or _failed(tool.get("output"))], run.output
    assert "Error" not in "".join(json.dumps(tool.get("output")) for tool in ran), run.output


async def test_cline_act_mode_reads_searches_and_adds_a_file_once(tmp_path: Path) -> None:
    """Default act mode: the request offers the hosted web_search; the search's response also holds the
    apply_patch call, and Cline's next request carries the call without the search. The patch must not be
    played again (it would fail: "Add File Error: File already exists")."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "notes.txt").write_text("alpha\n")
    patch = f"*** Begin Patch\n*** Add File: {work / 'added.txt'}\n+beta\n*** End Patch\n"
    prompt = "\n".join(
        [
            "Read the notes, search the web, then add a file.",
            "!call read_files " + json.dumps({"files": [{"path": str(work / "notes.txt")}]}),
            '!call web_search {"query": "responses lab mock model"}',
            "!call apply_patch " + json.dumps({"input": patch}),
            f"!say {ANSWER}",
        ]
    )
    async with lab_server(tmp_path) as server:
        run = await cline_task(server, home, work, prompt)
        _assert_ran_once_each(server, run, ["read_files", "web_search", "apply_patch"])
        assert run.result()["text"] == ANSWER, run.output
        assert len(server.ended()) == 3, server.ended()  # read; search + patch; the answer
    assert (
        work / "added.txt"
    ).read_text() == "beta"  # Cline writes an added file's lines without the last newline
    assert (work / "notes.txt").read_text() == "alpha\n"
    assert sorted(p.name for p in work.iterdir()) == ["added.txt", "notes.txt"]


async def test_cline_yolo_mode_reads_edits_and_submits_once(tmp_path: Path) -> None:
    """``--yolo``: Cline offers no web search and no apply_patch, edits with its ``editor`` tool and ends
    the task with ``submit_and_exit`` (a plain answer does not end a yolo task)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    notes = work / "notes.txt"
    notes.write_text("alpha\n")
    summary = "Notes read, edited and checked."
    prompt = "\n".join(
        [
            "Read the notes, then change them.",
            "!call read_files " + json.dumps({"files": [{"path": str(notes)}]}),
            "!call editor " + json.dumps({"path": str(notes), "old_text": "alpha", "new_text": "gamma"}),
            "!call submit_and_exit " + json.dumps({"summary": summary, "verified": True}),
        ]
    )
    async with lab_server(tmp_path) as server:
        run = await cline_task(server, home, work, prompt, "--yolo")
        _assert_ran_once_each(server, run, ["read_files", "editor", "submit_and_exit"])
        assert summary in run.result()["text"], run.output
    assert notes.read_text() == "gamma\n"
    assert [p.name for p in work.iterdir()] == ["notes.txt"]
