"""Shared fixtures: real servers (uvicorn + wsproto) on loopback, each in its own thread and event loop."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from proto.server.config import Settings
from proto.server.run import ThreadedServer

# mock-4000tps with a 1 ms prefill: a rollout of a few turns takes a few milliseconds of modelled GPU time.
FAST_MODEL = "mock-4000tps"
FAST_SETTINGS = Settings(
    db=":memory:",
    port=0,
    model_override=[f"{FAST_MODEL}:prefill-overhead=1,prefill-time-per-token=0"],
)

ServerFactory = Callable[..., contextlib.AbstractContextManager[ThreadedServer]]


@contextlib.contextmanager
def _running(settings: Settings) -> Iterator[ThreadedServer]:
    server = ThreadedServer(settings)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server() -> Iterator[ThreadedServer]:
    """One open (no API key) fast server for the whole session; tests must not depend on its history."""
    with _running(FAST_SETTINGS) as running:
        yield running


@pytest.fixture
def make_server() -> ServerFactory:
    """``with make_server(tool_timeout_s=0.3) as srv:`` — a fresh server with these settings over the fast
    defaults, for tests that need their own settings or a server nobody else has touched."""

    def factory(**overrides: object) -> contextlib.AbstractContextManager[ThreadedServer]:
        return _running(replace(FAST_SETTINGS, **overrides))  # type: ignore[arg-type]

    return factory
