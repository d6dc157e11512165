"""Follow forward's outputs back to what wrote them.

An output that no kernel writes in this call is either a constant or fresh allocation (wrong
values that may still pass a loose tolerance) or state kept from an earlier call (a cache). The
checks here walk forward statement by statement, tracking which buffers launched kernels write,
and look for containers on ``self`` or in globals that are looked up by an input's identity.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stitch_graph.checks.forward import _Analyzer
from stitch_graph.checks.names import _view_operand
from stitch_graph.checks.vocabulary import (
    _ALLOCATORS,
    _CONSTANT_ALLOCATORS,
    _NEW_ALLOC_METHODS,
    _TENSOR_ATTRS,
)

if TYPE_CHECKING:
    from stitch_graph.checks.context import Findings, FunctionContext


def _check_output_flow(fn: FunctionContext, out: Findings) -> None:
    """Forward's returned values: constants, unwritten allocations, state from earlier calls."""
    if not fn.is_forward:
        return
    host = fn.host
    _OutputFlow(fn.an, host.launching - {"forward"}, host.module_vars, out).run()


@dataclass
class _Flow:
    written: set[str] = field(default_factory=set)
    launched: bool = False

    def copy(self) -> _Flow:
        return _Flow(set(self.written), self.launched)


class _OutputFlow:
    """Walks forward in order to see which buffers a kernel writes before each return."""

    def __init__(
        self,
        an: _Analyzer,
        launching_helpers: set[str],
        module_vars: set[str],
        out: Findings,
    ) -> None:
        self.an = an
        self.helpers = launching_helpers
        self.out = out
        self.roots: dict[str, set[str]] = {}
        self.constant_allocs: set[str] = set()
        self.globals_: set[str] = set(module_vars)
        self.cache_keys: set[str] = set()

    # roots ----------------------------------------------------------------------------------

    def roots_of(self, node: ast.AST | None) -> set[str]:
        if node is None:
            return set()
        if isinstance(node, ast.Name):
            if node.id in self.roots:
                return set(self.roots[node.id])
            if node.id in self.globals_:
                return {f"global.{node.id}"}
            return {node.id}
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return {f"self.{node.attr}"}
            if node.attr in _TENSOR_ATTRS:
                return self.roots_of(node.value)
            return set()
        if isinstance(node, ast.Subscript | ast.Starred):
            return self.roots_of(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _NEW_ALLOC_METHODS:
                return {f"alloc@{node.lineno}:{node.col_offset}"}
            operand = _view_operand(node, self.an.names)
            if operand is not None:
                return self.roots_of(operand)
            if isinstance(func, ast.Attribute) and func.attr in {"get", "setdefault", "pop"}:
                return self.roots_of(func.value)
            dotted = self.an.names.dotted(func)
            if dotted and dotted.count(".") == 1 and dotted.split(".")[1] in _ALLOCATORS:
                return {f"alloc@{node.lineno}:{node.col_offset}"}
        return set()

    def _args_roots(self, call: ast.Call) -> set[str]:
        roots: set[str] = set()
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            for sub in ast.walk(arg):
                if isinstance(sub, ast.Name | ast.Attribute | ast.Subscript | ast.Call):
                    roots |= self.roots_of(sub)
        return roots

    def _elements_roots(self, value: ast.Tuple | ast.List) -> set[str]:
        roots: set[str] = set()
        for element in value.elts:
            for sub in ast.walk(element):
                if isinstance(sub, ast.Name | ast.Attribute | ast.Subscript | ast.Call):
                    roots |= self.roots_of(sub)
        return roots

    def _helper_key(self, call: ast.Call) -> str | None:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self":
                return f"self.{func.attr}"
        return None

    # walking --------------------------------------------------------------------------------

    def run(self) -> None:
        func = self.an.fn.node
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                self.globals_.update(node.names)
        self._block(func.body, _Flow())

    def _effects(self, node: ast.AST, flow: _Flow) -> None:
        """Launches and helper calls inside one statement's expressions, in source order."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                if self.an.is_launch(sub):
                    flow.launched = True
                    flow.written |= self._args_roots(sub)
                    if isinstance(sub.func, ast.Attribute) and sub.func.attr == "replay":
                        flow.written.add("*")
                elif self._helper_key(sub) in self.helpers:
                    flow.launched = True
                    flow.written |= self._args_roots(sub)
                    flow.written.add("self.*")

    def _assign(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            roots = self.roots_of(value)
            if isinstance(value, ast.Tuple | ast.List):
                # an argument tuple built ahead of a launch: the launch writes what it holds
                roots = self._elements_roots(value)
            self.roots[target.id] = roots
            if isinstance(value, ast.Call):
                dotted = self.an.names.dotted(value.func) or ""
                if dotted.rsplit(".", 1)[-1] in _CONSTANT_ALLOCATORS:
                    self.constant_allocs |= roots
            if _mentions_identity(value):
                self.cache_keys.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._assign(t, v)

    def _block(self, body: list[ast.stmt], flow: _Flow) -> _Flow | None:
        """Walk statements; returns the flow at the end, or None when every path returned."""
        for stmt in body:
            if isinstance(stmt, ast.Return):
                self._effects(stmt, flow)
                self._check_return(stmt, flow)
                return None
            if isinstance(stmt, ast.If):
                self._effects(stmt.test, flow)
                a = self._block(stmt.body, flow.copy())
                b = self._block(stmt.orelse, flow.copy())
                if a is None and b is None:
                    return None
                flow = _merge(a, b)
                continue
            if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
                head = stmt.iter if isinstance(stmt, ast.For | ast.AsyncFor) else stmt.test
                self._effects(head, flow)
                inner = self._block(stmt.body, flow.copy())
                if inner is not None:  # loops of launches are assumed to run
                    flow = _merge(flow, inner) if not inner.launched else inner
                rest = self._block(stmt.orelse, flow.copy())
                if rest is not None:
                    flow = rest
                continue
            if isinstance(stmt, ast.With | ast.AsyncWith):
                for item in stmt.items:
                    self._effects(item.context_expr, flow)
                inner = self._block(stmt.body, flow)
                if inner is None:
                    return None
                flow = inner
                continue
            if isinstance(stmt, ast.Try):
                inner = self._block(stmt.body, flow.copy())
                handlers = [self._block(h.body, flow.copy()) for h in stmt.handlers]
                paths = [p for p in [inner, *handlers] if p is not None]
                if not paths:
                    return None
                flow = paths[0]
                for p in paths[1:]:
                    flow = _merge(flow, p)
                final = self._block(stmt.finalbody, flow)
                if final is None:
                    return None
                flow = final
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            self._effects(stmt, flow)
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    self._assign(target, stmt.value)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self._assign(stmt.target, stmt.value)
        return flow

    def _constant_expr(self, node: ast.AST, flow: _Flow) -> bool:
        """Whether ``node`` is built only from literals and constant allocations."""
        if isinstance(node, ast.Constant):
            return node.value is not None
        if isinstance(node, ast.Call):
            dotted = self.an.names.dotted(node.func) or ""
            if dotted.startswith("torch") and dotted.rsplit(".", 1)[-1] in _CONSTANT_ALLOCATORS:
                return True
            operand = _view_operand(node, self.an.names)
            if operand is not None:
                return self._constant_expr(operand, flow)
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _NEW_ALLOC_METHODS:
                return self._constant_expr(func.value, flow)
            return False
        if isinstance(node, ast.BinOp):
            return self._constant_expr(node.left, flow) and self._constant_expr(node.right, flow)
        if isinstance(node, ast.UnaryOp):
            return self._constant_expr(node.operand, flow)
        if isinstance(node, ast.Name):
            roots = self.roots_of(node)
            return bool(roots) and all(
                r in self.constant_allocs and r not in flow.written for r in roots
            )
        return False

    def _check_return(self, stmt: ast.Return, flow: _Flow) -> None:
        value = stmt.value
        if value is None:
            return
        items = value.elts if isinstance(value, ast.Tuple | ast.List) else [value]
        for item in items:
            self._check_returned(item, stmt, flow)

    def _check_returned(self, item: ast.AST, stmt: ast.Return, flow: _Flow) -> None:
        shown = ast.unparse(item)[:60]
        if isinstance(item, ast.Constant) and item.value is not None:
            self.out.add("constant_output", f"returns the literal {shown}", stmt)
            return
        if self._constant_expr(item, flow):
            self.out.add("constant_output", f"returns a constant tensor {shown}", stmt)
            return
        if "*" in flow.written:
            return
        roots = self.roots_of(item)
        for root in sorted(roots):
            if root in flow.written:
                continue
            if root.startswith("alloc@"):
                kind = "constant" if root in self.constant_allocs else "fresh"
                self.out.add(
                    "constant_output",
                    f"returns a {kind} allocation ({shown}) that no kernel writes first",
                    stmt,
                )
            elif root.startswith("self.") and "self.*" not in flow.written:
                self.out.add(
                    "output_cache",
                    f"returns {root} without a kernel writing it in this call",
                    stmt,
                )
            elif root.startswith("global."):
                self.out.add(
                    "output_cache",
                    f"returns module state {root[7:]} without a kernel writing it in this call",
                    stmt,
                )


def _merge(a: _Flow | None, b: _Flow | None) -> _Flow:
    if a is None:
        return b.copy() if b else _Flow()
    if b is None:
        return a.copy()
    return _Flow(a.written & b.written, a.launched and b.launched)


def _mentions_identity(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr in {"data_ptr", "untyped_storage"}:
                return True
            if isinstance(func, ast.Name) and func.id in {"id", "hash"}:
                return True
    return False


def _check_keyed_caches(fn: FunctionContext, out: Findings) -> None:
    """Containers on self or in globals looked up by an input's identity (data_ptr, id)."""
    key_names: set[str] = set()
    for node in ast.walk(fn.node):
        if isinstance(node, ast.Assign) and _mentions_identity(node.value):
            key_names.update(
                sub.id for t in node.targets for sub in ast.walk(t) if isinstance(sub, ast.Name)
            )

    def is_key(expr: ast.AST) -> bool:
        return _mentions_identity(expr) or any(
            isinstance(s, ast.Name) and s.id in key_names for s in ast.walk(expr)
        )

    def is_store(container: ast.AST) -> bool:
        return not isinstance(container, ast.Name) or container.id not in {"KERNELS", "LIB"}

    for node in ast.walk(fn.node):
        hit = None
        if isinstance(node, ast.Subscript) and is_key(node.slice) and is_store(node.value):
            hit = node
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "setdefault", "__getitem__", "__contains__"}
            and node.args
            and is_key(node.args[0])
        ):
            hit = node
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.In | ast.NotIn) for op in node.ops
        ):
            if is_key(node.left):
                hit = node
        if hit is not None:
            out.add(
                "output_cache",
                f"cache looked up by an input's identity: {ast.unparse(hit)[:60]}",
                hit,
            )
