"""``--help`` of every ``responses-lab`` command (docs/operations.md, "Commands"): every option of every
subcommand, nested ones included, has a help text and shows its default (or says it is required), as
uvicorn's and vLLM's servers do; ``serve``'s flags are grouped."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

from proto.cli import main

COMMANDS = [
    "serve",
    "demo",
    "bench",
    "bench merge",
    "bench report",
    "bench repredict",
    "bench fleet",
    "engine",
    "soak",
    "chaos",
    "perf",
]


class Shown(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(command: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser that answers ``responses-lab COMMAND --help`` (caught where argparse prints it)."""

    def caught(self: Any, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        raise Shown(parser)

    monkeypatch.setattr(argparse._HelpAction, "__call__", caught)
    with pytest.raises(Shown) as shown:
        main([*command.split(), "--help"])
    return shown.value.parser


def parsers(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from parsers(child, f"{name} {sub}")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_and_its_default(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = []
    for name, parser in parsers(parser_of(command, monkeypatch), command):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            text = formatter._get_help_string(action) or ""
            if not (action.help or "").strip() or not ("default" in text or "required" in text):
                missing.append(f"{name} {action.option_strings[0]}: {text!r}")
        parser.format_help()  # formats (a stray % in a help text raises here)
    assert missing == []


def test_serve_groups_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = parser_of("serve", monkeypatch)
    titles = [group.title for group in parser._action_groups if group._group_actions]
    assert {"network", "storage", "limits", "logging"} <= set(titles) and "other" not in titles
    help_text = " ".join(parser.format_help().split())
    assert "--port PORT" in help_text and "(default: 8000; env RESPONSES_LAB_PORT)" in help_text
