"""A bounded Schemathesis run over the vendored Open Responses spec (tests/openresponses/openapi.json):
requests generated from its two HTTP operations (``POST /responses``, ``POST /responses/compact``; valid and
invalid bodies, JSON and form-encoded) against a real server on loopback.

No reply may be a 5xx (``not_a_server_error``), and a body the spec makes invalid must be refused with a
4xx (``negative_data_rejection``) unless what makes it invalid is in ``ACCEPTED``: each entry is a documented
difference (docs/protocol.md, "Conformance": the server follows OpenAI where the spec is stricter) or a
known gap, named there as one. A new kind of accepted invalid body fails the test.

Every echo is checked too (``echo_conforms``): an accepted create's Response (JSON, or each SSE event) and
a compaction validate against the spec's schemas (``tests/spec.py``: OpenAI's extensions checked as
OpenAI's), and hold no integer outside int64. Each stored create is then followed along the spec's
missing links, create → retrieve → ``input_items`` → delete → retrieve (404): the retrieved Response
conforms and equals the created one, each input item's images are the spec's ``InputImageContent``.

The spec's bounds per field are refused one field at a time (``test_each_bounded_field_refuses_its_
violations``): each integer and number of the create body with a ``minimum``/``maximum``, just past it
and far past it (2⁶⁴), an ``enum`` string off its values — deterministic, where the generated bodies
reach a given field's bound only by chance.

Size: ``MAX_EXAMPLES`` per operation and generation mode, plus Schemathesis's coverage phase; derandomized,
so every run sends the same ~2 600 requests (~16 s of CPU, ~25 s on 2 idle cores).
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from helpers import MODEL, running
from schemathesis import GenerationMode
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.specs.openapi.checks import negative_data_rejection
from spec import check_compact, check_event, check_response, check_schema, spec

from proto.server.serve import ThreadedServer

SPEC = Path(__file__).resolve().parent / "openresponses" / "openapi.json"
MAX_EXAMPLES = 25

# What makes an accepted body invalid under the spec ("Invalid component: …") -> why it is accepted.
ACCEPTED: dict[str, str] = {
    r"Missing required property: type$": (
        "OpenAI's type-less {role, content} is a message; a part in a list of one part type needs no type"
    ),
    r"\b(phase|annotations): Incorrect type$": "null for an optional field reads as absent (OpenAI's SDK)",
    r"\bname: String (larger than maxLength|smaller than minLength)$": (
        "gap: the spec's lengths of an input item's name are not enforced"
    ),
    r"\bname: Value not matching the '.*' pattern$": "gap: an input item's name pattern is not enforced",
    r"\b(start_index|end_index): Value smaller than minimum$": "gap: annotation indexes unchecked",
}
ACCEPTED_PATTERNS = [re.compile(pattern) for pattern in ACCEPTED]

schema = schemathesis.openapi.from_path(SPEC)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=MAX_EXAMPLES, deterministic=True
)
STATUSES: collections.Counter[int] = collections.Counter()


def rejects_invalid(ctx: CheckContext, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """``negative_data_rejection``, except for the invalid components in ``ACCEPTED``."""
    try:
        negative_data_rejection(ctx, response, case)
    except AcceptedNegativeData as failure:
        components = re.findall(r"Invalid component: (.*)", failure.message)
        if not components or not all(any(p.search(c) for p in ACCEPTED_PATTERNS) for c in components):
            raise


@pytest.fixture(scope="module")
def srv() -> Iterator[ThreadedServer]:
    with running() as server:
        yield server
    print(f"schemathesis: {sum(STATUSES.values())} requests, statuses {dict(STATUSES)}")


INT64 = range(-(2**63), 2**63)


def int64_only(value: Any, where: str = "$") -> None:
    """Every integer in ``value`` (a JSON document) fits an int64: what a typed client can read back."""
    if isinstance(value, dict):
        for key, inner in value.items():
            int64_only(inner, f"{where}.{key}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            int64_only(inner, f"{where}[{index}]")
    elif isinstance(value, int) and not isinstance(value, bool):
        assert value in INT64, f"{where}: {value} is outside int64"


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def echo_conforms(ctx: CheckContext, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """An accepted request's echo validates against the spec's schemas, with no integer past int64."""
    del ctx
    if response.status_code != 200:
        return
    if case.operation.path == "/responses/compact":
        check_compact(response.json())
        int64_only(response.json())
    elif response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        for event in sse_events(response.text):
            check_event(event, "sse")
            int64_only(event)
    else:
        check_response(response.json())
        int64_only(response.json())


def follow_links(http: httpx.Client, created: dict[str, Any]) -> None:
    """create → retrieve → input_items → delete → retrieve: the links the spec leaves out."""
    path = f"/v1/responses/{created['id']}"
    retrieved = http.get(path)
    assert retrieved.status_code == 200, retrieved.text
    check_response(retrieved.json())
    int64_only(retrieved.json())
    assert {key: value for key, value in retrieved.json().items() if key != "lab"} == {
        key: value for key, value in created.items() if key != "lab"
    }
    items = http.get(f"{path}/input_items")
    assert items.status_code == 200, items.text
    int64_only(items.json())
    for item in items.json()["data"]:
        assert isinstance(item.get("id"), str), item
        for part in item.get("content") or []:
            if isinstance(part, dict) and part.get("type") == "input_image":
                check_schema(part, "InputImageContent")
    deleted = http.delete(path)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True, deleted.text
    assert http.get(path).status_code == 404


def positive(case: schemathesis.Case) -> bool:
    return case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE


def _call(case: schemathesis.Case, srv: ThreadedServer) -> None:
    if isinstance(case.body, dict) and (isinstance(case.body.get("model"), str) or positive(case)):
        # A model this server has, so valid bodies reach the model (the spec makes ``model`` optional;
        # OpenAI's create requires it, and so does this server: docs/protocol.md, "Conformance").
        case.body["model"] = MODEL
    reply = case.call_and_validate(
        base_url=srv.http_url + "/v1", checks=[not_a_server_error, rejects_invalid, echo_conforms], timeout=30
    )
    STATUSES[reply.status_code] += 1
    if case.operation.path != "/responses" or reply.status_code != 200:
        return
    if reply.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        created = next(
            (e["response"] for e in sse_events(reply.text) if e.get("type") == "response.completed"), None
        )
    else:
        created = reply.json()
    if created is not None and created.get("store") and created.get("status") == "completed":
        with httpx.Client(base_url=srv.http_url, timeout=30) as http:
            follow_links(http, created)
            STATUSES[0] += 4  # the four follow-up requests (counted apart: status "0")


# One test function per operation: Schemathesis gives its per-operation items the same node id, which
# pytest-xdist would run only once.
@pytest.mark.process
@schema.include(path="/responses").parametrize()
def test_create(case: schemathesis.Case, srv: ThreadedServer) -> None:
    _call(case, srv)


@pytest.mark.process
@schema.include(path="/responses/compact").parametrize()
def test_compact(case: schemathesis.Case, srv: ThreadedServer) -> None:
    _call(case, srv)


def _resolved(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema with a ``$ref`` (or an ``allOf`` of one) replaced by the component it names."""
    refs = [part["$ref"] for part in schema.get("allOf", [schema]) if "$ref" in part]
    if len(refs) != 1:
        return schema
    component: dict[str, Any] = spec()["components"]["schemas"][refs[0].rsplit("/", 1)[1]]
    return component


def _bounded_fields() -> list[tuple[str, Any]]:
    """(field, value past its bound) for each bounded scalar of the spec's create body."""
    cases: list[tuple[str, Any]] = []
    for name, schema in spec()["components"]["schemas"]["CreateResponseBody"]["properties"].items():
        for option in map(_resolved, schema.get("anyOf", [schema])):
            kind = option.get("type")
            if kind in ("integer", "number"):
                if "minimum" in option:
                    cases.append((name, option["minimum"] - 1))
                    cases.append((name, -(2**64)))
                if "maximum" in option:
                    cases.append((name, option["maximum"] + 1))
                    cases.append((name, 2**64))
            elif kind == "string" and "enum" in option:
                cases.append((name, "not-" + "-".join(option["enum"])))
    return cases


BOUNDED = _bounded_fields()


@pytest.mark.process
@pytest.mark.parametrize(("field", "value"), BOUNDED, ids=[f"{f}={v}" for f, v in BOUNDED])
def test_each_bounded_field_refuses_its_violations(srv: ThreadedServer, field: str, value: Any) -> None:
    body = {"model": MODEL, "input": "!say hi", field: value}
    reply = httpx.post(srv.http_url + "/v1/responses", json=body, timeout=30)
    assert reply.status_code == 400, (field, value, reply.text[:300])
    assert reply.json()["error"]["param"] == field, reply.json()


def test_the_bound_cases_cover_the_fields_the_spec_bounds() -> None:
    assert {field for field, _ in BOUNDED} >= {  # the fields OpenAI bounds, as the spec states
        "top_logprobs",
        "max_tool_calls",
        "max_output_tokens",
    }


def test_the_spec_has_no_operation_left_out() -> None:
    assert sorted(op.ok().path for op in schema.get_all_operations()) == ["/responses", "/responses/compact"]
