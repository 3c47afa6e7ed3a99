"""A stream's tokens inside an item go out from the engine's timer, not through the response's task (the
driver's fast path, at the sampler's ``Wait``; docs/architecture.md, "The fast path"): the same events, in
the same order, with the same sequence numbers and text — the same bytes — whichever way each went; a sink
with no room takes none that way, and the task sends them."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence

import pytest

from proto.core import codec
from proto.core.events import OutputTextDelta, OutputTextDone, ServerEvent
from proto.core.work import WorkCounters
from proto.server.config import Settings
from proto.server.designs import DESIGNS
from proto.server.driver import ResponseDriver
from proto.server.pipeline import Context, Pipeline
from proto.server.transports.http import _OneRequest
from sampler.clock import loop_timer
from sampler.engine import PacedSequence

MODEL = "mock-4000tps"
TEXT = " ".join(f"word{i}" for i in range(60))


class Recording(_OneRequest):
    """HTTP's sink (a response that ends at its first call, nothing appended), recording every event and
    which way it came (``send``: the task; ``offer``: the timer), with room for ``room`` events an offer."""

    def __init__(self, room: int) -> None:
        super().__init__(None)
        self._room = room
        self.events: list[tuple[str, ServerEvent]] = []

    async def send(self, events: Sequence[ServerEvent]) -> None:
        self.events.extend(("task", event) for event in events)

    def offer(self, events: Sequence[ServerEvent]) -> bool:
        if len(events) > self._room:
            return False
        self.events.extend(("timer", event) for event in events)
        return True


async def stream(
    room: int, paced: bool = True, script: str = f"!say {TEXT}"
) -> list[tuple[str, ServerEvent]]:
    """One response's events, fixed ids: two runs of the same script give the same bytes. ``paced=False``:
    the engine is not offered as a ``PacedSequence``, so every token goes the task's way."""
    pipeline = Pipeline(
        Settings(
            db=":memory:",
            model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0,tokens-per-second=2000"],
        )
    )
    await pipeline.start()
    try:
        body = codec.decode_body(json.dumps({"model": MODEL, "input": f"Say it.\n{script}"}))
        prepared = await pipeline.prepare(
            Context(
                "resp_direct", body, DESIGNS["longlived"], codec.decode_items(body.input), WorkCounters(), {}
            )
        )
        if not paced:
            prepared.rollout.sequence = Unpaced(prepared.rollout.sequence)  # type: ignore[assignment]
        transport = Recording(room)
        terminal = await ResponseDriver(pipeline, prepared, transport, "key").run()
        assert type(terminal).__struct_config__.tag == "response.completed"
        return transport.events
    finally:
        await pipeline.aclose()


class Unpaced:
    """A GPU sequence that hides ``run_paced``: the loop runs its turns with ``run_turn``."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "run_paced":
            raise AttributeError(name)
        return getattr(self._inner, name)


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
    # only deltas inside the item
    assert all(tag(event) == "response.output_text.delta" for event in by_timer)
    if room:
        # Every delta but the item's first (it opens the item) and its last (it ends it) may go by the timer;
        # a wake-up that came late with several tokens still does. The task frames the rest, and whatever
        # is due already when it resumes the engine (on a loaded box, a few wake-ups' worth).
        assert len(by_timer) >= len(deltas) * 3 // 4 and len(deltas) > 40
    else:
        assert by_timer == []  # no room: every event waits its turn through the task


_ITEM_ID = re.compile(rb"\b(?:msg|rs|fc|ctc|ws)_[0-9a-f]{24}\b")


def _frames(events: list[tuple[str, ServerEvent]]) -> list[bytes]:
    """The frames as the wire carries them (``codec.encode``), with the random item ids replaced by stable
    ones in order of appearance; the Response snapshots (timings, ``created_at``) left out: what differs
    between two runs by nature, not by path."""
    ids: dict[bytes, bytes] = {}
    out = []
    for _way, event in events:
        if tag(event) in {"response.created", "response.in_progress", "response.completed"}:
            continue
        out.append(_ITEM_ID.sub(lambda m: ids.setdefault(m.group(), b"id%d" % len(ids)), codec.encode(event)))
    return out


@pytest.mark.parametrize("script", [f"!say {TEXT}", f"!reason 30 !say {TEXT}", "!tokens 200"])
async def test_the_timer_and_the_task_frame_a_turn_byte_for_byte_alike(script: str) -> None:
    """One producer: the same turn streamed with the fast path (most tokens by the timer) and without it
    (every token through the task) gives the same frames."""
    fast = await stream(1_000, paced=True, script=script)
    slow = await stream(1_000, paced=False, script=script)
    assert any(way == "timer" for way, _ in fast) and all(way == "task" for way, _ in slow)
    assert _frames(fast) == _frames(slow)


def test_the_gpu_is_paced_and_the_wrapper_is_not() -> None:
    from sampler.gpu import MockGPU
    from sampler.models import resolve_model

    gpu = MockGPU(resolve_model(MODEL))
    assert isinstance(gpu.open(), PacedSequence)
    assert not isinstance(Unpaced(gpu.open()), PacedSequence)


async def test_a_cancel_that_lands_before_a_due_call_in_the_same_loop_turn_stops_it() -> None:
    """The client's cancel is handled just before the timer's fire in one loop iteration: the task's wait
    is cancelled but the task has not run yet. The due call must take nothing more, and fail nothing."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    pipeline = Pipeline(
        Settings(
            db=":memory:",
            model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0,tokens-per-second=500"],
        )
    )
    await pipeline.start()
    try:  # a 10 s stream, 2 ms a token: ample time for five timer-paced tokens on a loaded machine
        body = codec.decode_body(json.dumps({"model": MODEL, "input": "Say it.\n!tokens 5000"}))
        prepared = await pipeline.prepare(
            Context(
                "resp_race", body, DESIGNS["longlived"], codec.decode_items(body.input), WorkCounters(), {}
            )
        )
        sink = Recording(1_000)
        task = asyncio.create_task(ResponseDriver(pipeline, prepared, sink, "key").run())
        while sum(way == "timer" for way, _ in sink.events) < 5:
            assert not task.done(), "the stream ended before the timer paced five tokens"
            await asyncio.sleep(0.001)
        time.sleep(0.008)  # noqa: ASYNC251 - block the loop past the next step: the timerfd is readable at the next poll
        loop.call_soon(task.cancel)  # runs before the fire the poll will queue behind it
        before = len(sink.events)
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.005)
        assert len(sink.events) == before and reported == []
        timer = loop_timer(loop)
        assert timer is not None and timer.pending == 0
        assert pipeline.engines.gpus[MODEL].metrics()["running"] == 0
    finally:
        await pipeline.aclose()


class Raising(Recording):
    def offer(self, events: Sequence[ServerEvent]) -> bool:
        raise ValueError("a bug in the sink")


async def test_a_bug_on_the_timer_fails_the_response_in_its_task() -> None:
    pipeline = Pipeline(
        Settings(
            db=":memory:",
            model_override=[f"{MODEL}:prefill-overhead=1,prefill-time-per-token=0,tokens-per-second=2000"],
        )
    )
    await pipeline.start()
    try:
        body = codec.decode_body(json.dumps({"model": MODEL, "input": f"Say it.\n!say {TEXT}"}))
        prepared = await pipeline.prepare(
            Context(
                "resp_bug", body, DESIGNS["longlived"], codec.decode_items(body.input), WorkCounters(), {}
            )
        )
        terminal = await ResponseDriver(pipeline, prepared, Raising(1_000), "key").run()
        assert tag(terminal) == "response.failed"
        assert pipeline.engines.gpus[MODEL].metrics()["running"] == 0
    finally:
        await pipeline.aclose()
