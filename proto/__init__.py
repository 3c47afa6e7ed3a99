"""responses-lab's wire: the long-lived Response and the Responses API, sans-IO.

The modules directly in this package (``items``, ``response``, ``events``, ``errors``, ``state``,
``longlived``, ``builder``, ``codec``) contain no networking code at all: no sockets, no awaits, no event
loop. They consume decoded client events and produce server events and decisions, so tests drive them
directly. ``tests/test_boundaries.py`` keeps this true.

The I/O lives in the subpackages, as thin adapters: ``proto.server`` (starlette routes served by uvicorn)
and ``proto.client`` (the asyncio client the demo, the tests and the latency lab share).
"""
