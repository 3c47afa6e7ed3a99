"""The one error of the local tools, in its own module because both the workspace and the diff applier
raise it: neither has to import the other to share it."""

from __future__ import annotations


class ToolError(Exception):
    """A tool refused its arguments; the model gets the message as the call's output."""
