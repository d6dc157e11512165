"""The package layout, checked from outside: layers, circles, file sizes, where LangChain lives.

Every import in ``src/`` is read from the syntax tree, function-level imports included, so a
circle hidden in a late import is found too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "stitch_graph"

# Bottom to top; a package may import only packages of a lower layer (and itself).
LAYERS: list[set[str]] = [
    {"artifacts"},
    {"runtime", "toolchain", "shapes"},
    {"checks", "task", "codegen", "knowledge"},
    {"execution", "reward"},
    {"bench"},
    {"agents"},
    {"graph"},
    {"cli"},
]
AGENT_PACKAGES = {"agents", "graph", "cli"}
AGENT_LIBRARIES = (
    "langchain",
    "langchain_core",
    "langchain_community",
    "langchain_openai",
    "langgraph",
)
MAX_LINES = 1000


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (names resolved to existing modules)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in _imports(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target != "stitch_graph":
                edges[name].add(target)
    return edges


def _package(module: str) -> str:
    return module.split(".")[1]


def _layer(package: str) -> int:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    msg = f"package {package!r} is in no layer: add it to LAYERS in {Path(__file__).name}"
    raise AssertionError(msg)


def test_every_package_is_in_a_layer():
    packages = {_package(_module_name(p)) for p in SRC.rglob("*.py") if p.parent != SRC}
    packages |= {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    for package in packages:
        _layer(package)


def test_imports_point_down_the_layers():
    upward = [
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if a != "stitch_graph"
        and _package(a) != _package(b)
        and _layer(_package(a)) <= _layer(_package(b))
    ]
    assert upward == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in edges.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_between_modules():
    # A package's __init__ re-exports its modules; an edge from a module to its own package's
    # __init__ is the re-export seen backwards, not a dependency.
    edges = {
        a: {b for b in targets if not a.startswith(f"{b}.")}
        for a, targets in _graph().items()
        if a != "stitch_graph"
    }
    assert _cycles(edges) == []


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_source_files_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines; split it by concern"


def test_langchain_only_in_agent_packages():
    offenders = [
        f"{_module_name(path)} imports {target}"
        for path in SRC.rglob("*.py")
        if path.parent != SRC and _package(_module_name(path)) not in AGENT_PACKAGES
        for target in _imports(path)
        if target.split(".")[0] in AGENT_LIBRARIES
    ]
    assert offenders == []
