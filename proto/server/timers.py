"""When a WebSocket connection's limits come due: its age (``--connection-max-age-s``) and its idleness
(``--idle-timeout-s``: no open response and no client frame for that long). Arithmetic on one clock
(``time.monotonic``), no I/O: the session asks ``due_in`` how long it may wait for the next frame, and
after the wait asks ``aged`` / ``idle``.

A response in flight is never idle: a suspended one is governed by ``--tool-timeout-s`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Past the age limit a streaming response is let finish its turn; the session checks back this often.
AGED_POLL_S = 0.05
CLOSE_IDLE = 1000  # a normal closure: the server ends an unused connection on purpose
IDLE_REASON = "idle_timeout"


@dataclass
class ConnectionTimers:
    opened_at: float
    max_age_s: float
    idle_timeout_s: float
    idle_since: float = field(init=False)

    def __post_init__(self) -> None:
        self.idle_since = self.opened_at

    def touch(self, now: float) -> None:
        """A client frame arrived, or the open response ended: the idle clock starts again."""
        self.idle_since = now

    def aged(self, now: float) -> bool:
        return now >= self.opened_at + self.max_age_s

    def idle(self, now: float, busy: bool) -> bool:
        return not busy and now >= self.idle_since + self.idle_timeout_s

    def due_in(self, now: float, busy: bool) -> float:
        """Seconds the session may wait for a frame before it must check these limits."""
        age = self.opened_at + self.max_age_s - now
        if busy:
            if age <= 0:
                return AGED_POLL_S
            # The response's end cannot wake a reader blocked on the socket: check back, so the idle
            # clock closes the connection at most a quarter of the timeout late.
            return min(age, self.idle_timeout_s / 4)
        return max(0.0, min(age, self.idle_since + self.idle_timeout_s - now))
