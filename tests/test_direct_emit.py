"""A stream's tokens inside an item go out from the GPU's timer, not through the response's task
(``sampler.loop.Direct``, ``GpuSequence.run_turn``'s ``take``): the same events, in the same order, with
the same sequence numbers and text, whichever way each went; a transport with no room takes none that way."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from proto.core import codec
from proto.core.events import OutputTextDelta, OutputTextDone, ServerEvent
from proto.core.work import WorkCounters
from proto.server.config import Settings
from proto.server.driver import ResponseDriver
from proto.server.pipeline import Pipeline
from proto.server.transports.http import _OneRequest

MODEL = "mock-4000tps"
TEXT = " ".join(f"word{i}" for i in range(60))


class Recording(_OneRequest):
    """HTTP's transport (a response that ends at its first call, nothing appended), recording every event
    and which way it came (``send``: the task; ``send_now``: the timer), with a fixed ``room()``."""

    def __init__(self, room: int) -> None:
        super().__init__(None)
        self._room = room
        self.events: list[tuple[str, ServerEvent]] = []

    async def send(self, events: Sequence[ServerEvent]) -> None:
        self.events.extend(("task", event) for event in events)

    def room(self) -> int:
        return self._room

    def send_now(self, events: Sequence[ServerEvent]) -> None:
        assert len(events) <= self._room
        self.events.extend(("timer", event) for event in events)


async def stream(room: int) -> list[tuple[str, ServerEvent]]:
    pipeline = Pipeline(Settings(db=":memory:", model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0,tokens-per-second=2000"]))
    await pipeline.start()
    try:
        body = codec.decode_body(json.dumps({"model": MODEL, "input": f"Say it.\n!say {TEXT}"}))
        prepared = await pipeline.prepare("resp_direct", body, [], codec.decode_items(body.input), WorkCounters(), "longlived", scan_history=False)
        transport = Recording(room)
        terminal = await ResponseDriver(pipeline, prepared, transport, "key").run()
        assert type(terminal).__struct_config__.tag == "response.completed"
        return transport.events
    finally:
        await pipeline.aclose()


def tag(event: ServerEvent) -> str:
    return str(type(event).__struct_config__.tag)


# Serial: the mock GPU's timer runs on the real clock (2000 tokens/s), and a wake-up late by CPU contention
# hands its tokens to the task instead (113 of 120 deltas by the timer once, beside another xdist worker).
@pytest.mark.serial
@pytest.mark.parametrize("room", [1_000, 0])
async def test_the_same_events_whichever_way_they_went(room: int) -> None:
    events = await stream(room)
    numbers = [event.sequence_number for _, event in events]
    assert numbers == list(range(len(numbers)))  # one order, no gap, no repeat
    deltas = [event for _, event in events if isinstance(event, OutputTextDelta)]
    assert "".join(event.delta for event in deltas) == TEXT
    done = next(event for _, event in events if isinstance(event, OutputTextDone))
    assert done.text == TEXT
    by_timer = [event for way, event in events if way == "timer"]
    assert all(tag(event) == "response.output_text.delta" for event in by_timer)  # only deltas inside the item
    if room:
        # Every delta but the item's first (it opens the item) and its last (it ends it) may go by the timer;
        # a wake-up that came late with several tokens still does. The task frames the rest.
        assert len(by_timer) >= len(deltas) - 4 and len(deltas) > 40
    else:
        assert by_timer == []  # no room: every event waits its turn through the task
