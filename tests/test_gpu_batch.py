"""Batch slots alone: FIFO hand-off, the waiting bound, cancellation."""

import asyncio

import pytest

from sampler.batch import BatchSlots
from sampler.engine import EngineOverloaded


async def test_fifo_hand_off() -> None:
    slots = BatchSlots(max_running=1, max_waiting=10)
    await slots.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        await slots.acquire()
        order.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert slots.waiting == 3
    for _ in range(3):
        slots.release()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2] and slots.running == 1


async def test_newcomer_cannot_overtake_a_handed_slot() -> None:
    slots = BatchSlots(max_running=1, max_waiting=10)
    await slots.acquire()
    first = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to `first`, which has not run yet
    late = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    await first
    assert not late.done() and slots.waiting == 1
    slots.release()
    await late


async def test_overloaded_past_max_waiting() -> None:
    slots = BatchSlots(max_running=1, max_waiting=1)
    await slots.acquire()
    queued = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    with pytest.raises(EngineOverloaded):
        await slots.acquire()
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert slots.waiting == 0 and slots.running == 1


async def test_cancelled_after_hand_off_passes_the_slot_on() -> None:
    slots = BatchSlots(max_running=1, max_waiting=10)
    await slots.acquire()
    a = asyncio.create_task(slots.acquire())
    b = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # a gets the slot ...
    a.cancel()  # ... but is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await a
    await b
    assert slots.running == 1 and slots.waiting == 0
