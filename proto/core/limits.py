"""OpenAI's documented limits on a request's strings, maps, tool names and numbers, checked once for every
transport and refused in OpenAI's words (docs/protocol.md, "Error codes": ``string_above_max_length``,
``empty_string``, ``object_above_max_properties``, ``invalid_value``, ``integer_below_min_value``,
``integer_above_max_value``). The
wording is the one its API returns, as agents and proxies report it: "Invalid 'input[149].call_id': string
too long. Expected a string with maximum length 64, but got a string with length 86 instead."
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proto.core.errors import ClientError

MAX_CALL_ID = 64  # an input function_call's or function_call_output's ``call_id``
MAX_PROMPT_CACHE_KEY = 64
MAX_SAFETY_IDENTIFIER = 64
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_TOOL_NAME = 64
MIN_MAX_OUTPUT_TOKENS = 16  # OpenAI's floor on a response's ``max_output_tokens`` (and the spec's)
MAX_TOP_LOGPROBS = 20  # ``top_logprobs`` is 0..20 (OpenAI's API reference and the spec)
MIN_MAX_TOOL_CALLS = 1  # ``max_tool_calls`` is at least 1 (OpenAI refuses 0 with ``integer_below_min_value``)
# Every integer of a request is an int64 (``openai_types.Int64``): what a typed client can read back when it
# is echoed. OpenAI documents no wider integer anywhere in the API.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
TOOL_NAME = "^[a-zA-Z0-9_-]+$"  # a function tool's name (Codex renames MCP tools to fit it)
_TOOL_NAME = re.compile(TOOL_NAME)
_NOT_TOOL_NAME = re.compile(r"[^a-zA-Z0-9_-]")  # a character ``tool_name`` replaces


def check_length(param: str, value: str | None, limit: int, required: bool = False) -> None:
    """``string_above_max_length`` when ``value`` is longer than ``limit`` characters (None: absent, fits);
    with ``required``, an empty string is ``empty_string`` as OpenAI words it ("Invalid 'input[4].call_id':
    empty string. Expected a string with minimum length 1, but got an empty string instead.")."""
    if value is None:
        return
    if required and not value:
        raise ClientError(
            "empty_string",
            f"Invalid '{param}': empty string. Expected a string with minimum length 1, but got an empty "
            "string instead.",
            param,
        )
    if len(value) > limit:
        raise ClientError(
            "string_above_max_length",
            f"Invalid '{param}': string too long. Expected a string with maximum length {limit}, but got a "
            f"string with length {len(value)} instead.",
            param,
        )


def check_metadata(metadata: Mapping[str, Any] | None, param: str = "metadata") -> dict[str, str]:
    """OpenAI's metadata rules: at most 16 pairs (``object_above_max_properties``), values strings of at most
    512 characters (``string_above_max_length``, naming ``metadata.<key>``), keys of at most 64 (no OpenAI
    wording on record: ``invalid_request``)."""
    metadata = dict(metadata or {})
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ClientError(
            "object_above_max_properties",
            f"Invalid '{param}': too many properties. Expected an object with at most {MAX_METADATA_PAIRS} "
            f"properties, but got an object with {len(metadata)} properties instead.",
            param,
        )
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise ClientError("invalid_request", "metadata values are strings", f"{param}.{key}")
        if len(key) > MAX_METADATA_KEY:
            raise ClientError(
                "invalid_request", f"metadata keys are at most {MAX_METADATA_KEY} characters", param
            )
        check_length(f"{param}.{key}", value, MAX_METADATA_VALUE)
    return metadata


def check_tool_name(param: str, name: str) -> None:
    """A function tool's name: 1–64 characters of ``TOOL_NAME``; OpenAI's ``invalid_value`` otherwise,
    "Invalid 'tools[16].name': string does not match pattern. Expected a string that matches the pattern
    '^[a-zA-Z0-9_-]+$'."."""
    check_length(param, name, MAX_TOOL_NAME, required=True)
    if _TOOL_NAME.fullmatch(name) is None:  # ``$`` alone would let a trailing newline through
        raise ClientError(
            "invalid_value",
            f"Invalid '{param}': string does not match pattern. Expected a string that matches the pattern "
            f"'{TOOL_NAME}'.",
            param,
        )


def tool_name(name: str) -> str:
    """``name`` made a valid function tool name as Codex makes an MCP tool's (``openai/codex`` #8694): each
    character outside ``[a-zA-Z0-9_-]`` becomes ``_``, cut to 64."""
    return _NOT_TOOL_NAME.sub("_", name)[:MAX_TOOL_NAME] or "_"


def check_at_least(param: str, value: int | None, floor: int) -> None:
    """``integer_below_min_value`` in OpenAI's words ("Invalid 'max_output_tokens': integer below minimum
    value. Expected a value >= 16, but got 10 instead.") when ``value`` is below ``floor``."""
    if value is not None and value < floor:  # the message names the field as OpenAI does, on every transport
        raise out_of_range(param, value, floor, above=False, name=param.removeprefix("$."))


def out_of_range(
    param: str, value: object, bound: object, above: bool, name: str | None = None
) -> ClientError:
    """An integer past a documented bound, in OpenAI's code and words: ``integer_above_max_value`` ("Invalid
    'n': integer above maximum value. Expected a value <= 128, but got 130 instead.") or
    ``integer_below_min_value``. ``name``: the field as OpenAI spells it in the message (default
    ``param``; the long-lived protocol's ``param`` is a JSONPath); ``value`` None when it is not known."""
    name = param if name is None else name
    got = "" if value is None else f", but got {value} instead"
    if above:
        code, words, relation = "integer_above_max_value", "integer above maximum value", "<="
    else:
        code, words, relation = "integer_below_min_value", "integer below minimum value", ">="
    return ClientError(code, f"Invalid '{name}': {words}. Expected a value {relation} {bound}{got}.", param)
