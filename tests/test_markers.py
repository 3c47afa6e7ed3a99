"""The guard behind the ``process`` marker (tests/conftest.py): a test without it cannot start a server, a
subprocess or a listening socket (so ``make check`` stays process-free), and a test with it can."""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys

import pytest
from helpers import SETTINGS

from proto.server.serve import ThreadedServer

REFUSED = r"is not marked `process`"


def test_an_unmarked_test_cannot_start_a_server_or_a_process() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        ThreadedServer(SETTINGS)
    with pytest.raises(RuntimeError, match=REFUSED):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(RuntimeError, match=REFUSED):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(RuntimeError, match=REFUSED):
            sock.listen()


@pytest.mark.process
def test_a_marked_test_can() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
