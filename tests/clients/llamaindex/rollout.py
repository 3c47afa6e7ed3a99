"""LlamaIndex's ``OpenAIResponses`` (llama-index-llms-openai, pinned in requirements.txt beside this file),
unmodified, driven by tests/test_llamaindex.py: one case name a line on stdin, one JSON line of what the
client did on stdout. It runs in its own environment (the Makefile's ``clients`` target makes it under
.cache/clients/llamaindex): llama-index-llms-openai requires openai < 3, the project's environment has 3.x.

Configuration, as a user writes it (docs/clients.md): ``OpenAIResponses(model=..., api_base=...,
api_key=..., context_window=...)``; an unknown model name needs ``context_window`` (else ValueError)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pydantic
from llama_index.core.agent.workflow import AgentStream, FunctionAgent
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import Memory
from llama_index.core.prompts import PromptTemplate
from llama_index.llms.openai import OpenAIResponses

TWO_TURNS = (
    'Find the mean.\n!call grep {"pattern": "def mean"}\n!say Found it.\n'
    '!call read_file {"path": "a.py"}\n!say Read it.'
)


class Weather(pydantic.BaseModel):
    city: str
    celsius: int


def llm(**extra: Any) -> OpenAIResponses:
    return OpenAIResponses(
        model=os.environ["LAB_MODEL"],
        api_base=os.environ["LAB_BASE_URL"],
        api_key=os.environ["LAB_API_KEY"],
        context_window=128_000,
        max_retries=0,
        **extra,
    )


def agent(calls: list[str]) -> FunctionAgent:
    def grep(pattern: str) -> str:
        """Search the code for a pattern."""
        calls.append(f"grep {pattern}")
        return f"a.py:1: {pattern}"

    def read_file(path: str) -> str:
        """Read a file."""
        calls.append(f"read_file {path}")
        return f"contents of {path}"

    return FunctionAgent(tools=[grep, read_file], llm=llm(), system_prompt="Be brief.")


async def tool_loop() -> dict[str, Any]:
    """A FunctionAgent's tool loop, then a second user turn with the same ``Memory`` (the history re-sent).
    (A second ``run`` given the first's ``Context`` instead re-sent none of the first run's messages.)"""
    calls: list[str] = []
    fixer = agent(calls)
    memory = Memory.from_defaults(session_id="lab", token_limit=40_000)
    first = await fixer.run(TWO_TURNS, memory=memory)
    second = await fixer.run("And the file?", memory=memory)
    return {"calls": calls, "answers": [str(first), str(second)]}


async def streamed() -> dict[str, Any]:
    """A streamed agent run (``AgentStream`` deltas), then the LLM's own ``astream_chat``."""
    calls: list[str] = []
    handler = agent(calls).run('Look.\n!call grep {"pattern": "def median"}\n!say Streamed answer here.')
    deltas = [event.delta async for event in handler.stream_events() if isinstance(event, AgentStream)]
    answer = str(await handler)
    chunks = [
        c.delta or ""
        async for c in await llm().astream_chat([ChatMessage(role="user", content="!say A B C")])
    ]
    return {"calls": calls, "answer": answer, "deltas": deltas, "chat_deltas": chunks}


async def structured() -> dict[str, Any]:
    """``astructured_predict``: ``responses.parse`` with the class as a strict ``text.format`` json_schema."""
    directive = "!json " + json.dumps({"city": "Oslo", "celsius": -3})
    weather = await llm().astructured_predict(
        Weather, PromptTemplate("Weather in Oslo?\n{directive}"), directive=directive
    )
    return {"object": weather.model_dump()}


async def previous_response() -> dict[str, Any]:
    """``track_previous_responses``: the second turn sends only its message, chained by the response id."""
    model = llm(track_previous_responses=True)
    first = await model.achat([ChatMessage(role="user", content="Hi.\n!say One.\n!say Two.")])
    second = await model.achat([ChatMessage(role="user", content="Again?")])
    return {"answers": [first.message.content, second.message.content]}


CASES = {
    "tool_loop": tool_loop,
    "streamed": streamed,
    "structured": structured,
    "previous_response": previous_response,
}


def main() -> None:
    loop = asyncio.new_event_loop()  # one loop for every case: a client closed late closes on it
    for line in sys.stdin:
        case = line.strip()
        try:
            result = {"case": case, **loop.run_until_complete(CASES[case]())}
        except Exception as exc:  # the test shows what failed; the next case still runs
            result = {"case": case, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
