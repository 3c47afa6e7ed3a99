"""The demo (``responses-lab demo``), one noun a module.

A tiny buggy repository is written to a temp dir; the scripted model (docs/protocol.md, "The directive
script",
sent as the first user message) searches it, reads files, asks the hosted ``web_search``, patches the bug
and runs the tests. The client runs the local tools for real (files, regexes, a pytest subprocess), and
the terminal shows a timeline a person can follow: condensed events, each suspension and resumption,
tool times, tokens/s per item, and the terminal response's usage and per-turn report.

- ``fixture``: the buggy repository, its fixed version and the patch between them;
- ``errors``: ``ToolError``, what a tool raises when it refuses its arguments;
- ``patch``: the unified-diff parser and strict applier behind ``apply_patch``;
- ``workspace``: the local tools over one repository directory;
- ``script``: the model's directive script, the tools it is offered, the request;
- ``timeline``: the terminal timeline and the closing summary;
- ``run``: one rollout against a server, and ``main``, the command line.
"""

from __future__ import annotations

# The command line (proto/cli.py) calls ``proto.demo.main``: the package keeps
# that name, wherever the code behind it lives.
from proto.demo.rollout import main

__all__ = ["main"]
