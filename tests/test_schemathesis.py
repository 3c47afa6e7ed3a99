"""A bounded Schemathesis run over the vendored Open Responses spec (tests/openresponses/openapi.json):
requests generated from its two HTTP operations (``POST /responses``, ``POST /responses/compact``; valid and
invalid bodies, JSON and form-encoded) against a real server on loopback.

No reply may be a 5xx (``not_a_server_error``), and a body the spec makes invalid must be refused with a
4xx (``negative_data_rejection``) unless what makes it invalid is in ``ACCEPTED``: each entry is a documented
difference (docs/protocol.md, "Conformance": the server follows OpenAI where the spec is stricter) or a
known gap, named there as one. A new kind of accepted invalid body fails the test.

Size: ``MAX_EXAMPLES`` per operation and generation mode, plus Schemathesis's coverage phase; derandomized,
so every run sends the same ~2 200 requests (about 10 s on 2 cores).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from helpers import MODEL, running
from schemathesis import GenerationMode
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.specs.openapi.checks import negative_data_rejection

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


def _call(case: schemathesis.Case, srv: ThreadedServer) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL  # a model this server has, so valid bodies reach the model
    reply = case.call_and_validate(
        base_url=srv.http_url + "/v1", checks=[not_a_server_error, rejects_invalid], timeout=30
    )
    STATUSES[reply.status_code] += 1


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


def test_the_spec_has_no_operation_left_out() -> None:
    assert sorted(op.ok().path for op in schema.get_all_operations()) == ["/responses", "/responses/compact"]
