"""The walk of a tool round-trip runs one way: ``sampler/`` yields, its owner in ``proto/server`` decides.
No module of ``sampler/`` may import the server or the client (a callback stored on a sampler object, or an
import reaching up, would make the walk cross back). The source is read, imports inside functions too."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_boundaries import _imports

SAMPLER = Path(__file__).resolve().parent.parent / "sampler"
MODULES = sorted(path.stem for path in SAMPLER.glob("*.py"))


def test_the_sampler_modules_are_the_ones_we_expect() -> None:
    assert {"loop", "gpu", "clock", "policy", "tokens"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_no_sampler_module_reaches_up_into_the_server_or_the_client(module: str) -> None:
    imported = _imports(SAMPLER / f"{module}.py")
    assert {name for name in imported if name.startswith(("proto.server", "proto.client", "proto.lab"))} == set()
