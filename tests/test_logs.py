"""proto/server/logs.configure may run many times in one process (each in-process server's create_app calls
it): a logger already used, and so cached, still follows the configuration and ``capture_logs``."""

from __future__ import annotations

import structlog
from structlog.testing import capture_logs

from proto.server.logs import configure


def test_a_logger_cached_before_a_reconfigure_is_still_captured() -> None:
    configure()
    log = structlog.get_logger("test_logs")
    with capture_logs():
        log.error("first use: cached now")
    configure()
    with capture_logs() as logs:
        log.error("after the reconfigure")
    assert [entry["event"] for entry in logs] == ["after the reconfigure"]
