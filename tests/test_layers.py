"""The layers, as docs/architecture.md ("Layers") draws them, read from the source (imports inside
functions too).

* The walk of a tool round-trip runs one way: ``sampler/`` yields, its owner in ``proto/server`` decides.
  No module of ``sampler/`` may import the server, the client or the lab (a callback stored on a sampler
  object, or an import reaching up, would make the walk cross back).
* The engine interface (``sampler/engine.py``) owns its errors and its report: the mock GPU and the remote
  engine import them from it, never from each other. The fast path is no exception: the GPU *yields* its
  pacing, the driver waits on its timer (docs/architecture.md, "The fast path"); nothing in ``sampler/``
  holds a callback of the driver's.
* Nothing on the server side imports a client tool, and the import graph has no circle but the optional
  backend factory (``storage.database`` picks ``storage.postgres`` when ``--db`` names a server).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from test_boundaries import _imports

ROOT = Path(__file__).resolve().parent.parent
SAMPLER = ROOT / "sampler"
MODULES = sorted(path.stem for path in SAMPLER.glob("*.py"))


def _graph() -> dict[str, set[str]]:
    """Module → the project's modules it imports (relative imports resolved, ``from p import m`` as
    ``p.m``)."""
    modules: dict[str, Path] = {}
    for package in ("proto", "sampler"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                candidates = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(c for c in candidates if c in modules and c != name)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_the_sampler_modules_are_the_ones_we_expect() -> None:
    assert {"loop", "gpu", "clock", "policy", "tokens", "engine"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_no_sampler_module_reaches_up_into_the_server_or_the_client(module: str) -> None:
    imported = _imports(SAMPLER / f"{module}.py")
    up = (
        "proto.server",
        "proto.client",
        "proto.lab",
        "proto.engine",
        "proto.demo",
        "proto.load",
        "proto.perf",
    )
    assert {name for name in imported if name.startswith(up)} == set()


@pytest.mark.slow
def test_the_engine_interface_owns_its_types() -> None:
    graph = _graph()
    # The interface depends on no engine: only on the model limits and the clock's timer (a paced turn's).
    assert not graph["sampler.engine"] - {"sampler.models", "sampler.clock"}
    for remote in ("proto.engine.client", "proto.engine.wire"):
        assert "sampler.gpu" not in graph[remote], remote
    for name in ("sampler.gpu", "proto.engine.client", "proto.server.driver"):
        assert "sampler.engine" in graph[name], name


@pytest.mark.slow
def test_the_server_imports_no_client_tool() -> None:
    graph = _graph()
    tools = ("proto.client", "proto.demo", "proto.load", "proto.perf", "proto.lab")
    for name, imported in graph.items():
        if name.startswith(("proto.server", "proto.engine", "proto.core")):
            assert {m for m in imported if m.startswith(tools)} == set(), name


@pytest.mark.slow
def test_the_client_tools_speak_to_the_server_only_over_the_wire() -> None:
    # The client library, the lab, the load tools and the perf suite start servers as child processes
    # (proto.processes) and import nothing of the server; the demo may run one in process (``serving``).
    graph = _graph()
    for name, imported in graph.items():
        if name.startswith(("proto.client", "proto.lab", "proto.load", "proto.perf")):
            assert {m for m in imported if m.startswith("proto.server")} == set(), name


@pytest.mark.slow
def test_the_import_graph_has_no_circle_but_the_backend_factory() -> None:
    assert _circles(_graph()) == [{"proto.server.storage.database", "proto.server.storage.postgres"}]


def test_the_circle_check_would_see_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_every_engine_runs_a_turn_with_the_same_parameters_and_takes_no_callback() -> None:
    """The engine reports when tokens are due; it is handed nothing to call (docs/architecture.md, "The
    fast path"): the interface, the mock GPU and the remote engine take the same three parameters."""
    import inspect

    from proto.engine.client import RemoteSequence
    from sampler.engine import EngineSequence
    from sampler.gpu import GpuSequence

    def parameters(fn: object) -> list[str]:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]

    expected = ["self", "prompt_ids", "output_ids", "every_s"]
    assert (
        parameters(EngineSequence.run_turn)
        == parameters(GpuSequence.run_turn)
        == parameters(RemoteSequence.run_turn)
        == expected
    )
    assert parameters(GpuSequence.run_paced) == expected[:3]
