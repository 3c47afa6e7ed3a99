"""Time for the mock GPU: a real clock for serving, a virtual one for tests.

The engine paces tokens against absolute deadlines (``sleep_until``), never against "sleep for
the interval": a late wake-up then costs nothing downstream, and long outputs cannot drift.
``RealClock`` keeps those deadlines to tens of µs with a timerfd per event loop (Linux), without a
busy core; ``FakeClock`` is virtual time for tests. Both also call functions at deadlines
(``timer().call_at``), on the same heap as the sleepers: a paced GPU turn hands its clock's timer to the
response driver, which takes the stream's tokens from it with no task woken per token
(docs/architecture.md, "The fast path").
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (the origin means nothing)."""
        ...

    async def sleep_until(self, t: float) -> None:
        """Return at or after ``t``; immediately when ``t`` is already past."""
        ...

    def timer(self) -> Timer | None:
        """What calls functions at deadlines on this clock, for the running loop; ``None`` where only
        ``sleep_until`` is offered. Asked once per turn by the mock GPU, for its ``Pacing``."""
        ...


class Timer(Protocol):
    def call_at(self, t: float, fn: Callable[[], None]) -> TimerCall:
        """Call ``fn()`` at or after ``t`` (never before), from the event loop, with no task woken for it:
        what a sleeper's wake-up costs is a future, a task step and every frame of its coroutine chain;
        this is one call. ``fn`` must not block; it may schedule the next call."""
        ...


class TimerCall:
    """A pending ``Timer.call_at``: ``cancel()`` makes sure it is not called (idempotent; a no-op once
    called). ``done()`` as a sleeper's future says it: the timers' heaps hold both."""

    __slots__ = ("entry", "fn", "owner", "settled")

    def __init__(self, fn: Callable[[], None], owner: LoopTimer | None = None) -> None:
        self.fn = fn
        self.settled = False  # called or cancelled
        self.owner = owner  # a LoopTimer takes a cancelled call out of its heap at once (it re-arms)
        self.entry: tuple[float, int, asyncio.Future[None] | TimerCall] | None = None

    def cancel(self) -> None:
        if not self.settled:
            self.settled = True
            if self.owner is not None and self.entry is not None:
                self.owner._discard(self.entry)

    def done(self) -> bool:
        return self.settled


class RealClock:
    """``time.perf_counter`` (CLOCK_MONOTONIC on Linux), and wake-ups on a ``timerfd``.

    The event loop's own timers cannot keep sub-millisecond deadlines: the default loop's epoll
    selector rounds its timeout *up* to whole milliseconds (0..1 ms late), and uvloop rounds a delay to
    the *nearest* millisecond (up to 0.5 ms early, or late by up to 1 ms). So on Linux each event loop
    gets one ``timerfd`` (CLOCK_MONOTONIC, the clock ``now()`` reads), watched with ``loop.add_reader``
    and armed, at an absolute time with nanosecond resolution, for the earliest pending deadline. The
    loop sleeps in epoll until the kernel's hrtimer makes the fd readable: tens of µs of lateness and no
    busy core, on the default loop and on uvloop alike. Sleepers are futures in a per-loop heap; a
    sleeper is woken only once ``now() >= t``, so it never returns early. A deadline more than 2 ms
    ahead is armed 0.3 ms early first, then for itself: a CPU woken from a long idle is slow to
    respond (0.2 ms here after 50 ms asleep), from a short one it is not.

    Fallback (not Linux, no ``timerfd_create`` in libc, ``perf_counter`` not on CLOCK_MONOTONIC, a loop
    without ``add_reader`` such as Windows' proactor, or ``timerfd=False``): ``asyncio.sleep`` with
    the loop's millisecond granularity, i.e. 0..~1 ms late. It never spins: a remainder shorter than
    1 ms is slept as 1 ms, since a loop that rounds it down to 0 would wake at once, again and again.
    """

    def __init__(self, timerfd: bool = True) -> None:
        self.timerfd = timerfd

    def now(self) -> float:
        return time.perf_counter()

    async def sleep_until(self, t: float) -> None:
        if t <= time.perf_counter():
            return  # already due: no future, no syscall
        loop = asyncio.get_running_loop()
        timer = loop_timer(loop) if self.timerfd else None
        if timer is None:
            await _sleep_coarse(t)
        else:
            await timer.wait(loop, t)

    def timer(self) -> LoopTimer | None:
        return loop_timer(asyncio.get_running_loop()) if self.timerfd else None


# A remainder shorter than this is slept as this on the fallback path (see RealClock).
_COARSE_MIN_SLEEP_S = 0.001


async def _sleep_coarse(t: float) -> None:
    while (dt := t - time.perf_counter()) > 0:  # noqa: ASYNC110 - a deadline, not an event, is awaited
        await asyncio.sleep(max(dt, _COARSE_MIN_SLEEP_S))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_TFD_TIMER_ABSTIME = 1
# The kernel defines TFD_NONBLOCK/TFD_CLOEXEC as O_NONBLOCK/O_CLOEXEC, on every architecture.
_TFD_FLAGS = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_NS = 1_000_000_000
# Deadlines further out are armed this far out (the fd then fires early, finds nothing due, re-arms).
_MAX_ARM_S = 2.0**31
# A CPU that idled for long wakes slowly (the idle governor picked a deep C-state, or the hypervisor
# descheduled the vCPU): measured here, 0.03 ms late after 2 ms asleep, 0.2 ms after 50–280 ms. So a
# deadline more than _PREWAKE_BEYOND_S ahead is woken for twice: _PREWAKE_S before it, then at it
# after a short idle. One more wake-up per long sleep; never early (nothing is due at the first one).
_PREWAKE_S = 0.0003
_PREWAKE_BEYOND_S = 0.002


class _TimerfdCalls:
    """libc's ``timerfd_create``/``timerfd_settime``/``timerfd_gettime`` through ctypes (Python 3.11 has
    no ``os.timerfd_*``; they came in 3.13). ``load()`` gives None where they cannot be used."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._create = libc.timerfd_create
        self._create.argtypes = [ctypes.c_int, ctypes.c_int]
        self._create.restype = ctypes.c_int
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]
        self._settime.restype = ctypes.c_int
        self._gettime = libc.timerfd_gettime
        self._gettime.argtypes = [ctypes.c_int, ctypes.POINTER(_Itimerspec)]
        self._gettime.restype = ctypes.c_int

    @staticmethod
    def load() -> _TimerfdCalls | None:
        # The timerfd counts on CLOCK_MONOTONIC; now() must read that very clock, or a deadline
        # computed from now() would be armed on another time scale.
        if not sys.platform.startswith("linux"):
            return None
        if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
            return None
        try:
            return _TimerfdCalls(ctypes.CDLL(None, use_errno=True))
        except (OSError, AttributeError):  # no libc handle, or a libc without timerfd (musl < 1.1.x …)
            return None

    def create(self) -> int:
        fd = int(self._create(time.CLOCK_MONOTONIC, _TFD_FLAGS))
        if fd < 0:
            raise _oserror()
        return fd

    def settime(self, fd: int, spec: _Itimerspec, flags: int) -> None:
        if self._settime(fd, flags, ctypes.byref(spec), None) != 0:
            raise _oserror()

    def gettime_ns(self, fd: int) -> int:
        spec = _Itimerspec()
        if self._gettime(fd, ctypes.byref(spec)) != 0:
            raise _oserror()
        return int(spec.it_value.tv_sec) * _NS + int(spec.it_value.tv_nsec)


def _oserror() -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, os.strerror(errno))


_CALLS_LOADED = False
_CALLS: _TimerfdCalls | None = None


def _calls() -> _TimerfdCalls | None:
    global _CALLS, _CALLS_LOADED
    if not _CALLS_LOADED:
        _CALLS, _CALLS_LOADED = _TimerfdCalls.load(), True
    return _CALLS


class LoopTimer:
    """One event loop's timerfd and the sleepers waiting on it (a heap of deadline, sequence, future).

    The fd stays registered with the loop; it is armed for the earliest deadline only, re-armed when
    that changes (a new earlier sleeper, a fire, a cancellation), disarmed when nobody waits. It holds
    no reference to its loop, and its fd is closed when it is collected, i.e. after its loop is.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, calls: _TimerfdCalls) -> None:
        self._calls = calls
        self.fd = calls.create()
        try:
            loop.add_reader(self.fd, self._fire)
        except BaseException:
            os.close(self.fd)
            raise
        weakref.finalize(self, os.close, self.fd).atexit = False  # at exit the OS closes it
        self._heap: list[tuple[float, int, asyncio.Future[None] | TimerCall]] = []
        self._ids = itertools.count()
        self._armed: float | None = None  # the deadline the kernel timer is set for, if any
        self._spec = _Itimerspec()  # reused: it_interval stays 0 (one-shot)
        self.fires = 0  # times the fd woke the loop (for tests and measurements)

    @property
    def pending(self) -> int:
        """Sleepers waiting."""
        return len(self._heap)

    def armed_ns(self) -> int:
        """Nanoseconds until the kernel timer fires, 0 when it is disarmed (asks the kernel)."""
        return self._calls.gettime_ns(self.fd)

    def call_at(self, t: float, fn: Callable[[], None]) -> TimerCall:
        """``Timer.call_at``: ``fn`` is called from ``_fire``, in deadline order with the sleepers."""
        call = TimerCall(fn, self)
        call.entry = self._push(t, call)
        return call

    async def wait(self, loop: asyncio.AbstractEventLoop, t: float) -> None:
        fut: asyncio.Future[None] = loop.create_future()
        entry = self._push(t, fut)
        try:
            await fut
        except BaseException:  # cancelled (or closed): take the sleeper and its timer away
            self._discard(entry)
            raise

    def _push(
        self, t: float, waiter: asyncio.Future[None] | TimerCall
    ) -> tuple[float, int, asyncio.Future[None] | TimerCall]:
        """A sleeper or a call into the heap; the kernel timer moves when it is the earliest."""
        entry = (t, next(self._ids), waiter)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._arm()
        return entry

    def _fire(self) -> None:
        self.fires += 1
        try:  # noqa: SIM105 - cheaper than contextlib.suppress on this hot path
            os.read(self.fd, 8)  # the expiration count; reading it makes the fd unreadable again
        except BlockingIOError:
            pass  # re-armed since epoll saw it readable; the heap decides what is due
        self._armed = None  # a one-shot timer that fired is disarmed (and a re-armed one is re-set below)
        heap, now = self._heap, time.perf_counter()
        while heap and heap[0][0] <= now:
            waiter = heapq.heappop(heap)[2]
            if isinstance(waiter, TimerCall):
                if waiter.settled:
                    continue  # cancelled (a cancelled call normally leaves the heap at once)
                waiter.settled = True
                try:  # a call scheduled by it that is already due runs in this same loop
                    waiter.fn()
                except Exception as exc:  # one caller's bug must not stop the others' wake-ups
                    asyncio.get_running_loop().call_exception_handler(
                        {"message": "Timer.call_at callback failed", "exception": exc}
                    )
            elif not waiter.done():
                waiter.set_result(None)  # in deadline order: the woken tasks run in that order
        self._arm()

    def _discard(self, entry: tuple[float, int, asyncio.Future[None] | TimerCall]) -> None:
        heap = self._heap
        if heap and heap[0] is entry:
            heapq.heappop(heap)
            self._arm()
            return
        for i, other in enumerate(heap):
            if other is entry:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return  # not the earliest: the armed deadline stands
        # Not there: _fire already took it (woken, then cancelled before it ran).

    def _arm(self) -> None:
        spec = self._spec.it_value
        if self._heap:
            t = self._heap[0][0]
            if t - time.perf_counter() > _PREWAKE_BEYOND_S:
                t -= _PREWAKE_S  # the pre-wake: nothing is due then, and _fire arms for t itself
            if t == self._armed:
                return
            # Rounded up to the next nanosecond: the kernel never fires before t.
            spec.tv_sec, spec.tv_nsec = divmod(math.ceil(min(t, _MAX_ARM_S) * _NS), _NS)
            self._calls.settime(self.fd, self._spec, _TFD_TIMER_ABSTIME)
            self._armed = t
        elif self._armed is not None:
            spec.tv_sec = spec.tv_nsec = 0  # a zero it_value disarms
            self._calls.settime(self.fd, self._spec, 0)
            self._armed = None


_LOOP_TIMERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopTimer | None] = (
    weakref.WeakKeyDictionary()
)
_LOOP_TIMERS_LOCK = threading.Lock()


def loop_timer(loop: asyncio.AbstractEventLoop) -> LoopTimer | None:
    """The loop's timer, created on first use; None where it cannot work (RealClock's fallback).
    One per loop, shared by every RealClock: servers in threads each have their own loop and timerfd."""
    try:
        return _LOOP_TIMERS[loop]
    except KeyError:
        pass
    with _LOOP_TIMERS_LOCK:
        if loop in _LOOP_TIMERS:
            return _LOOP_TIMERS[loop]
        calls, timer = _calls(), None
        if calls is not None:
            try:
                timer = LoopTimer(loop, calls)
            except (NotImplementedError, OSError):  # e.g. the proactor loop has no add_reader
                timer = None
        _LOOP_TIMERS[loop] = timer
        return timer


class FakeClock:
    """Virtual time for deterministic tests: nothing moves until the test advances it.

    ``advance``/``advance_to`` fire timers in deadline order and let the woken tasks run after
    each one (``settle_rounds`` loop iterations), so a chain of sleeps behaves as on a real loop.
    """

    def __init__(self, start: float = 0.0, settle_rounds: int = 8) -> None:
        self._now = start
        self._settle_rounds = settle_rounds
        self._timers: list[tuple[float, int, asyncio.Future[None] | TimerCall]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self._now

    def timer(self) -> FakeClock:
        return self

    def call_at(self, t: float, fn: Callable[[], None]) -> TimerCall:
        """Called when the test advances time past ``t`` (``Timer.call_at``), in deadline order with the
        sleepers."""
        call = TimerCall(fn)
        heapq.heappush(self._timers, (t, next(self._ids), call))
        return call

    async def sleep_until(self, t: float) -> None:
        if t <= self._now:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (t, next(self._ids), fut))
        await fut

    @property
    def pending(self) -> int:
        """Timers still waiting (cancelled sleepers excluded)."""
        return sum(1 for _, _, f in self._timers if not f.done())

    def next_deadline(self) -> float | None:
        self._drop_cancelled()
        return self._timers[0][0] if self._timers else None

    async def settle(self) -> None:
        for _ in range(self._settle_rounds):
            await asyncio.sleep(0)

    async def advance_to(self, t: float) -> None:
        await self.settle()
        while (nxt := self.next_deadline()) is not None and nxt <= t:
            self._now = max(self._now, nxt)
            self._wake_due()
            await self.settle()
        self._now = max(self._now, t)
        await self.settle()

    async def advance(self, dt: float) -> None:
        await self.advance_to(self._now + dt)

    async def jump(self, dt: float) -> None:
        """Move time by ``dt`` at once, then wake every sleeper now due: a late wake-up, as a
        busy event loop or a millisecond-granular selector produces."""
        await self.settle()
        self._now += dt
        self._wake_due()
        await self.settle()

    async def run_until_idle(self) -> None:
        """Advance through every timer until none is left (tasks blocked elsewhere stay blocked)."""
        await self.settle()
        while (nxt := self.next_deadline()) is not None:
            await self.advance_to(nxt)

    def _wake_due(self) -> None:
        while self._timers and self._timers[0][0] <= self._now:
            _, _, waiter = heapq.heappop(self._timers)
            if waiter.done():
                continue
            if isinstance(waiter, TimerCall):
                waiter.settled = True
                waiter.fn()
            else:
                waiter.set_result(None)

    def _drop_cancelled(self) -> None:
        while self._timers and self._timers[0][2].done():
            heapq.heappop(self._timers)
