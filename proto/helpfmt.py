"""The one help format of every ``responses-lab`` command and subcommand (as uvicorn's and vLLM's servers
show theirs): each option's help ends with its default, descriptions keep their line breaks."""

from __future__ import annotations

import argparse
import re

# How a help text states its own default: "(default: all)", "(default 4; --quick 2)", "default 0: never".
# "e.g. default,2000" names a value, not the default.
STATED = re.compile(r"\bdefault[: ]")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: …)`` to an option's help unless the help already states it (``STATED``);
    ``None`` reads as "none", booleans as "on" / "off", lists comma-separated."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if STATED.search(text) or not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        if action.required:
            return text + " (required)"
        return f"{text} (default: {shown(action.default)})"


def shown(value: object) -> str:
    """A default as help text says it (``%`` escaped: argparse formats help with it)."""
    if value is None or value == "" or value == []:
        text = "none"
    elif value is True or value is False:
        text = "on" if value else "off"
    elif isinstance(value, list | tuple):
        text = ",".join(map(str, value))
    else:
        text = str(value)
    return text.replace("%", "%%")


def apply(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and every subcommand parser under it format their help with ``HelpFormatter``."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                apply(child)
    return parser
