"""The import graph of nnhal's packages: no circles, and the layers import only downwards.

Every import statement counts: module level, inside a function (a function-local import that
hides a circle is still a circle) and under ``if TYPE_CHECKING``. A package's ``__init__``
importing its own modules is not a circle (Python imports the package before any of its modules;
that is how re-exports work). Vendor extensions that ship as their own distributions
(extensions/examples, extensions/mediapipe) are plugins, not layers, and are left out.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hal", "cache", "service", "extensions", "delegate", "nnhal")
#: The layers each package may import (the architecture: hal knows nothing of gRPC or TFLite,
#: service adapts hal to gRPC, delegate adapts TFLite to the service, extensions plug into hal,
#: cache is storage only; the tools in nnhal/ use everything).
ALLOWED = {
    "hal": set(),
    "cache": set(),
    "service": {"hal", "cache"},
    "extensions": {"hal"},
    "delegate": {"hal", "service", "extensions"},
    "nnhal": {"hal", "cache", "service", "extensions", "delegate"},
}
#: Third-party modules a layer must not import.
FORBIDDEN_THIRD_PARTY = {
    "hal": {"grpc", "tflite_runtime", "ai_edge_litert", "flatbuffers"},
    "cache": {"grpc", "tflite_runtime", "ai_edge_litert"},
    "service": {"tflite_runtime", "ai_edge_litert"},
}
SEPARATE_DISTRIBUTIONS = (ROOT / "extensions" / "examples", ROOT / "extensions" / "mediapipe")


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if any(path.is_relative_to(d) for d in SEPARATE_DISTRIBUTIONS) or "tests" in path.parts \
                    or path.relative_to(ROOT).parts[:2] == ("service", "proto"):
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import of ``name`` executes last (a name inside a module: that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> tuple[set[str], set[str]]:
    """(project modules, top-level third-party names) imported anywhere in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours, theirs = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                node_module = ".".join(base + ([node.module] if node.module else []))
            else:
                node_module = node.module or ""
            names = [f"{node_module}.{a.name}" if f"{node_module}.{a.name}" in MODULES else node_module
                     for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is None:
                theirs.add(name.split(".")[0])
            elif target != module:
                ours.add(target)
    return ours, theirs


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_walk_sees_every_layer_and_function_local_imports():
    assert set(m.split(".")[0] for m in MODULES) == set(PACKAGES)
    # delegate.runtime is imported inside a function (host_runtime: on first use, not at import)
    assert "delegate.runtime" in GRAPH["delegate.mapping.host_runtime"][0]


def test_the_cycle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_circles():
    circles = _cycles({m: ours for m, (ours, _) in GRAPH.items()})
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_downwards(layer):
    wrong = sorted(f"{m} imports {d}" for m, (ours, _) in GRAPH.items() if m.split(".")[0] == layer
                   for d in ours if d.split(".")[0] not in ALLOWED[layer] | {layer})
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_THIRD_PARTY))
def test_layers_do_not_import_what_they_adapt_to(layer):
    wrong = sorted(f"{m} imports {t}" for m, (_, theirs) in GRAPH.items() if m.split(".")[0] == layer
                   for t in theirs & FORBIDDEN_THIRD_PARTY[layer])
    assert not wrong, "\n".join(wrong)
