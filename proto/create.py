"""Validation of one create body (``POST /v1/responses`` or a GA ``response.create``), sans-IO.

The long-lived core does the same checks inside its state machine (``LongLivedCore._create``); HTTP and
GA WebSocket have no such machine around a create, so the checks live here, once, for both.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from proto import codec
from proto.errors import ClientError
from proto.events import CreateBody
from proto.items import FunctionCall, FunctionCallOutput, Item
from proto.work import WorkCounters


@dataclass(frozen=True)
class CreateLimits:
    """Per-request limits; each is a server flag (``--max-input-items`` …)."""

    max_input_items: int = 2048
    max_tools: int = 128


def validate_create(body: CreateBody, known_models: Container[str], limits: CreateLimits) -> tuple[list[Item], WorkCounters]:
    """The body's input items, decoded one by one, and the work counted doing it; ``ClientError`` with
    the failing path as ``param`` otherwise.

    Without ``previous_response_id`` every ``function_call_output`` must answer a call in the same input
    (OpenAI checks this too); a continuation's outputs are checked once the history is loaded
    (``check_outputs``), because only then are its calls known.
    """
    if body.model not in known_models:
        raise ClientError("model_not_found", f"the model {body.model!r} does not exist", "model")
    if len(body.tools) > limits.max_tools:
        raise ClientError("too_many_tools", f"at most {limits.max_tools} tools", "tools")
    if not isinstance(body.input, str) and len(body.input) > limits.max_input_items:
        raise ClientError("too_many_items", f"at most {limits.max_input_items} input items", "input")
    work = WorkCounters(requests_validated=1)
    items = codec.decode_items(body.input, "input")
    work.items_validated += len(items)
    if body.previous_response_id is None:
        check_outputs([], items)
    return items, work


def check_outputs(history: list[Item], items: list[Item]) -> None:
    """Each ``function_call_output`` in ``items`` answers a call of ``history + items``, at most once."""
    calls = {item.call_id for item in (*history, *items) if isinstance(item, FunctionCall)}
    answered = {item.call_id for item in history if isinstance(item, FunctionCallOutput)}
    for index, item in enumerate(items):
        if not isinstance(item, FunctionCallOutput):
            continue
        if item.call_id not in calls:
            raise ClientError("unknown_call_id", f"no function_call with call_id {item.call_id!r}", f"input[{index}].call_id")
        if item.call_id in answered:
            raise ClientError("duplicate_call_output", f"call {item.call_id!r} already has an output", f"input[{index}].call_id")
        answered.add(item.call_id)
