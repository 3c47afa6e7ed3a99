"""Arguments the mock model writes for a tool call no directive spells out: a JSON value generated from
the tool's JSON schema, valid against it, the same for the same seed (``random.Random`` seeded by the
caller from sha256, never Python's salted ``hash``).

The subset of JSON Schema OpenAI's strict mode admits ("Supported schemas" in the Structured Outputs
guide) is covered: ``type`` (one or a list), ``enum``, ``const``, ``anyOf``/``oneOf`` (the first branch),
``allOf`` of objects, ``properties``/``required``, ``items``, ``minItems``/``maxItems``, ``minimum``/
``maximum`` (and their exclusive forms), ``minLength``/``maxLength``, local ``$ref`` into ``$defs``.
A ``pattern`` or ``format`` is not solved for: such a string is the one thing generated here that may not
validate. Every property is filled (strict mode makes every property required), optional ones included.
"""

from __future__ import annotations

import random
from typing import Any

_WORDS = ("alpha", "bravo", "cobalt", "delta", "ember", "falcon", "granite", "harbor", "indigo", "juniper")
_MAX_DEPTH = 8  # a recursive schema ($ref to itself) stops here with the smallest value it admits


def value_for(schema: Any, rng: random.Random, root: Any = None, depth: int = 0) -> Any:
    """A value valid against ``schema`` (a JSON Schema as a dict; ``True``/``{}`` admit anything)."""
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return {}
    if "$ref" in schema:
        return value_for(_resolve(root, schema["$ref"]), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return value_for(schema[key][0], rng, root, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            part = _resolve(root, part["$ref"]) if isinstance(part, dict) and "$ref" in part else part
            if isinstance(part, dict):
                merged = {
                    **merged,
                    **part,
                    "properties": {**merged.get("properties", {}), **part.get("properties", {})},
                    "required": [*merged.get("required", []), *part.get("required", [])],
                }
        return value_for(merged, rng, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or ["null"]
        kind = kinds[0]
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _GENERATORS.get(kind, _string)(schema, rng, root, depth)


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return {}
    node = root
    for part in ref.lstrip("#/").split("/"):
        if not part:
            continue
        node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
    return node


def _object(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> dict[str, Any]:
    props = schema.get("properties") or {}
    if depth >= _MAX_DEPTH:
        props = {name: props[name] for name in schema.get("required", []) if name in props}
    return {name: value_for(sub, rng, root, depth + 1) for name, sub in props.items()}


def _array(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> list[Any]:
    low = int(schema.get("minItems", 0))
    high = int(schema.get("maxItems", max(low, 2)))
    count = low if depth >= _MAX_DEPTH else rng.randint(low, max(low, min(high, low + 2)))
    return [value_for(schema.get("items", {}), rng, root, depth + 1) for _ in range(count)]


def _integer(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> int:
    low, high = _bounds(schema, integer=True)
    return rng.randint(int(low), int(high))


def _number(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> float:
    low, high = _bounds(schema, integer=False)
    return round(rng.uniform(low, high), 3) if low < high else float(low)


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    step = 1 if integer else 1e-3
    low = schema.get("minimum", schema["exclusiveMinimum"] + step if "exclusiveMinimum" in schema else None)
    high = schema.get("maximum", schema["exclusiveMaximum"] - step if "exclusiveMaximum" in schema else None)
    if integer:
        low = None if low is None else -(-low // 1)  # ceil
        high = None if high is None else high // 1
    low = 0 if low is None else low if high is None or low <= high else high
    high = max(low, 100) if high is None else high
    return low, high


def _string(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> str:
    low, high = int(schema.get("minLength", 0)), int(schema.get("maxLength", 64))
    text = rng.choice(_WORDS)
    while len(text) < low:
        text += " " + rng.choice(_WORDS)
    return text[: max(low, min(high, len(text)))]


def _boolean(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> bool:
    return rng.random() < 0.5


def _null(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> None:
    return None


_GENERATORS = {
    "object": _object,
    "array": _array,
    "integer": _integer,
    "number": _number,
    "string": _string,
    "boolean": _boolean,
    "null": _null,
}
