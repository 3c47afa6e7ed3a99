"""``responses-lab soak`` in small (10 connections × 3 turns, 5 held suspended) against its own server
process:
no errors, every rollout and turn counted, and nothing left on the server once the clients are gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import running

from proto.load.soak import main

pytestmark = pytest.mark.process  # every test starts a server or a process


def test_soak_smoke_leaves_no_session_and_no_task(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    code = main(
        [
            "--connections",
            "10",
            "--turns",
            "3",
            "--http-share",
            "0.2",
            "--suspended",
            "5",
            "--ramp-s",
            "0.1",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0 and report["errors"] == {}
    assert report["rollouts_ok"] == 10 and report["turns_ok"] == 30
    assert report["sessions_after"] == 0
    assert report["tasks_after"] == report["tasks_before"]  # no task leaked per connection
    assert report["overhead_ms_p50"] > 0 and report["rss_mb"]
    assert report["suspended"] == 5 and report["suspended_rss_mb_after"] > 0


def test_soak_refuses_a_non_loopback_server() -> None:
    with pytest.raises(SystemExit, match="loopback"):
        main(["--url", "http://10.1.2.3:8000", "--connections", "1"])


def test_soak_clients_retry_creates_shed_at_the_door(tmp_path: Path) -> None:
    """Twenty rollouts against room for four: creates are shed and retried, none fails once started."""
    out = tmp_path / "soak.json"
    flags = ["--server-flag=--max-admitted=4", "--server-flag=--retry-after-ms=20"]
    code = main(
        [
            "--connections",
            "20",
            "--turns",
            "3",
            "--http-share",
            "0.2",
            "--ramp-s",
            "0",
            "--out",
            str(out),
            *flags,
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0 and report["errors"] == {}, report["errors"]
    assert report["rollouts_ok"] == 20 and report["failed_mid_rollout"] == 0
    assert report["creates_shed"] > 0 and report["retries"] == report["creates_shed"]
    assert report["e2e_s_p99"] >= report["e2e_s_p50"] > 0


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/responses", "/v1/responses?protocol=longlived"])
def test_soak_takes_the_url_a_user_passes(tmp_path: Path, suffix: str) -> None:
    """``--url`` as the server's base, the API base or the WebSocket endpoint (``bench --url``'s form)."""
    out = tmp_path / "soak.json"
    with running() as srv:
        base = srv.url.removesuffix("/v1/responses") if suffix.startswith("/v1/responses") else srv.http_url
        url = base + suffix
        args = ["--url", url, "--connections", "2", "--turns", "2", "--http-share", "0.5", "--ramp-s", "0"]
        code = main([*args, "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["errors"] == {} and report["rollouts_ok"] == 2, report


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8000", "ftp://127.0.0.1:8000", "http://127.0.0.1:8000/api", "ws://127.0.0.1:8000/v2"]
)
def test_soak_refuses_a_url_it_cannot_use_with_what_it_takes(url: str) -> None:
    with pytest.raises(SystemExit, match=r"expected the server's URL, as http://HOST:PORT, .*ws://HOST:PORT"):
        main(["--url", url, "--connections", "1"])
