"""What the server echoes of a request validates against the Response schema (docs/protocol.md,
"Conformance"), over a real server: ``text`` given only its ``verbosity`` comes back with OpenAI's
``format`` filled in, and an ``input_image`` part comes back with ``image_url`` (null for a ``file_id``) and
``detail`` ("auto" when the request left it out) from every place that echoes it: ``input_items``, a
conversation's items, ``/responses/compact``, and a continuation's compaction of a stored chain.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import plain_server
import pytest
from helpers import MODEL
from spec import check_compact, check_conversation_object, check_response, check_schema

PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a")).decode()  # a PNG signature: the part's source
IMAGES = [
    {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},  # no detail
    {"type": "input_image", "file_id": "file_abc123", "detail": None},  # null reads as absent
    {"type": "input_image", "image_url": "https://example.test/cat.png", "detail": "low"},
]
MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "!say seen"}, *IMAGES]}

srv, http = plain_server.srv, plain_server.http  # the module's server and its httpx client (fixtures)


def assert_images_echoed(content: list[dict[str, Any]]) -> None:
    """The three parts as OpenAI returns them: every one with ``image_url`` and ``detail``, each a valid
    Open Responses ``InputImageContent``."""
    images = [part for part in content if part["type"] == "input_image"]
    for part in images:
        check_schema(part, "InputImageContent")
    assert [(part["image_url"], part["detail"]) for part in images] == [
        (IMAGES[0]["image_url"], "auto"),
        (None, "auto"),
        (IMAGES[2]["image_url"], "low"),
    ], images
    assert images[1]["file_id"] == "file_abc123"


@pytest.mark.process
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_text_with_only_verbosity_is_echoed_with_its_format(
    http: httpx.AsyncClient, stream: bool
) -> None:
    body = {"model": MODEL, "input": "!say hi", "text": {"verbosity": "high"}, "stream": stream}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    if stream:
        done = [
            line
            for line in reply.text.splitlines()
            if line.startswith("data:") and "response.completed" in line
        ]
        response = httpx.Response(200, content=done[-1][5:]).json()["response"]
    else:
        response = reply.json()
    assert response["text"] == {"format": {"type": "text"}, "verbosity": "high"}
    check_response(response)
    stored = (await http.get(f"/v1/responses/{response['id']}")).json()
    assert stored["text"] == response["text"]
    check_response(stored)


@pytest.mark.process
async def test_image_parts_are_echoed_with_url_and_detail(http: httpx.AsyncClient) -> None:
    reply = await http.post("/v1/responses", json={"model": MODEL, "input": [MESSAGE]})
    assert reply.status_code == 200, reply.text
    check_response(reply.json())
    items = (await http.get(f"/v1/responses/{reply.json()['id']}/input_items")).json()["data"]
    assert_images_echoed(items[0]["content"])

    compacted = await http.post("/v1/responses/compact", json={"model": MODEL, "input": [MESSAGE]})
    assert compacted.status_code == 200, compacted.text
    check_compact(compacted.json())
    assert_images_echoed(compacted.json()["output"][0]["content"])
    # The stored chain, decoded and re-encoded: the echo is the same.
    chained = await http.post(
        "/v1/responses/compact",
        json={"model": MODEL, "previous_response_id": reply.json()["id"], "input": "more"},
    )
    assert chained.status_code == 200, chained.text
    check_compact(chained.json())
    assert_images_echoed(chained.json()["output"][0]["content"])

    conversation = (await http.post("/v1/conversations", json={"items": [MESSAGE]})).json()
    listed = (await http.get(f"/v1/conversations/{conversation['id']}/items")).json()
    check_conversation_object(listed)
    assert_images_echoed(listed["data"][0]["content"])
