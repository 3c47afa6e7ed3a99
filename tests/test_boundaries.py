"""``proto/`` is sans-IO: the modules directly in it open no socket and run no event loop (after h11).

Two checks, because each misses what the other sees: the source (every ``import``, even one inside a
function) and the import itself, in a fresh interpreter, where a dependency could drag a network module
in behind our back. The I/O adapters live in ``proto.server`` and ``proto.client`` and are not checked.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PROTO = Path(__file__).resolve().parent.parent / "proto"

# Anything that does I/O or schedules it. The brief's five, plus the other ways to the network.
FORBIDDEN = frozenset({"socket", "asyncio", "starlette", "uvicorn", "websockets", "wsproto", "ssl", "selectors", "anyio", "httpx", "trio"})

# The command line lives in proto/ for `python -m proto` and the console script: it starts the server,
# the demo or the lab, so it may reach the I/O (only inside its functions).
ENTRY_POINTS = frozenset({"__main__", "cli"})

CORE = sorted(path.stem for path in PROTO.glob("*.py") if path.stem not in ENTRY_POINTS)


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
    assert {"builder", "codec", "errors", "events", "items", "longlived", "response", "state", "work"} <= set(CORE)


@pytest.mark.parametrize("module", CORE)
def test_source_imports_no_io(module: str) -> None:
    imported = _imports(PROTO / f"{module}.py")
    assert {name.split(".")[0] for name in imported} & FORBIDDEN == set()
    # Nor the adapters, which would bring the I/O in with them.
    assert {name for name in imported if name.startswith(("proto.server", "proto.client"))} == set()


@pytest.mark.parametrize("module", CORE)
def test_importing_loads_no_io(module: str) -> None:
    code = f"import json, sys; import proto.{module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROTO.parent, check=True)
    loaded = {name.split(".")[0] for name in json.loads(result.stdout)}
    assert loaded & FORBIDDEN == set()
    assert not [name for name in json.loads(result.stdout) if name.startswith(("proto.server", "proto.client"))]


def test_the_check_would_see_an_import() -> None:
    # The AST walk finds imports hidden in functions, the way cli.py reaches the server.
    assert "proto.server.run" in _imports(PROTO / "cli.py")
