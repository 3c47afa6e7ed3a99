"""``proto/core`` is sans-IO: its modules open no socket and run no event loop (after h11).

Two checks, because each misses what the other sees: the source (every ``import``, even one inside a
function) and the import itself, in a fresh interpreter, where a dependency could drag a network module
in behind our back. The I/O adapters live in the other packages and are not checked.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PROTO = Path(__file__).resolve().parent.parent / "proto"
CORE_DIR = PROTO / "core"

# Anything that does I/O or schedules it, and every way to the network.
FORBIDDEN = frozenset(
    {
        "socket",
        "asyncio",
        "starlette",
        "uvicorn",
        "websockets",
        "wsproto",
        "ssl",
        "selectors",
        "anyio",
        "httpx",
        "trio",
    }
)

CORE = sorted(path.stem for path in CORE_DIR.glob("*.py") if path.stem != "__init__")
# The core may import only itself (and the standard library and msgspec-level dependencies).
OUTSIDE = (
    "proto.server",
    "proto.client",
    "proto.engine",
    "proto.lab",
    "proto.demo",
    "proto.load",
    "proto.perf",
    "proto.processes",
    "proto.cli",
    "sampler",
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_core_modules_are_the_ones_we_expect() -> None:
    # A floor, not the whole list: new core modules are checked without editing this file.
    assert {"builder", "codec", "errors", "events", "items", "longlived", "response", "state", "work"} <= set(
        CORE
    )


@pytest.mark.parametrize("module", CORE)
def test_source_imports_no_io(module: str) -> None:
    imported = _imports(CORE_DIR / f"{module}.py")
    assert {name.split(".")[0] for name in imported} & FORBIDDEN == set()
    # Nor the adapters, which would bring the I/O in with them.
    assert {name for name in imported if name.startswith(OUTSIDE)} == set()


@pytest.mark.process
@pytest.mark.parametrize("module", CORE)
def test_importing_loads_no_io(module: str) -> None:
    code = f"import json, sys; import proto.core.{module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROTO.parent, check=True
    )
    loaded = {name.split(".")[0] for name in json.loads(result.stdout)}
    assert loaded & FORBIDDEN == set()
    assert not [name for name in json.loads(result.stdout) if name.startswith(OUTSIDE)]


def test_the_check_would_see_an_import() -> None:
    # The AST walk finds imports hidden in functions, the way cli.py reaches the server.
    assert "proto.server.serve" in _imports(PROTO / "cli.py")
