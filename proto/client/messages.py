"""The client → server messages, built in one place, as plain dicts in the key order the wire has always
had (docs/protocol.md, "3.1 Client → server events", "4. GA WebSocket mode", "5. HTTP and SSE").

Key order matters to no server, but it is part of every byte count the lab reports: a message is always
``type`` first, then its body's keys in the order the caller gave them, then what a builder adds.
Encoding is :func:`proto.client.frames.encode` (compact msgspec JSON). Also here: the reading side a
client needs to answer a response (its function calls, its output items as they go back in a history).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Item = dict[str, Any]

CREATE = "response.create"
APPEND = "response.append"
INJECT = "response.inject"
CANCEL = "response.cancel"


# ------------------------------------------------------------------------------------------- items
def user_message(text: str) -> Item:
    """A user message in OpenAI's easy shape (type-less ``{"role", "content"}``: "3.1.1 The create body")."""
    return {"role": "user", "content": text}


def function_call_output(call_id: str, output: str) -> Item:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def outputs(calls: Iterable[Mapping[str, Any]], output: str = "ok") -> list[Item]:
    """The same ``output`` for each of these calls (pending calls or ``function_call`` items)."""
    return [function_call_output(call["call_id"], output) for call in calls]


# ------------------------------------------------------------------------------------------- bodies
def body(
    model: str, input: str | Sequence[Any], tools: Sequence[Mapping[str, Any]] | None = None, **fields: Any
) -> Item:
    """The body of ``POST /v1/responses`` (also the flat ``response.create`` of both WebSocket protocols):
    ``model``, ``input``, ``tools`` (when given), then ``fields`` in their order."""
    made: Item = {"model": model, "input": input if isinstance(input, str) else list(input)}
    if tools is not None:
        made["tools"] = list(tools)
    made.update(fields)
    return made


def continuation(base: Mapping[str, Any], input: Sequence[Any], previous_response_id: str) -> Item:
    """``base`` continuing a stored (or, over GA WebSocket mode, a cached) response with only the new items.
    Tools and settings are the caller's to keep in ``base``: OpenAI does not carry them over a chain."""
    return dict(base, input=list(input), previous_response_id=previous_response_id)


def streaming(base: Mapping[str, Any]) -> Item:
    """An HTTP body that asks for SSE (``stream: true``; its place kept where ``base`` already has it)."""
    return dict(base, stream=True)


# ------------------------------------------------------------------------------------------- events
def create(base: Mapping[str, Any]) -> Item:
    """``response.create``: the body, flat (both WebSocket protocols)."""
    return {"type": CREATE, **base}


def append(input: Sequence[Any], response_id: str | None = None) -> Item:
    """``response.append`` (long-lived): outputs of pending calls and/or messages."""
    made: Item = {"type": APPEND, "input": list(input)}
    if response_id is not None:
        made["response_id"] = response_id
    return made


def inject(response_id: str, input: Sequence[Any], event_id: str | None = None) -> Item:
    """``response.inject`` (long-lived): the beta spelling of append, answered by an ack either way."""
    made: Item = {"type": INJECT, "response_id": response_id, "input": list(input)}
    if event_id is not None:
        made["event_id"] = event_id
    return made


def cancel(response_id: str | None = None) -> Item:
    """``response.cancel`` (long-lived): end the open response (or the one named) as cancelled."""
    made: Item = {"type": CANCEL}
    if response_id is not None:
        made["response_id"] = response_id
    return made


# ------------------------------------------------------------------------------------------- reading
def function_calls(response: Mapping[str, Any]) -> list[Item]:
    """The ``function_call`` items of a Response's output, in order."""
    return [item for item in response.get("output", []) if item.get("type") == "function_call"]


def as_input(item: Item) -> Item:
    """An output item as the client re-sends it in a history (the server's own fields it does not take back
    dropped from a message)."""
    if item.get("type") == "message":
        return {"type": "message", "role": "assistant", "content": item.get("content", [])}
    return item
