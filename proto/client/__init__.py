"""Clients the demo, the tests and the latency lab share (asyncio; the ``websockets`` library)."""

from proto.client.longlived import ClientEvent, LongLivedClient, ToolFn

__all__ = ["ClientEvent", "LongLivedClient", "ToolFn"]
