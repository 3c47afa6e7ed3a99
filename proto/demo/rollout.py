"""The demo: a coding-agent rollout over the long-lived protocol, against the mock GPU.

``responses-lab demo [--url URL]`` (also ``python -m proto demo``) calls ``main``; without a URL it starts its
own server on a free loopback port. ``main``'s ``--help`` shows this docstring's first line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from websockets.exceptions import WebSocketException

from proto.client.longlived import LongLivedClient, ProtocolFailure
from proto.demo.fixture import make_repo
from proto.demo.script import demo_request
from proto.demo.timeline import Timeline
from proto.demo.workspace import Workspace
from proto.helpfmt import HelpFormatter


async def run_demo(
    url: str, model: str = "mock-1000tps", console: Console | None = None, api_key: str | None = None
) -> int:
    """One rollout against the server at ``url``; 0 when it completed and the repo's tests now pass."""
    # Piped output (make, CI logs) gets 120 columns rather than rich's 80, so each event stays on one line.
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    with tempfile.TemporaryDirectory(prefix="responses-lab-demo-") as tmp:
        workspace = Workspace(make_repo(Path(tmp) / "repo"))
        timeline = Timeline(console)
        console.rule("[bold]responses-lab demo: a coding agent over one long-lived Response")
        console.print(
            f"  server  {url}  ·  model {model}\n  repo    {workspace.root}  (stats.py has an off-by-one)\n"
        )
        try:
            async with LongLivedClient(url, api_key=api_key) as client:
                result = await client.rollout(
                    demo_request(model), workspace.tool_fns(timeline.tool_output), timeline.on_event
                )
        except ProtocolFailure as e:
            console.print(f"[bold red]the server refused the rollout: {escape(str(e))}[/]")
            return 1
        except (OSError, TimeoutError, WebSocketException) as e:  # refused, 401 at the handshake, dropped
            console.print(
                f"[bold red]cannot talk to {escape(url)}: {escape(type(e).__name__)}: {escape(str(e))}[/]"
            )
            return 2
        console.print()
        timeline.summary(result)
        started = time.perf_counter()
        check = await asyncio.to_thread(workspace.test_run)
        took = (time.perf_counter() - started) * 1e3
        status = result.response.get("status")
        console.print()
        if check.exit_code == 0:
            console.print(
                f"[bold green]✓ tests pass[/] after the rollout: exit code 0 ({escape(check.tail(1))}, "
                f"{took:.0f} ms)"
            )
        else:
            console.print(
                f"[bold red]✗ tests still fail[/]: exit code {check.exit_code}\n{escape(check.tail())}"
            )
        if status != "completed":
            console.print(f"[bold red]✗ the rollout did not complete[/] (status {status})")
        return 0 if status == "completed" and check.exit_code == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="responses-lab demo",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    server = parser.add_argument_group("server")
    rollout = parser.add_argument_group("rollout")
    server.add_argument(
        "--url", help="ws://HOST:PORT/v1/responses of a running server (default: start one on loopback)"
    )
    rollout.add_argument("--model", default="mock-1000tps", help="the mock model the rollout runs on")
    server.add_argument(
        "--api-key",
        default=os.environ.get("RESPONSES_LAB_API_KEY"),
        help="bearer key, if the server wants one (default: env RESPONSES_LAB_API_KEY, else none)",
    )
    args = parser.parse_args(argv)
    if args.url:
        return asyncio.run(run_demo(args.url, args.model, api_key=args.api_key))
    from proto.server.serve import serving  # the server is only needed when the demo brings its own

    # A throwaway store and ledger: the demo leaves no database behind.
    with serving(db=":memory:") as url:
        return asyncio.run(run_demo(url, args.model))
