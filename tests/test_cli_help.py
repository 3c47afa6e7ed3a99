"""``--help`` of every ``responses-lab`` command (docs/operations.md, "Commands"). The commands are found
from the parsers themselves: ``responses-lab --help``'s subcommands, then each one's own subcommands
(``bench report``, ``perf turn``, …), each asked for its ``--help`` as a user would. Every option of every
one has a help text, shows its default (or says it is required) and sits in a titled group, as uvicorn's
and vLLM's servers show theirs."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

from proto.cli import main
from proto.helpfmt import STATED
from proto.lab.run.codex_bench import _parser as codex_parser


class Shown(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(path: list[str]) -> argparse.ArgumentParser:
    """The parser that answers ``responses-lab PATH --help`` (caught where argparse would print it)."""

    def caught(self: Any, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        raise Shown(parser)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse._HelpAction, "__call__", caught)
        try:
            main([*path, "--help"])
        except Shown as shown:
            return shown.parser
    raise AssertionError(f"responses-lab {' '.join(path)} --help printed no help")


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


def commands(path: list[str]) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    parser = parser_of(path)
    yield " ".join(["responses-lab", *path]), parser
    for name in subcommands(parser):
        yield from commands([*path, name])


COMMANDS = dict(commands([]))
# `bench --client codex` hands its arguments to a parser of its own (a flag, not a subcommand, selects it)
COMMANDS["responses-lab bench --client codex"] = codex_parser()


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_command_is_found() -> None:
    """The walk reaches every command and the nested ones (a command it missed would go unchecked)."""
    for name in ("serve", "demo", "bench", "engine", "soak", "chaos", "perf"):
        assert f"responses-lab {name}" in COMMANDS
    for name in ("report", "repredict", "merge", "fleet"):
        assert f"responses-lab bench {name}" in COMMANDS
    for name in ("turn", "cpu", "stream", "capacity", "rss", "deflate", "topology", "engine", "profile"):
        assert f"responses-lab perf {name}" in COMMANDS
    assert sum(len(options(p)) for p in COMMANDS.values()) > 150


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help_a_group_and_its_default(command: str) -> None:
    parser = COMMANDS[command]
    assert parser.prog == command  # its own parser answered, not its parent's
    formatter = parser._get_formatter()
    missing = []
    for action in options(parser):
        text = formatter._get_help_string(action) or ""
        if not (action.help or "").strip():
            missing.append(f"{action.option_strings[0]}: no help")
        if not (STATED.search(text) or text.endswith("(required)")):
            missing.append(f"{action.option_strings[0]}: no default in {text!r}")
    for action in parser._optionals._group_actions:  # argparse's untitled "options" group
        if not isinstance(action, argparse._HelpAction):
            missing.append(f"{action.option_strings[0]}: in no group")
    for action in parser._positionals._group_actions:
        if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip():
            missing.append(f"{action.dest}: no help")
    assert missing == []
    parser.format_help()  # formats (a stray % in a help text raises here)


def test_serve_groups_its_flags() -> None:
    parser = COMMANDS["responses-lab serve"]
    titles = [group.title for group in parser._action_groups if group._group_actions]
    assert {"network", "storage", "limits", "logging"} <= set(titles) and "other" not in titles
    help_text = " ".join(parser.format_help().split())
    assert "--port PORT" in help_text and "(default: 8000; env RESPONSES_LAB_PORT)" in help_text


def test_help_lists_every_flag_a_command_takes() -> None:
    """``demo --help`` is the demo's own parser: ``--api-key`` (which it takes) is listed, and its default
    names the variable, never the key it read from it."""
    help_text = " ".join(COMMANDS["responses-lab demo"].format_help().split())
    assert "--api-key" in help_text and "env RESPONSES_LAB_API_KEY" in help_text
    bench = " ".join(COMMANDS["responses-lab bench"].format_help().split())
    assert all(f"{name} " in bench for name in ("report", "repredict", "merge", "fleet"))


def test_a_bench_subcommand_after_a_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench``'s subcommands come first; after a flag one is an unknown argument, and nothing runs."""
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--quick", "report"])
    assert exited.value.code == 2
    assert "unrecognized arguments: report" in capsys.readouterr().err
