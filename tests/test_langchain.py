"""LangChain's ``ChatOpenAI(use_responses_api=True)`` (langchain-openai, pinned in pyproject's ``clients``
extra), unmodified, against ``responses-lab serve`` over HTTP (it has no WebSocket transport): a tool loop
with ``bind_tools`` continued by a second user turn, with the whole history re-sent and with
``use_previous_response_id`` (only the messages after the last response, chained by its id);
``with_structured_output``; and streaming. The server's log (``response_ended``'s ``mode``: ``http`` for a
whole history, ``http-prev`` for a chained one) says how each response was served. Configuration, as a user
writes it: docs/clients.md."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from client_cases import TWO_TURNS, Weather
from codex import KEY, LabServer, lab_process
from helpers import MODEL

pytestmark = pytest.mark.process  # every test starts a server or a process


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with lab_process(tmp_path_factory.mktemp("langchain")) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """The case's own HTTP client, closed with it (ChatOpenAI's default one is cached process-wide and would
    outlive the case's event loop)."""
    async with httpx.AsyncClient() as client:
        yield client


def chat(server: LabServer, http: httpx.AsyncClient, **extra: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL,
        base_url=server.base_url,
        api_key=KEY,
        use_responses_api=True,
        max_retries=0,
        http_async_client=http,
        **extra,
    )


@pytest.mark.parametrize("chained", [False, True], ids=["history", "previous_response_id"])
async def test_tool_loop_then_a_second_turn(srv: LabServer, http: httpx.AsyncClient, chained: bool) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    calls: list[str] = []

    @tool
    def grep(pattern: str) -> str:
        """Search the code for a pattern."""
        calls.append(f"grep {pattern}")
        return f"a.py:1: {pattern}"

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        calls.append(f"read_file {path}")
        return f"contents of {path}"

    tools = {t.name: t for t in (grep, read_file)}
    model = chat(srv, http, use_previous_response_id=chained).bind_tools(list(tools.values()))
    mark = srv.mark()
    messages: list[Any] = [HumanMessage(TWO_TURNS)]
    answers = []
    for follow_up in ("And the file?", None):
        reply = await model.ainvoke(messages)
        messages.append(reply)
        while reply.tool_calls:
            for call in reply.tool_calls:
                messages.append(
                    ToolMessage(tools[call["name"]].invoke(call["args"]), tool_call_id=call["id"])
                )
            reply = await model.ainvoke(messages)
            messages.append(reply)
        answers.append(reply.text)
        if follow_up:
            messages.append(HumanMessage(follow_up))
    assert calls == ["grep def mean", "read_file a.py"]
    assert answers == ["Found it.", "Read it."]
    lines = srv.ended_since(mark)
    assert [line["calls"] for line in lines] == [["grep"], [], ["read_file"], []], lines
    modes = ["http", "http-prev", "http-prev", "http-prev"] if chained else ["http"] * 4
    assert [line["mode"] for line in lines] == modes, lines


async def test_with_structured_output(srv: LabServer, http: httpx.AsyncClient) -> None:
    mark = srv.mark()
    structured = chat(srv, http).with_structured_output(Weather)
    weather = await structured.ainvoke('Weather?\n!json {"city": "Oslo", "celsius": -3}')
    assert weather == Weather(city="Oslo", celsius=-3)
    assert [line["mode"] for line in srv.ended_since(mark)] == ["http"]


async def test_streaming(srv: LabServer, http: httpx.AsyncClient) -> None:
    mark = srv.mark()
    chunks = [
        chunk.text async for chunk in chat(srv, http, streaming=True).astream("!say Streamed answer here.")
    ]
    text = [chunk for chunk in chunks if chunk]
    assert len(text) > 1 and "".join(text) == "Streamed answer here.", chunks
    assert [line["mode"] for line in srv.ended_since(mark)] == ["http"]
