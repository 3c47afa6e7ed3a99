"""``responses-lab engine``: the command line of the mock engine (``proto.engine.app``)."""

from __future__ import annotations

import argparse

import uvicorn

from proto.engine.app import create_engine_app
from proto.helpfmt import HelpFormatter
from proto.server.config import check_host, check_keys, resolve_http, resolve_loop
from proto.server.logs import configure
from sampler.overrides import model_specs

DEFAULT_PORT = 8100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    network = parser.add_argument_group("network")
    models = parser.add_argument_group("models")
    logging = parser.add_argument_group("logging")
    network.add_argument(
        "--host", default="127.0.0.1", help="bind address; without --api-key only loopback is allowed"
    )
    network.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port")
    models.add_argument(
        "--model-override",
        action="append",
        default=None,
        metavar="MODEL:KNOB=V,…",
        help="the models' knobs, as `serve --model-override` takes them (repeatable)",
    )
    network.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` (as `vllm serve --api-key`)"
    )
    logging.add_argument("--log-level", default="warning", help="structlog level (JSON lines)")
    network.add_argument(
        "--loop", default="auto", help="event loop: auto (uvloop when installed), uvloop or asyncio"
    )
    network.add_argument(
        "--http", default="auto", help="HTTP parser: auto (httptools when installed), httptools or h11"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="responses-lab engine",
        description="the mock GPU as its own process, behind vLLM's completions API",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    check_keys([args.api_key] if args.api_key is not None else [])
    check_host(args.host, bool(args.api_key))
    configure(args.log_level)
    try:
        specs = model_specs(args.model_override)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    uvicorn.run(
        create_engine_app(specs, api_key=args.api_key),
        host=args.host,
        port=args.port,
        loop=resolve_loop(args.loop),
        http=resolve_http(args.http),
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        # A stream still open at shutdown is cut (its API side sees a disconnect: engine_failure) after this.
        timeout_graceful_shutdown=2,
    )
    return 0
