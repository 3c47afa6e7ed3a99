"""The sans-IO core of responses-lab's wire: no networking code at all.

No sockets, no awaits, no event loop: these modules consume decoded client events and produce server
events and decisions, so tests drive them directly (after h11). ``tests/test_boundaries.py`` keeps this
true. See docs/architecture.md, "Layers".
"""
