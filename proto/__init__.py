"""responses-lab: the long-lived Response and the Responses API it is compared against, on a mock GPU.

The package's layout is its architecture (docs/architecture.md, "Layers"):

- ``proto.core`` — the sans-IO core: items, events, the Response builder, both state tables, the
  long-lived and GA WebSocket connection cores. No networking code at all.
- ``proto.server`` — the server: the response driver, the API pipeline and its ``stages``, ``storage``
  (store and ledger on SQLite or PostgreSQL), and the ``transports`` (HTTP/SSE, GA WebSocket, long-lived).
- ``proto.engine`` — the engine hop: the mock GPU as its own process, behind vLLM's completions API.
- ``proto.client`` — the client library; ``proto.demo``, ``proto.lab``, ``proto.load`` and ``proto.perf``
  are built on it.
- ``proto.processes`` — our servers as child processes, for the client tools and the server's workers.

Inference (the sampling loop, the mock GPU, the mock model) is the sibling package ``sampler``.
"""
