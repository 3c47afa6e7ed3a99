"""The mock model's policies: directive script, workloads and trace replay, echo, random."""

import json
from pathlib import Path

import pytest

from sampler.policy import (
    FALLBACK_TEXT,
    EchoPolicy,
    PlannedCall,
    RandomPolicy,
    ScriptPolicy,
    TracePolicy,
    TurnPlan,
    load_workload,
    parse_script,
    select_policy,
    workload_names,
    workload_to_script,
)


def test_no_directives_is_none() -> None:
    assert parse_script("hello\n!important: not a directive\n  plain text") is None


def test_calls_say_and_tokens() -> None:
    plans = parse_script(
        "Please help.\n"
        '!call get_weather {"city": "Paris"}\n'
        "prose between lines is ignored\n"
        '  !tokens 200 !call lookup {"q": "a | b"} | !call web_search {"query": "x"}\n'
        "!tokens 50 !say all done\n"
    )
    assert plans == [
        TurnPlan(calls=(PlannedCall("get_weather", '{"city":"Paris"}'),), final=False),
        TurnPlan(
            calls=(PlannedCall("lookup", '{"q":"a | b"}'), PlannedCall("web_search", '{"query":"x"}')),
            output_tokens=200,
            final=False,
        ),
        TurnPlan(text="all done", output_tokens=50, final=True),
    ]


def test_call_without_arguments_and_empty_say() -> None:
    plans = parse_script("!call now | !call today {}\n!say")
    assert plans is not None
    assert plans[0].calls == (PlannedCall("now", "{}"), PlannedCall("today", "{}"))
    assert plans[1] == TurnPlan(text="", final=True)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("!call get {bad json}", "bad JSON arguments for get"),
        ("!call", "expected `!call NAME"),
        ("!call a {} trailing", "unexpected text after a"),
        ("!call a {} | !say x", "expected `!call NAME"),
        ("!tokens 20", "must prefix"),
        ("!tokens many !say x", "whole number"),
    ],
)
def test_bad_directive_line_takes_its_turn_as_an_error_message(line: str, reason: str) -> None:
    plans = parse_script(f"!call first {{}}\n{line}\n!say last")
    assert plans is not None and len(plans) == 3
    assert plans[1].final and not plans[1].calls
    assert plans[1].text.startswith("[script error on line 2: ") and reason in plans[1].text
    assert plans[2].text == "last"


def test_script_running_out_says_a_short_final_message() -> None:
    policy = ScriptPolicy(parse_script("!call a {}") or [])
    assert policy.plan(0, "", "").calls == (PlannedCall("a", "{}"),)
    assert policy.plan(1, "", "") == TurnPlan(text=FALLBACK_TEXT, final=True)


def test_turns_after_a_say_script_the_next_user_turn() -> None:
    policy = ScriptPolicy(parse_script("!say one\n!say two") or [])
    assert [policy.plan(i, "", "").text for i in range(3)] == ["one", "two", FALLBACK_TEXT]


def test_shipped_workloads_have_the_stated_sizes() -> None:
    assert {"coding-agent", "long-context"} <= set(workload_names())
    coding = load_workload("coding-agent")
    assert 28 <= len(coding.turns) <= 32
    sizes = coding.prompt_tokens_by_turn()
    assert sizes == sorted(sizes) and 20_000 <= sizes[-1] <= 90_000  # "tens of thousands"
    assert coding.turns[-1].final and all(not t.final and t.calls for t in coding.turns[:-1])
    assert any(len(t.calls) > 1 for t in coding.turns)  # some parallel calls
    assert all(t.client_tool_time_s is not None and t.tool_output_tokens for t in coding.turns[:-1])
    assert max(t.client_tool_time_s or 0 for t in coding.turns) >= 1.0  # test runs take seconds
    long = load_workload("long-context")
    assert 90_000 <= long.prompt_tokens_by_turn()[-1] <= 110_000


def test_workload_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps(
            {
                "format": 1,
                "name": "mine",
                "first_user_text": "go",
                "first_user_tokens": 10,
                "turns": [
                    {
                        "calls": [{"name": "f", "arguments": {"a": 1}}],
                        "output_tokens": 5,
                        "tool_output_tokens": 7,
                        "client_tool_time_s": 0.5,
                    },
                    {"say": "ok", "output_tokens": 3},
                ],
            }
        )
    )
    w = load_workload(str(path))
    assert w.prompt_tokens_by_turn() == [10, 22, 25]
    assert w.turns[0] == TurnPlan(
        calls=(PlannedCall("f", '{"a":1}'),),
        output_tokens=5,
        final=False,
        tool_output_tokens=7,
        client_tool_time_s=0.5,
    )
    with pytest.raises(KeyError, match="coding-agent"):
        load_workload("no-such-workload")


def test_workload_script_replays_the_trace() -> None:
    w = load_workload("coding-agent")
    script = workload_to_script(w)
    scripted, traced = select_policy(script, "echo"), TracePolicy(w)
    for turn in range(len(w.turns) + 1):
        a, b = scripted.plan(turn, script, ""), traced.plan(turn, script, "")
        assert (a.calls, a.text, a.output_tokens, a.final) == (b.calls, b.text, b.output_tokens, b.final)


def test_echo() -> None:
    assert EchoPolicy().plan(3, "first", "latest") == TurnPlan(text="latest", final=True)


def test_random_is_seeded_and_well_formed() -> None:
    def rollout(seed: int, first: str) -> list[TurnPlan]:
        return [RandomPolicy(seed).plan(t, first, "") for t in range(6)]

    assert rollout(1, "hi") == rollout(1, "hi")
    assert any(rollout(1, f"q{i}") != rollout(2, f"q{i}") for i in range(5))
    plans = [p for i in range(20) for p in rollout(i, "task")]
    assert any(p.calls for p in plans) and any(p.final for p in plans)
    for p in plans:
        assert p.final == (not p.calls)
        for c in p.calls:
            assert c.name == "web_search" and "query" in json.loads(c.arguments)


def test_select_policy() -> None:
    assert isinstance(select_policy("!say hi", "random:3"), ScriptPolicy)
    assert isinstance(select_policy("hi", "echo"), EchoPolicy)
    r = select_policy("hi", "random:3")
    assert isinstance(r, RandomPolicy) and r.seed == 3
    t = select_policy("hi", "trace:long-context")
    assert isinstance(t, TracePolicy) and t.workload.name == "long-context"
    with pytest.raises(ValueError):
        select_policy("hi", "oracle")


# ---- the tool rule and offered tools (docs/protocol.md, "The directive script")
# ------------------------------------------------
def test_tool_rule_calls_the_matching_tool_with_schema_valid_arguments() -> None:
    import jsonschema

    from sampler.policy import OfferedTool, select_policy

    weather = OfferedTool(
        "get_weather",
        "function",
        "Get the current weather for a location",
        {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["location"],
        },
    )
    other = OfferedTool(
        "list_files", "function", "List the files in a folder", {"type": "object", "properties": {}}
    )
    message = "What's the weather like in San Francisco?"
    policy = select_policy(message, "echo", offered=[other, weather], answers_user_turn=0)
    plan = policy.plan(0, message, message)
    assert [c.name for c in plan.calls] == ["get_weather"] and not plan.final
    jsonschema.validate(json.loads(plan.calls[0].arguments), weather.parameters)
    assert (
        select_policy(message, "echo", offered=[other, weather], answers_user_turn=0).plan(
            0, message, message
        )
        == plan
    )  # seeded
    assert policy.plan(1, message, message).text == message  # answering the tool's output: the default policy
    assert (
        select_policy("Say hi.", "echo", offered=[weather], answers_user_turn=0)
        .plan(0, "Say hi.", "Say hi.")
        .text
        == "Say hi."
    )


def test_scripted_calls_of_tools_not_offered_become_text() -> None:
    from sampler.policy import OfferedTool, select_policy

    script = '!call grep {"q": 1} | !call rm {}\n!call rm {}'
    policy = select_policy(script, "echo", offered=[OfferedTool("grep", "function")])
    assert [c.name for c in policy.plan(0, script, script).calls] == ["grep"]
    plan = policy.plan(1, script, script)
    assert not plan.calls and plan.final and "rm" in plan.text
