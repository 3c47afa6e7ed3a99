"""The final answer's tokens leave before the terminal work: when the response is stored (then billed, then
its terminal event encoded), a transport whose writer is another task has already taken every event the
sampler emitted — the driver gives it one loop turn first."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import proto.server.driver
from proto.core import codec
from proto.core.events import ServerEvent
from proto.core.items import Item
from proto.core.longlived import Cancel
from proto.core.work import WorkCounters
from proto.server.config import Settings
from proto.server.driver import ResponseDriver
from proto.server.pipeline import Pipeline

MODEL = "mock-4000tps"


class QueuedTransport:
    """SSE's shape: events go to a queue that a writer task drains."""

    suspends = False

    def __init__(self) -> None:
        self.queue: asyncio.Queue[ServerEvent] = asyncio.Queue()
        self.written: list[str] = []

    def opened(self) -> bool:
        return True

    async def send(self, events: Sequence[ServerEvent]) -> None:
        for event in events:
            self.queue.put_nowait(event)

    def offer(self, events: Sequence[ServerEvent]) -> bool:
        for event in events:
            self.queue.put_nowait(event)
        return True

    def queued(self) -> list[Item]:
        return []

    def cut(self) -> Cancel | None:
        return None

    async def writer(self) -> None:
        while True:
            event = await self.queue.get()
            self.written.append(type(event).__struct_config__.tag)  # type: ignore[arg-type]


async def test_every_emitted_event_is_written_before_the_response_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = Pipeline(
        Settings(db=":memory:", model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0"])
    )
    await pipeline.start()
    transport = QueuedTransport()
    seen_at_store: list[list[str]] = []
    persist = proto.server.driver.persist_response

    async def store(*args: Any) -> None:
        assert transport.queue.empty()  # nothing emitted is still waiting for the writer
        seen_at_store.append(list(transport.written))
        await persist(*args)

    monkeypatch.setattr(proto.server.driver, "persist_response", store)
    writer = asyncio.create_task(transport.writer())
    try:
        body = codec.decode_body(f'{{"model": "{MODEL}", "input": "Answer.\\n!tokens 3 !say all done"}}')
        work = WorkCounters()
        prepared = await pipeline.prepare(
            "resp_flush",
            body,
            [],
            codec.decode_items(body.input),
            work,
            "http",
            scan_history=True,
            tenant="key",
        )
        terminal = await ResponseDriver(pipeline, prepared, transport, "key").run()
        assert type(terminal).__struct_config__.tag == "response.completed"
        (written,) = seen_at_store
        assert written[-3:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
        assert written.count("response.output_text.delta") == 3
    finally:
        writer.cancel()
        await pipeline.aclose()
