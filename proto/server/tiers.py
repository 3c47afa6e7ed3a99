"""``service_tier`` as speed: the table that resolves (model, tier) to the engine that serves it, and the
tier the Response echoes (docs/protocol.md, "Service tiers").

OpenAI's tiers (the SDK's ``ServiceTier``, openai-python 3.63 ``types/responses/response.py``): ``auto``
(the project's setting, ``default`` unless configured), ``default`` ("standard pricing and performance"),
``flex`` (Flex processing: cheaper, slower and less available), ``scale``, ``fast`` / ``priority`` ("The
response will show ``service_tier=priority`` regardless of if you specify ``service_tier=fast`` or
``priority``") and ``ultrafast`` ("a response served through it will show ``service_tier=ultrafast``"). The
Response's ``service_tier`` is "the processing mode actually used to serve the request", which "may be
different from the value set in the parameter".

The mock's speed classes are the catalogue's (``sampler/models.py``): the seed post's 65 tokens/s GPU
class, its 1 000 tokens/s wafer-scale class and that hardware's 4 000 tokens/s bursts (OpenAI, "Speeding
up agentic workflows with WebSockets in the Responses API", 2026-04-22). A tier that buys speed maps to a
class; the rest keep the model's own:

* ``priority`` (``fast``) → ``mock-1000tps``: the fast class, the seed post's "over 1,000 TPS" target;
* ``ultrafast`` → ``mock-4000tps``: the fastest class (the post's "bursts up to 4,000 TPS"; OpenAI
  announces it "up to 8x faster than Standard" and recommends WebSockets with it);
* ``default``, ``flex``, ``scale`` → the model named: flex and scale change price and availability, not
  the decode speed, and the mock has no slower class to give flex.

A tier never slows a model: a model already in (or above) its tier's class keeps its own engine. A tier
whose class this server does not serve (an ``--engine`` that lacks it, a model override that removed it)
is not used: the model runs as named and the Response says ``default``, as OpenAI says which tier served.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from proto.core.response import echo_service_tier

# Speed classes, slowest first: a tier's class and every class after it are at least its speed.
SPEED_CLASSES = ("mock-1000tps", "mock-4000tps")
# tier -> the speed class it asks for (None: the model's own engine)
TIER_CLASS: dict[str, str | None] = {
    "default": None,
    "flex": None,
    "scale": None,
    "priority": "mock-1000tps",
    "ultrafast": "mock-4000tps",
}


@dataclass(frozen=True)
class Served:
    engine: str  # the engine (catalogue model) that runs the response
    tier: str  # the Response's ``service_tier``: the tier actually used


def serve(model: str, tier: str | None, served: Container[str]) -> Served:
    """The engine for ``model`` at ``tier`` among the ``served`` engine names, and the tier to echo. An
    unknown ``model`` comes back as it is (its refusal, ``model_not_found``, names it)."""
    asked = echo_service_tier(tier)
    target = TIER_CLASS.get(asked)
    if target is None or model not in served:
        return Served(model, asked if asked in TIER_CLASS else "default")
    if model in SPEED_CLASSES and SPEED_CLASSES.index(model) >= SPEED_CLASSES.index(target):
        return Served(model, asked)  # already at the tier's speed or faster
    if target not in served:
        return Served(model, "default")
    return Served(target, asked)
