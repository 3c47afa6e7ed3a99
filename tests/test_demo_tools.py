"""The demo's local tools, its buggy repository and its script — no server needed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from proto.client.longlived import ClientEvent, RolloutResult
from proto.demo.fixture import BUGGY_STATS, FIX_PATCH, FIXED_STATS, make_repo
from proto.demo.patch import apply_hunks, parse_unified_diff
from proto.demo.script import SCRIPT, demo_request
from proto.demo.timeline import Timeline
from proto.demo.workspace import Workspace
from sampler.policy import parse_script


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(make_repo(tmp_path / "repo"))


def _exit_code(output: str) -> int:
    first = output.splitlines()[0]
    assert first.startswith("exit code: ")
    return int(first.removeprefix("exit code: "))


@pytest.mark.process
def test_the_repo_fails_before_the_patch_and_passes_after(ws: Workspace) -> None:
    before = ws.run_tests({})
    assert _exit_code(before) != 0
    assert "failed" in before

    assert ws.apply_patch({"path": "stats.py", "patch": FIX_PATCH}).startswith("applied: stats.py")

    assert (ws.root / "stats.py").read_text() == FIXED_STATS
    after = ws.run_tests({})
    assert _exit_code(after) == 0, after
    assert "2 passed" in after


@pytest.mark.process
def test_the_scripts_patch_is_the_one_the_model_sends(ws: Workspace) -> None:
    plans = parse_script(SCRIPT)
    assert plans is not None
    [patch_call] = [c for p in plans for c in p.calls if c.name == "apply_patch"]
    assert ws.apply_patch(json.loads(patch_call.arguments)).startswith("applied:")
    assert ws.test_run().exit_code == 0


def test_the_script_parses_into_six_turns_with_a_parallel_pair_and_a_hosted_call() -> None:
    plans = parse_script(SCRIPT)
    assert plans is not None
    assert [[c.name for c in p.calls] for p in plans] == [
        ["grep", "read_file"],
        ["read_file", "run_tests"],
        ["web_search"],
        ["apply_patch"],
        ["run_tests"],
        [],
    ]
    assert plans[-1].final and "off-by-one" in plans[-1].text
    assert not any(p.final for p in plans[:-1])


def test_the_request_declares_every_scripted_tool() -> None:
    request = demo_request("mock-1000tps")
    functions = {t["name"] for t in request["tools"] if t["type"] == "function"}
    assert functions == {"grep", "read_file", "apply_patch", "run_tests"}
    assert {"type": "web_search"} in request["tools"]
    assert request["input"][0]["content"] == SCRIPT


def test_grep_finds_lines_with_their_paths(ws: Workspace) -> None:
    assert ws.grep({"pattern": r"def mean"}) == "stats.py:4: def mean(values: list[float]) -> float:"
    assert ws.grep({"pattern": r"mean\(\[7\]\)", "path": "test_stats.py"}).startswith("test_stats.py:9:")
    assert ws.grep({"pattern": "median"}) == "no matches for 'median'"


def test_grep_reports_bad_arguments(ws: Workspace) -> None:
    assert ws.grep({"pattern": "("}).startswith("error: bad regular expression")
    assert ws.grep({}).startswith("error:")
    assert "outside the repository" in ws.grep({"pattern": "x", "path": "../.."})


def test_read_file_numbers_lines_and_takes_a_range(ws: Workspace) -> None:
    whole = ws.read_file({"path": "stats.py"})
    assert whole.splitlines()[6] == "   7      for i in range(len(values) - 1):"
    assert ws.read_file({"path": "stats.py", "start_line": 7, "end_line": 8}).splitlines() == [
        "   7      for i in range(len(values) - 1):",
        "   8          total += values[i]",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"path": "missing.py"}, "no such file"),
        ({"path": "../../etc/passwd"}, "outside the repository"),
        ({}, '"path" must be a string'),
    ],
)
def test_read_file_errors_are_strings(ws: Workspace, args: dict[str, str], message: str) -> None:
    out = ws.read_file(args)
    assert out.startswith("error:") and message in out


def test_a_patch_that_does_not_match_writes_nothing(ws: Workspace) -> None:
    stale = FIX_PATCH.replace(
        "-    for i in range(len(values) - 1):", "-    for i in range(len(values) - 2):"
    )
    out = ws.apply_patch({"patch": stale})
    assert out.startswith("error: hunk 1 does not apply to stats.py")
    assert "nothing was written" in out
    assert (ws.root / "stats.py").read_text() == BUGGY_STATS


def test_a_multi_file_patch_is_all_or_nothing(ws: Workspace) -> None:
    bad_second = (
        FIX_PATCH
        + "--- a/test_stats.py\n+++ b/test_stats.py\n@@ -1,1 +1,1 @@\n-import nothing\n+import something\n"
    )
    assert ws.apply_patch({"patch": bad_second}).startswith("error: hunk 1 does not apply to test_stats.py")
    assert (ws.root / "stats.py").read_text() == BUGGY_STATS  # the first file's good hunk was not written


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("not a diff", "expected a @@ hunk header"),
        ("--- a/stats.py\n+++ b/stats.py\n@@ -1,3 +1,3 @@\n context\n", "ends early"),
        ("--- a/stats.py\n+++ b/stats.py\n", "no hunks"),
        ("--- a/stats.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n", "deleting files"),
        ("--- a/stats.py\n+++ b/stats.py\n@@ -1,1 +1,1 @@\n?weird\n", "hunk lines start with"),
    ],
)
def test_malformed_patches_give_a_clear_error(ws: Workspace, patch: str, message: str) -> None:
    out = ws.apply_patch({"patch": patch})
    assert out.startswith("error:") and message in out, out
    assert (ws.root / "stats.py").read_text() == BUGGY_STATS


def test_a_patch_may_not_escape_the_repository(ws: Workspace) -> None:
    out = ws.apply_patch({"patch": "--- /dev/null\n+++ b/../evil.py\n@@ -0,0 +1 @@\n+x\n"})
    assert "outside the repository" in out
    assert not (ws.root.parent / "evil.py").exists()


def test_a_patch_can_create_a_file(ws: Workspace) -> None:
    out = ws.apply_patch({"patch": "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"})
    assert out == "applied: pkg/new.py (1 hunk, +2 -0)"
    assert (ws.root / "pkg" / "new.py").read_text() == "a = 1\nb = 2\n"


@pytest.mark.process
def test_search_replace_edits_exactly_one_occurrence(ws: Workspace) -> None:
    assert ws.apply_patch(
        {"path": "stats.py", "search": "range(len(values) - 1)", "replace": "range(len(values))"}
    ) == ("applied: stats.py (1 replacement)")
    assert ws.test_run().exit_code == 0
    ambiguous = ws.apply_patch({"path": "stats.py", "search": "values", "replace": "xs"})
    assert ambiguous.startswith("error: search text found") and "nothing was written" in ambiguous
    missing = ws.apply_patch({"path": "stats.py", "search": "nope", "replace": ""})
    assert missing.startswith("error: search text not found")
    assert (ws.root / "stats.py").read_text() == FIXED_STATS


def test_hunks_apply_at_an_offset_when_the_file_moved() -> None:
    [(_, hunks)] = parse_unified_diff(FIX_PATCH)
    shifted = "# a new first line\n# and another\n" + BUGGY_STATS
    assert apply_hunks(shifted, hunks, "stats.py") == "# a new first line\n# and another\n" + FIXED_STATS


def test_a_removed_line_starting_with_dashes_is_not_a_file_header() -> None:
    diff = "--- a/f\n+++ b/f\n@@ -1,2 +1,1 @@\n--- not a header\n keep\n"
    [(path, [hunk])] = parse_unified_diff(diff)
    assert path == "f"
    assert apply_hunks("-- not a header\nkeep\n", [hunk], "f") == "keep\n"


def _event(t: float, **data: object) -> ClientEvent:
    return ClientEvent(t, dict(data))


def test_the_timeline_shows_suspension_tool_and_resumption_but_not_every_delta() -> None:
    out = io.StringIO()
    timeline = Timeline(Console(file=out, width=200, color_system=None))
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "grep",
        "arguments": '{"pattern":"x"}',
    }
    events = [
        _event(0.000, type="client.create"),
        _event(0.001, type="response.created", response={"id": "resp_1", "model": "mock-1000tps"}),
        _event(0.002, type="response.output_item.added", item={**call, "arguments": ""}),
        *(
            _event(0.003 + i / 1000, type="response.function_call_arguments.delta", item_id="fc_1", delta="x")
            for i in range(5)
        ),
        _event(0.009, type="response.output_item.done", item=call),
        _event(0.010, type="response.done", pending_calls=[{"call_id": "call_1", "name": "grep"}]),
        _event(0.011, type="client.tool.start", call_id="call_1", name="grep"),
    ]
    for event in events:
        timeline.on_event(event)
    timeline.tool_output("grep", "stats.py:4: def mean")
    for event in [
        _event(0.013, type="client.tool.done", call_id="call_1", name="grep", duration_ms=2.0),
        _event(0.014, type="client.append", outputs=1),
        _event(0.020, type="response.completed", response={"status": "completed"}),
    ]:
        timeline.on_event(event)
    text = out.getvalue()
    assert "suspended, waiting for 1 call(s): grep" in text
    assert "grep" in text and "2.0 ms → stats.py:4: def mean" in text
    assert "1 output(s) sent: resumed" in text
    assert "5 deltas · 1,000 tok/s" in text
    assert "delta" not in text.replace("deltas", "")  # no line per delta
    assert timeline.suspensions == 1 and timeline.tool_ms == [2.0]

    response = {
        "status": "completed",
        "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 60}, "output_tokens": 20},
        "lab": {
            "turns": [
                {
                    "turn": 0,
                    "prompt_tokens": 100,
                    "cached_tokens": 60,
                    "prefill_ms": 1.0,
                    "queue_wait_ms": 0.0,
                    "decode_ms": 20.0,
                    "output_tokens": 20,
                }
            ]
        },
    }
    timeline.summary(
        RolloutResult(response=response, events=[_event(0.020, type="response.completed")], appends=1)
    )
    summary = out.getvalue()
    assert "input 100 (cached 60) · output 20" in summary
    assert "1,000 modelled decode" in summary
    assert "20.0 ms" in summary


@pytest.mark.process
def test_the_demo_completes_against_a_real_server() -> None:
    """The whole demo once, end to end (about a second): `make demo` must keep passing."""
    from proto.demo import main

    assert main(["--model", "mock-4000tps"]) == 0
