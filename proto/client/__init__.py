"""The one client library the demo, the lab, the load tools and the tests share (asyncio; ``websockets``
and ``httpx``): the messages (``messages``), the HTTP/SSE client (``http``, its parser ``sse``), the GA
WebSocket mode client (``ga``), the long-lived client (``longlived``), and what an observer of their
frames sees (``frames``)."""

from proto.client.errors import ClientError, HttpStatusError, ProtocolFailure, StreamEnded
from proto.client.frames import ClientEvent, Frame, Observer
from proto.client.ga import GaClient
from proto.client.http import HttpClient
from proto.client.longlived import LongLivedClient, RolloutResult, ToolFn
from proto.client.sse import SseEvent, SseParser
from proto.client.ws import WebSocketClient

__all__ = [
    "ClientError", "ClientEvent", "Frame", "GaClient", "HttpClient", "HttpStatusError", "LongLivedClient",
    "Observer", "ProtocolFailure", "RolloutResult", "SseEvent", "SseParser", "StreamEnded", "ToolFn",
    "WebSocketClient",
]  # fmt: skip
