"""Resolve what a name in the host code stands for.

Host code can spell one callable many ways: ``F.relu``, ``torch.nn.functional.relu``, a local
alias ``f = torch.relu``, ``getattr(torch, "re" + "lu")``. The checks decide by dotted path, so
they first map each expression back to the imported path it refers to; these helpers do that.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from stitch_graph.checks.vocabulary import _NEW_ALLOC_METHODS, _VIEW_METHODS, _VIEW_OPS


def _attribute_chain(node: ast.AST) -> list[str]:
    """``a.b.c`` as ``["a", "b", "c"]`` (empty when the root is not a plain name)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    parts.append(node.id)
    return parts[::-1]


def _const_str(node: ast.AST) -> str | None:
    """The value of a string expression built only from literals, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const_str(node.left), _const_str(node.right)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue):
                inner = _const_str(value.value)
                if inner is None:
                    return None
                parts.append(inner)
            else:
                return None
        return "".join(parts)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.List | ast.Tuple)
    ):
        sep = _const_str(node.func.value)
        items = [_const_str(e) for e in node.args[0].elts]
        if sep is not None and all(i is not None for i in items):
            return sep.join(i for i in items if i is not None)
    return None


class _Names:
    """Maps local names to the dotted module paths they stand for (``F`` → torch.nn.functional)."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        # Simple rebinding: ``f = torch.relu`` or ``c = getattr(torch, "compile")``.
        for _ in range(2):
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                ):
                    dotted = self.dotted(node.value)
                    if dotted and dotted.split(".")[0] in self._modules():
                        self.aliases.setdefault(node.targets[0].id, dotted)

    def _modules(self) -> set[str]:
        return {v.split(".")[0] for v in self.aliases.values()}

    def dotted(self, node: ast.AST) -> str | None:
        """The dotted path ``node`` refers to, when it is rooted at an imported name."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
        ):
            base = self.dotted(node.args[0])
            name = _const_str(node.args[1])
            if base and name:
                return f"{base}.{name}"
        return None


def _has_prefix(dotted: str, prefixes: Iterable[str]) -> str | None:
    for prefix in prefixes:
        if dotted == prefix or dotted.startswith(prefix + "."):
            return prefix
    return None


def _attr_chain(node: ast.AST) -> str | None:
    """``self.a.b`` for nested attributes on a plain name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _attr_chain(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _view_operand(node: ast.Call, names: _Names) -> ast.AST | None:
    """The tensor a view call returns a view of, for every spelling: ``x.flatten(1)``,
    ``torch.flatten(x, 1)``, ``torch.Tensor.flatten(x, 1)``; None for any other call."""
    func = node.func
    dotted = names.dotted(func)
    if dotted:
        last = dotted.rsplit(".", 1)[-1]
        functional = dotted == f"torch.{last}" and last in _VIEW_OPS
        unbound = dotted == f"torch.Tensor.{last}" and last in _VIEW_METHODS
        if not (functional or unbound) or last in _NEW_ALLOC_METHODS:
            return None
        if node.args:
            return node.args[0]
        return next((k.value for k in node.keywords if k.arg in {"input", "self"}), None)
    if isinstance(func, ast.Attribute) and func.attr in _VIEW_METHODS:
        return None if func.attr in _NEW_ALLOC_METHODS else func.value
    return None
