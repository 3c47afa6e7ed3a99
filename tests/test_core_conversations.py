"""The Conversations API's sans-IO rules (``proto/core/conversations.py``): items as a conversation stores
them, metadata limits, list queries, duplicate ids."""

from __future__ import annotations

import msgspec
import pytest

from proto.core import conversations as conv
from proto.core.errors import ClientError
from proto.core.items import FunctionCallOutput, InputText, Message, OutputText
from proto.core.limits import check_metadata


def raw(value: object) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(value))


def refused(code: str, param: str | None) -> pytest.RaisesExc[ClientError]:
    return pytest.raises(ClientError, check=lambda e: (e.code, e.param) == (code, param))


def test_stored_items_have_ids_statuses_and_parts() -> None:
    user, assistant, answer = (
        conv.stored_item(Message(role="user", content="hi")),
        conv.stored_item(Message(role="assistant", content="hello")),
        conv.stored_item(FunctionCallOutput(call_id="c1", output="ok")),
    )
    assert isinstance(user, Message) and user.content == [InputText(text="hi")] and user.status == "completed"
    assert isinstance(assistant, Message) and assistant.content == [OutputText(text="hello", annotations=[])]
    assert isinstance(answer, FunctionCallOutput) and answer.status == "completed"
    assert [user.id[:4], assistant.id[:4], (answer.id or "")[:4]] == ["msg_", "msg_", "fco_"]
    given = conv.stored_item(Message(role="user", content="x", id="msg_mine", status="incomplete"))
    assert isinstance(given, Message) and (given.id, given.status) == ("msg_mine", "incomplete")


def test_metadata_limits() -> None:
    assert check_metadata(None) == {}
    assert check_metadata({f"k{i}": "v" for i in range(16)}) == {f"k{i}": "v" for i in range(16)}
    with refused("object_above_max_properties", "metadata") as refusal:
        check_metadata({f"k{i}": "v" for i in range(17)})
    assert refusal.value.message == (  # OpenAI's words
        "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an "
        "object with 17 properties instead."
    )
    with refused("invalid_request", "metadata"):
        check_metadata({"k" * 65: "v"})
    with refused("string_above_max_length", "metadata.k"):
        check_metadata({"k": "v" * 513})
    with refused("invalid_request", "metadata.n"):
        check_metadata({"n": 3})
    with refused("string_above_max_length", "$.metadata.k"):  # the long-lived protocol's JSONPath
        check_metadata({"k": "v" * 513}, "$.metadata")


def test_list_queries() -> None:
    assert conv.parse_list_query({}) == conv.ListQuery(None, 20, "desc")
    assert conv.parse_list_query({"after": "msg_1", "limit": "100", "order": "asc"}) == conv.ListQuery(
        "msg_1", 100, "asc"
    )
    for query, param in [({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"), ({"order": "up"}, "order")]:
        with refused("invalid_request", param):
            conv.parse_list_query(query)
    conv.check_include(["reasoning.encrypted_content", "message.output_text.logprobs"])
    with refused("invalid_request", "include[1]"):
        conv.check_include(["reasoning.encrypted_content", "everything"])


def test_items_are_at_most_twenty_and_each_valid() -> None:
    assert len(conv.decode_items([raw({"role": "user", "content": "x"})] * 20)) == 20
    with refused("too_many_items", "items"):
        conv.decode_items([raw({"role": "user", "content": "x"})] * 21)
    with refused("invalid_request", "items[1].content"):
        conv.decode_items([raw({"role": "user", "content": "x"}), raw({"type": "message", "role": "user"})])
    long_output = {"type": "function_call_output", "call_id": "c" * 65, "output": "x"}
    with refused("string_above_max_length", "items[0].call_id"):  # OpenAI's 64-character limit
        conv.decode_items([raw(long_output)])


def test_an_id_already_in_the_conversation_is_refused() -> None:
    kept = [conv.stored_item(Message(role="user", content="a", id="msg_a"))]
    conv.check_new_ids(conv.item_ids(kept), [Message(role="user", content="b", id="msg_b")], "items")
    with refused("invalid_request", "input[1].id"):
        conv.check_new_ids(
            conv.item_ids(kept),
            [Message(role="user", content="b"), Message(role="user", content="c", id="msg_a")],
            "input",
        )
    with refused("invalid_request", "items[1].id"):
        twice = [Message(role="user", content="b", id="msg_b")] * 2
        conv.check_new_ids(set(), twice, "items")
