"""The guarantees (docs/protocol.md, "Guarantees"): what the request promises about the model's output
holds whatever the script says — the policy's decisions, unit by unit."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sampler.policy import (
    OfferedTool,
    PlannedCall,
    Rules,
    TurnPlan,
    decide,
    parse_directive,
    say,
    select_policy,
)
from sampler.schema_args import value_for

OFFERED = (
    OfferedTool(
        "grep",
        "function",
        "search files",
        {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
    ),
    OfferedTool("read_file", "function", "read a file", {"type": "object", "properties": {}}),
    OfferedTool("apply_patch", "custom", "edit files"),
    OfferedTool("web_search", "hosted"),
)
CALL_GREP = TurnPlan(calls=(PlannedCall("grep", '{"pattern":"x"}'),), final=False)
TWO = TurnPlan(calls=(PlannedCall("grep", "{}"), PlannedCall("read_file", "{}")), final=False)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "n": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["city", "n"],
    "additionalProperties": False,
}


def names(plan: TurnPlan) -> list[str]:
    return [call.name for call in plan.calls]


def test_no_rules_change_nothing() -> None:
    for plan in (CALL_GREP, TWO, say("hi")):
        assert decide(Rules(), OFFERED, plan, 0, "hi") == plan


def test_none_never_calls_and_says_why() -> None:
    plan = decide(Rules(tool_choice="none"), OFFERED, TWO, 0, "hi")
    assert not plan.calls and plan.final
    assert plan.text == '(not calling grep, read_file: tool_choice is "none")'


def test_none_turns_off_the_tool_rule() -> None:
    policy = select_policy(
        "grep", "echo", offered=OFFERED, answers_user_turn=0, rules=Rules(tool_choice="none")
    )
    assert policy.plan(0, "grep", "grep for pattern") == say("grep for pattern")
    assert names(select_policy("grep", "echo", offered=OFFERED, answers_user_turn=0).plan(0, "", "grep")) == [
        "grep"
    ]


def test_required_keeps_a_scripted_call_of_an_allowed_tool() -> None:
    assert decide(Rules(tool_choice="required"), OFFERED, CALL_GREP, 0, "hi") == CALL_GREP


def test_required_generates_a_call_from_the_schema() -> None:
    plan = decide(Rules(tool_choice="required"), OFFERED, say("hello"), 0, "please grep something")
    assert names(plan) == ["grep"] and not plan.final
    jsonschema.validate(json.loads(plan.calls[0].arguments), OFFERED[0].parameters)
    # seeded: the same message gives the same call
    assert plan == decide(Rules(tool_choice="required"), OFFERED, say("other"), 0, "please grep something")


def test_forced_function_custom_and_hosted() -> None:
    forced = Rules(tool_choice="required", forced="read_file")
    assert names(decide(forced, OFFERED, CALL_GREP, 0, "hi")) == ["read_file"]
    custom = decide(Rules(tool_choice="required", forced="apply_patch"), OFFERED, say("x"), 0, "fix it")
    assert custom.calls == (PlannedCall("apply_patch", "fix it", custom=True),)
    hosted = decide(Rules(tool_choice="required", forced="web_search"), OFFERED, say("x"), 0, "cats  dogs")
    assert hosted.calls == (PlannedCall("web_search", '{"query": "cats dogs"}'),)


def test_allowed_tools_restrict_calls() -> None:
    auto = Rules(allowed=frozenset({"read_file"}))
    assert names(decide(auto, OFFERED, TWO, 0, "hi")) == ["read_file"]
    assert (
        decide(auto, OFFERED, CALL_GREP, 0, "hi").text == "(not calling grep: tool_choice does not allow it)"
    )
    assert decide(auto, OFFERED, say("hi"), 0, "hi") == say("hi")
    required = Rules(tool_choice="required", allowed=frozenset({"read_file"}))
    assert names(decide(required, OFFERED, CALL_GREP, 0, "grep")) == ["read_file"]


def test_max_tool_calls_counts_over_the_response() -> None:
    rules = Rules(max_tool_calls=3)
    assert names(decide(rules, OFFERED, TWO, 0, "hi", calls_made=2)) == ["grep"]
    capped = decide(rules, OFFERED, TWO, 0, "hi", calls_made=3)
    assert capped.text == "(not calling grep, read_file: max_tool_calls reached)" and capped.final
    # the cap wins over `required`: a response that must call and may not call answers
    assert not decide(Rules(tool_choice="required", max_tool_calls=0), OFFERED, say("x"), 0, "x").calls
    policy = select_policy("!call grep {} | !call read_file {}\n!call grep {}\n!say ok", "echo", rules=rules)
    plans = [policy.plan(turn, "", "") for turn in range(3)]
    assert [len(p.calls) for p in plans] == [2, 1, 0]
    assert policy.plan(1, "", "") == plans[1]  # a turn asked again answers the same


def test_parallel_false_with_rules() -> None:
    policy = select_policy(
        "!call grep {} | !call read_file {}", "echo", parallel=False, rules=Rules(max_tool_calls=5)
    )
    assert [names(policy.plan(turn, "", "")) for turn in range(2)] == [["grep"], ["read_file"]]


def test_json_directive() -> None:
    assert parse_directive('!json {"a": [1, 2]}') == TurnPlan(text='{"a":[1,2]}', final=True, json=True)
    plan = select_policy("!json {bad", "echo").plan(0, "", "")
    assert plan.text.startswith("[script error on line 1: bad JSON after !json")


def test_json_schema_takes_a_valid_json_directive() -> None:
    rules = Rules(text_format="json_schema", schema=SCHEMA)
    plan = decide(rules, OFFERED, parse_directive('!json {"city": "Oslo", "n": 3}'), 0, "x")
    assert plan.text == '{"city":"Oslo","n":3}'


def test_json_schema_generates_when_the_directive_does_not_validate() -> None:
    rules = Rules(text_format="json_schema", schema=SCHEMA)
    for plan in (
        parse_directive('!json {"city": "Oslo", "n": 9}'),
        say("hello"),
        parse_directive("!tokens 50 !say x"),
    ):
        out = decide(rules, OFFERED, plan, 0, "x")
        jsonschema.validate(json.loads(out.text), SCHEMA)
        assert out.output_tokens is None and out.json


def test_json_schema_after_none_still_validates() -> None:
    rules = Rules(tool_choice="none", text_format="json_schema", schema=SCHEMA)
    jsonschema.validate(json.loads(decide(rules, OFFERED, CALL_GREP, 0, "x").text), SCHEMA)


def test_json_object() -> None:
    rules = Rules(text_format="json_object")
    assert decide(rules, OFFERED, parse_directive('!json {"a": 1}'), 0, "x").text == '{"a":1}'
    assert json.loads(decide(rules, OFFERED, say("hello"), 0, "x").text) == {"answer": "hello"}
    assert json.loads(decide(rules, OFFERED, parse_directive("!json [1]"), 0, "q").text) == {"answer": "q"}
    assert decide(rules, OFFERED, CALL_GREP, 0, "x") == CALL_GREP  # a call is not the final message


# ---- generated JSON validates against a generated (strict-mode) schema ----------------------------------

_SCALARS: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.builds(
        lambda low, extra: {"type": "string", "minLength": low, "maxLength": low + extra},
        st.integers(0, 20),
        st.integers(0, 20),
    ),
    st.builds(
        lambda low, extra: {"type": "integer", "minimum": low, "maximum": low + extra},
        st.integers(-50, 50),
        st.integers(0, 50),
    ),
    st.builds(lambda low: {"type": "number", "minimum": low}, st.floats(-100, 100, allow_nan=False)),
    st.builds(lambda low: {"type": "integer", "exclusiveMinimum": low}, st.integers(-5, 5)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": ["string", "null"]}),
    st.lists(st.text(max_size=5), min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
    st.integers().map(lambda v: {"const": v}),
)


def _compound(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    words = st.text("abcdefgh", min_size=1, max_size=6)
    return st.one_of(
        st.dictionaries(words, children, max_size=4).map(
            lambda props: {
                "type": "object",
                "properties": props,
                "required": list(props),
                "additionalProperties": False,
            }
        ),
        st.builds(
            lambda items, low, extra: {
                "type": "array",
                "items": items,
                "minItems": low,
                "maxItems": low + extra,
            },
            children,
            st.integers(0, 3),
            st.integers(0, 3),
        ),
        st.lists(children, min_size=1, max_size=3).map(lambda branches: {"anyOf": branches}),
    )


SCHEMAS = st.recursive(_SCALARS, _compound, max_leaves=12)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(SCHEMAS, st.integers(0, 2**32))
def test_generated_value_validates(schema: dict[str, Any], seed: int) -> None:
    jsonschema.validate(value_for(schema, random.Random(seed)), schema)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(SCHEMAS.filter(lambda s: s.get("type") == "object"), st.text(max_size=30))
def test_json_schema_message_validates(schema: dict[str, Any], message: str) -> None:
    rules = Rules(text_format="json_schema", schema=schema)
    out = decide(rules, OFFERED, say(message), 3, message)
    jsonschema.validate(json.loads(out.text), schema)
    assert out == decide(rules, OFFERED, say(message), 3, message)  # deterministic


def _rules(**fields: Any) -> Rules:
    import msgspec

    from proto.core.events import CreateBody
    from proto.server.pipeline import guarantees

    return guarantees(msgspec.json.decode(msgspec.json.encode({"model": "m", **fields}), type=CreateBody))


def test_rules_from_the_request() -> None:
    assert _rules() == Rules()
    assert _rules(tool_choice="none").tool_choice == "none"
    assert _rules(tool_choice={"type": "function", "name": "f"}) == Rules(tool_choice="required", forced="f")
    assert _rules(tool_choice={"type": "custom", "name": "ap"}).forced == "ap"
    assert _rules(tool_choice={"type": "web_search_preview"}).forced == "web_search"
    allowed = _rules(
        tool_choice={
            "type": "allowed_tools",
            "mode": "auto",
            "tools": [{"type": "web_search"}, {"type": "function", "name": "f"}],
        }
    )
    assert allowed == Rules(allowed=frozenset({"f", "web_search", "web_search_preview"}))
    schema = {"type": "object", "properties": {}}
    fmt = {"type": "json_schema", "name": "x", "schema": schema, "strict": True}
    assert _rules(text={"format": fmt}, max_tool_calls=2) == Rules(
        text_format="json_schema", schema=schema, max_tool_calls=2
    )
    assert _rules(text={"format": {"type": "json_object"}}).text_format == "json_object"


def test_required_does_not_hold_after_hosted_calls() -> None:
    """A forced search inside one response: the search, then the answer (not a search forever)."""
    rules = Rules(tool_choice="required", forced="web_search")
    policy = select_policy("hello", "echo", offered=OFFERED, answers_user_turn=0, rules=rules)
    first, second = policy.plan(0, "hello", "hello"), policy.plan(1, "hello", "hello")
    assert names(first) == ["web_search"] and second == say("hello")
    # after local calls (the client's outputs), `required` holds again: a long-lived response's next segment
    policy = select_policy("hi", "echo", offered=OFFERED, rules=Rules(tool_choice="required"))
    assert all(policy.plan(turn, "hi", "hi").calls for turn in range(3))


def _choice_refusal(tools: list[dict[str, Any]], choice: Any) -> str | None:
    """The message ``check_tool_choice`` (the sans-IO create validation) refuses with, None if accepted."""
    import msgspec

    from proto.core.create import check_tool_choice
    from proto.core.errors import ClientError
    from proto.core.events import CreateBody

    body = msgspec.json.decode(
        msgspec.json.encode({"model": "m", "tools": tools, "tool_choice": choice}), type=CreateBody
    )
    try:
        check_tool_choice(body)
    except ClientError as exc:
        assert (exc.code, exc.status) == ("invalid_request", 400)
        return exc.message
    return None


def test_a_choice_names_an_offered_tool_in_any_of_its_spellings() -> None:
    namespace = {
        "type": "namespace",
        "name": "fs",
        "description": "files",
        "tools": [{"type": "function", "name": "read"}, {"type": "custom", "name": "patch"}],
    }
    mcp = {"type": "mcp", "server_label": "docs", "server_url": "https://example.com/mcp"}
    tools = [{"type": "function", "name": "grep"}, {"type": "web_search"}, namespace, mcp]
    for accepted in [
        "required",
        {"type": "function", "name": "grep"},
        {"type": "function", "name": "read"},  # inside a namespace, by its own name
        {"type": "custom", "name": "patch"},
        {"type": "web_search_preview"},  # the hosted family answers to each spelling
        {"type": "mcp", "server_label": "docs", "name": "search"},
        {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "grep"}]},
    ]:
        assert _choice_refusal(tools, accepted) is None, accepted
    assert _choice_refusal(tools, {"type": "custom", "name": "grep"}) == (
        "Tool choice 'grep' not found in 'tools' parameter."
    )
    assert _choice_refusal(tools, {"type": "mcp", "server_label": "mail"}) == (
        "Tool choice 'mail' not found in 'tools' parameter."
    )
    assert _choice_refusal([], {"type": "file_search"}) == (
        "Tool choice 'file_search' not found in 'tools' parameter."
    )
