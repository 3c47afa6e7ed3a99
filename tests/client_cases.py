"""What the real-client tests share: the two-turn tool loop they script and the structured output they ask
for (tests/test_openai_ws_clients.py, test_pydantic_ai.py, test_langchain.py)."""

from __future__ import annotations

import pydantic

# Two tool turns, then the answer: a tool loop, and a second turn on the same transport.
TWO_TURNS = (
    'Find the mean.\n!call grep {"pattern": "def mean"}\n!say Found it.\n'
    '!call read_file {"path": "a.py"}\n!say Read it.'
)


class Weather(pydantic.BaseModel):
    city: str
    celsius: int
