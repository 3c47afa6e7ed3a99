"""RealClock on real event loops (the default asyncio loop and uvloop): it never returns early, it does
not spin, a cancelled sleeper leaves nothing behind, concurrent sleepers wake in deadline order, and
each loop has its own timer. Behaviour only: no wall-clock speed thresholds (the one CPU figure is a
ratio of CPU time to wall time within the same run)."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import sys
import threading
import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

import pytest

from sampler.clock import RealClock, loop_timer

# Sleeps on the real clock: never early, never spinning (CPU per wall second).
pytestmark = pytest.mark.serial

T = TypeVar("T")
LOOPS = ["asyncio", "uvloop"]
CLOCKS = ["timerfd", "coarse"]  # RealClock() and its documented fallback, RealClock(timerfd=False)
LINUX = sys.platform.startswith("linux")


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "asyncio":
        return asyncio.SelectorEventLoop  # explicit: not whatever an installed policy would give
    try:
        import uvloop
    except ImportError as exc:
        # Not a skip: uvicorn (loop="auto") runs the server on uvloop whenever it is installed, so the
        # clock must be checked there. It is in the dev extras: pip install -e '.[dev]'.
        pytest.fail(f"uvloop cannot be imported ({exc}); the clock must be tested on it", pytrace=False)
    return uvloop.new_event_loop


def run(kind: str, coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        loop = runner.get_loop()
        assert type(loop).__module__.split(".")[0] == kind
        return runner.run(coro)


def make_clock(kind: str) -> RealClock:
    return RealClock(timerfd=kind == "timerfd")


@types.coroutine
def counting_steps(coro: Coroutine[Any, Any, T], steps: list[int]) -> Generator[Any, Any, T]:
    """Await ``coro``, counting how many times it is run (its first start and every resumption)."""
    send: Any = None
    throw: BaseException | None = None
    while True:
        steps[0] += 1
        try:
            yielded = coro.send(send) if throw is None else coro.throw(throw)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            send, throw = (yield yielded), None
        except BaseException as exc:
            send, throw = None, exc


@pytest.mark.parametrize("clock_kind", CLOCKS)
@pytest.mark.parametrize("loop_kind", LOOPS)
def test_never_returns_before_the_deadline(loop_kind: str, clock_kind: str) -> None:
    clock, rng = make_clock(clock_kind), random.Random(7)

    async def main() -> list[float]:
        early = []
        for i in range(300):
            t = clock.now() + (rng.uniform(0.0, 0.003) if i % 10 else rng.uniform(-0.001, 0.0))
            await clock.sleep_until(t)
            if clock.now() < t:
                early.append(t - clock.now())
        return early

    assert run(loop_kind, main()) == []


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_uses_the_timerfd_on_linux(loop_kind: str) -> None:
    async def main() -> None:
        timer = loop_timer(asyncio.get_running_loop())
        assert (timer is not None) == LINUX
        if timer is not None:
            clock = RealClock()
            fires = timer.fires
            await clock.sleep_until(clock.now() + 0.001)
            assert timer.fires == fires + 1 and timer.pending == 0
            # A long sleep: the loop is woken shortly before the deadline too, the sleeper only once.
            fires, steps, t = timer.fires, [0], clock.now() + 0.02
            await counting_steps(clock.sleep_until(t), steps)
            assert clock.now() >= t and steps == [2] and fires + 1 <= timer.fires <= fires + 2
            assert timer.pending == 0 and timer.armed_ns() == 0

    run(loop_kind, main())


def test_a_past_deadline_returns_at_once_without_the_loop() -> None:
    clock = RealClock()
    for t in (clock.now() - 1.0, clock.now()):
        coro = clock.sleep_until(t)
        with pytest.raises(StopIteration):  # finished on its first step: no future, no timer
            coro.send(None)


@pytest.mark.parametrize("clock_kind", CLOCKS)
@pytest.mark.parametrize("loop_kind", LOOPS)
def test_does_not_spin(loop_kind: str, clock_kind: str) -> None:
    """A sleep is resumed a handful of times, not once per loop pass (the old clock yielded ~100s of
    times per sub-millisecond sleep on uvloop); a long sleep burns next to no CPU."""
    clock = make_clock(clock_kind)

    async def main() -> tuple[list[int], list[int], float, float]:
        five_ms = [0]
        await counting_steps(clock.sleep_until(clock.now() + 0.005), five_ms)
        # Deadlines 0.1–0.4 ms ahead: under uvloop's millisecond rounding, where the old clock spun.
        short = []
        for _ in range(50):
            steps = [0]
            await counting_steps(clock.sleep_until(clock.now() + random.uniform(0.0001, 0.0004)), steps)
            short.append(steps[0])
        wall0, cpu0 = time.perf_counter(), time.process_time()
        await clock.sleep_until(clock.now() + 0.2)
        return five_ms, short, time.process_time() - cpu0, time.perf_counter() - wall0

    five_ms, short, cpu, wall = run(loop_kind, main())
    # 2 = started, resumed once when due; the fallback may sleep once more after an early wake-up.
    limit = 2 if clock_kind == "timerfd" else 4
    assert five_ms[0] <= limit
    assert max(short) <= limit, short
    assert cpu < 0.2 * wall, f"{cpu * 1e3:.1f} ms of CPU during a {wall * 1e3:.1f} ms sleep"


@pytest.mark.skipif(not LINUX, reason="the timerfd exists on Linux only")
@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_cancelled_sleeper_leaves_no_timer_behind(loop_kind: str) -> None:
    clock = RealClock()

    async def main() -> None:
        timer = loop_timer(asyncio.get_running_loop())
        assert timer is not None
        soon = asyncio.create_task(clock.sleep_until(clock.now() + 0.5))
        later = asyncio.create_task(clock.sleep_until(clock.now() + 5.0))
        await asyncio.sleep(0.001)
        assert timer.pending == 2 and 0 < timer.armed_ns() <= 500_000_000

        soon.cancel()  # the earliest: the kernel timer moves to the next deadline
        with pytest.raises(asyncio.CancelledError):
            await soon
        assert timer.pending == 1 and timer.armed_ns() > 1_000_000_000

        later.cancel()  # the last one: the kernel timer is disarmed
        with pytest.raises(asyncio.CancelledError):
            await later
        assert timer.pending == 0 and timer.armed_ns() == 0

        # A sleeper that is not the earliest, cancelled: the armed deadline stays the earliest's.
        first = asyncio.create_task(clock.sleep_until(clock.now() + 0.05))
        middle = asyncio.create_task(clock.sleep_until(clock.now() + 3.0))
        await asyncio.sleep(0.001)
        middle.cancel()
        with pytest.raises(asyncio.CancelledError):
            await middle
        assert timer.pending == 1 and 0 < timer.armed_ns() <= 50_000_000
        await first
        assert timer.pending == 0 and timer.armed_ns() == 0

    run(loop_kind, main())


@pytest.mark.skipif(not LINUX, reason="the timerfd exists on Linux only")
@pytest.mark.parametrize("loop_kind", LOOPS)
def test_cancelled_just_as_it_is_woken(loop_kind: str) -> None:
    """The timer fires and wakes the sleeper, which is cancelled before it runs: nothing is left over."""
    clock = RealClock()

    async def main() -> None:
        timer = loop_timer(asyncio.get_running_loop())
        assert timer is not None
        t = clock.now() + 0.002
        task = asyncio.create_task(clock.sleep_until(t))
        await asyncio.sleep(0)  # the sleeper is waiting
        time.sleep(0.004)  # noqa: ASYNC251 - block the loop past the deadline: the timerfd is readable at the next poll
        await asyncio.sleep(0)  # the loop polls: the timer fires and wakes the sleeper...
        task.cancel()  # ...which has not run yet
        with pytest.raises(asyncio.CancelledError):
            await task
        assert timer.pending == 0 and timer.armed_ns() == 0 and clock.now() >= t

    run(loop_kind, main())


@pytest.mark.parametrize("clock_kind", CLOCKS)
@pytest.mark.parametrize("loop_kind", LOOPS)
def test_concurrent_sleepers_wake_in_deadline_order(loop_kind: str, clock_kind: str) -> None:
    clock, rng = make_clock(clock_kind), random.Random(3)

    async def main() -> tuple[list[tuple[float, float]], int]:
        woken: list[tuple[float, float]] = []

        async def sleeper(t: float) -> None:
            if clock.now() >= t:
                return  # the machine was too busy to even start it in time: it says nothing of the order
            await clock.sleep_until(t)
            woken.append((t, clock.now()))

        # Headroom for starting 200 tasks on a loaded machine: a sleeper that registers after its own
        # deadline returns at once, which would say nothing about the order the timer keeps.
        base = clock.now() + 0.05
        deadlines = [base + rng.uniform(0.0, 0.02) for _ in range(200)]
        await asyncio.gather(*(sleeper(t) for t in deadlines))  # started in random deadline order
        timer = loop_timer(asyncio.get_running_loop())
        return woken, timer.pending if timer is not None else 0

    # No collection inside the 50 ms window: with a large session heap (a thousand tests collected) one
    # gen-2 pass outlasts the headroom and every sleeper starts after its own deadline.
    gc.collect()
    gc.disable()
    try:
        woken, pending = run(loop_kind, main())
    finally:
        gc.enable()
    assert len(woken) >= 150 and pending == 0
    assert all(now >= t for t, now in woken)
    if clock_kind == "timerfd":  # the fallback leaves the order of same-millisecond wake-ups to the loop
        assert [t for t, _ in woken] == sorted(t for t, _ in woken)


@pytest.mark.skipif(not LINUX, reason="the timerfd exists on Linux only")
def test_one_timer_per_loop_across_threads() -> None:
    """Servers run in threads, each with its own loop: one clock serves them all, one timerfd per loop,
    and a loop's timerfd is closed once the loop is gone."""
    clock = RealClock()
    fds: dict[str, int] = {}
    errors: list[BaseException] = []

    def serve(name: str, kind: str) -> None:
        async def main() -> None:
            timer = loop_timer(asyncio.get_running_loop())
            assert timer is not None
            fds[name] = timer.fd
            rng = random.Random(name)
            for _ in range(100):
                t = clock.now() + rng.uniform(0.0, 0.002)
                await clock.sleep_until(t)
                assert clock.now() >= t
            assert loop_timer(asyncio.get_running_loop()) is timer

        try:
            run(kind, main())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(f"{kind}-{i}", kind)) for kind in LOOPS for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(set(fds.values())) == len(threads)
    gc.collect()  # the loops are closed and unreferenced: their timers go, and their fds with them
    for fd in fds.values():
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue
        assert "timerfd" not in target, f"fd {fd} still open after its loop was collected"


class LoopWithoutReaders(asyncio.SelectorEventLoop):
    """A loop that cannot watch file descriptors (as Windows' proactor loop)."""

    def add_reader(self, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError


def test_falls_back_where_the_loop_cannot_watch_a_timerfd() -> None:
    clock = RealClock()

    async def main() -> None:
        assert loop_timer(asyncio.get_running_loop()) is None
        for _ in range(50):
            t = clock.now() + random.uniform(0.0, 0.002)
            steps = [0]
            await counting_steps(clock.sleep_until(t), steps)
            assert clock.now() >= t and steps[0] <= 4

    with asyncio.Runner(loop_factory=LoopWithoutReaders) as runner:
        runner.run(main())


# ---- Timer.call_at: what the mock GPU streams a batch's tokens on, with no task woken per token ------------


@pytest.mark.skipif(not LINUX, reason="the timerfd exists on Linux only")
@pytest.mark.parametrize("loop_kind", LOOPS)
def test_calls_are_never_early_and_keep_deadline_order_with_the_sleepers(loop_kind: str) -> None:
    clock, rng = RealClock(), random.Random(5)

    async def main() -> tuple[list[tuple[str, float, float]], int]:
        timer = clock.timer()
        assert timer is not None and timer is loop_timer(asyncio.get_running_loop())
        woken: list[tuple[str, float, float]] = []

        async def sleeper(t: float) -> None:
            await clock.sleep_until(t)
            woken.append(("sleeper", t, clock.now()))

        base = clock.now() + 0.05
        deadlines = [base + rng.uniform(0.0, 0.02) for _ in range(200)]
        tasks = []
        for i, t in enumerate(deadlines):
            if i % 2:
                timer.call_at(t, lambda t=t: woken.append(("call", t, clock.now())))
            else:
                tasks.append(asyncio.create_task(sleeper(t)))
        await asyncio.gather(*tasks)
        await clock.sleep_until(max(deadlines))
        await asyncio.sleep(0.001)
        return woken, timer.pending

    woken, pending = run(loop_kind, main())
    assert pending == 0 and len(woken) == 200
    assert all(now >= t for _, t, now in woken)
    calls = [t for kind, t, _ in woken if kind == "call"]
    assert len(calls) == 100 and calls == sorted(calls)  # calls run in the timer's own fire, in order


@pytest.mark.skipif(not LINUX, reason="the timerfd exists on Linux only")
@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_chain_of_calls_paces_like_sleeps_and_a_cancelled_one_leaves_no_timer(loop_kind: str) -> None:
    """Each call schedules the next (as the driver's fast path does): every one on time, none early; then a
    cancelled call (the earliest, then the last) moves or disarms the kernel timer at once."""
    clock = RealClock()

    async def main() -> None:
        timer = clock.timer()
        assert timer is not None
        times: list[tuple[float, float]] = []
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        start = clock.now() + 0.01

        def tick(i: int) -> None:
            t = start + i * 0.001
            times.append((t, clock.now()))
            if i < 49:
                timer.call_at(start + (i + 1) * 0.001, lambda: tick(i + 1))
            else:
                done.set_result(None)

        timer.call_at(start, lambda: tick(0))
        await done
        assert len(times) == 50 and all(now >= t for t, now in times)
        assert timer.pending == 0 and timer.armed_ns() == 0

        soon = timer.call_at(clock.now() + 0.5, lambda: pytest.fail("a cancelled call ran"))
        later = timer.call_at(clock.now() + 5.0, lambda: pytest.fail("a cancelled call ran"))
        assert timer.pending == 2 and 0 < timer.armed_ns() <= 500_000_000
        soon.cancel()
        assert timer.pending == 1 and timer.armed_ns() > 1_000_000_000
        later.cancel()
        later.cancel()  # idempotent
        assert timer.pending == 0 and timer.armed_ns() == 0 and later.done()

    run(loop_kind, main())


@pytest.mark.skipif(not LINUX, reason="the timerfd exists on Linux only")
def test_a_call_that_raises_is_reported_and_the_others_still_run() -> None:
    clock = RealClock()
    reported: list[dict[str, Any]] = []

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        timer = clock.timer()
        assert timer is not None
        ran: list[str] = []
        t = clock.now() + 0.005

        def boom() -> None:
            raise RuntimeError("a bug in a caller")

        timer.call_at(t, boom)
        timer.call_at(t, lambda: ran.append("after"))
        await clock.sleep_until(t + 0.002)
        assert timer.pending == 0
        return ran

    assert run("asyncio", main()) == ["after"]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], RuntimeError)


def test_no_timer_where_the_clock_falls_back() -> None:
    async def main() -> None:
        assert RealClock(timerfd=False).timer() is None

    run("asyncio", main())
    with asyncio.Runner(loop_factory=LoopWithoutReaders) as runner:
        runner.run(_no_timer())


async def _no_timer() -> None:
    assert RealClock().timer() is None
