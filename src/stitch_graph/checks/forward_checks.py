"""Checks of what the forward path does: launches, torch compute, value reads, caches.

The forward path is where the measured work happens, so it is held to the strictest rules: it
must launch a kernel, must not compute through PyTorch (except ops the candidate declares),
must not let input values steer it, and must not be memoised. Tensor-ness comes from the
analyzer in :mod:`stitch_graph.checks.forward`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from stitch_graph.checks.forward import _Analyzer
from stitch_graph.checks.names import _attr_chain
from stitch_graph.checks.opnames import op_key
from stitch_graph.checks.vocabulary import _BINOP_NAMES, _CACHE_DECORATORS, _VALUE_READ_METHODS

if TYPE_CHECKING:
    from stitch_graph.checks.context import Findings, FunctionContext, HostContext, MethodContext


def _check_kernel_launch(host: HostContext, out: Findings) -> None:
    """A forward path that launches no kernel, directly or through a helper."""
    if "forward" not in host.launching:
        out.add(
            "no_kernel_launch", "the forward path launches no kernel", host.path["forward"].node
        )


def _check_conditions(fn: FunctionContext, out: Findings) -> None:
    """Conditions whose truth depends on tensor values."""
    for test in fn.test_roots:
        for sub in _truth_operands(test):
            if fn.an.is_tensor(sub):
                out.add(
                    "input_branch",
                    f"condition depends on tensor values: {ast.unparse(sub)[:60]}",
                    sub,
                )


def _check_value_reads(node: ast.AST, fn: FunctionContext, out: Findings) -> None:
    """Calls that bring tensor values to the host (per node)."""
    if not isinstance(node, ast.Call):
        return
    an = fn.an
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in _VALUE_READ_METHODS:
        if func.attr in {"item", "tolist", "numpy", "__bool__"} or an.is_tensor(func.value):
            out.add("input_branch", f".{func.attr}() reads tensor values on the host", node)
    dotted = an.names.dotted(func)
    if dotted in {
        "torch.equal",
        "torch.allclose",
        "torch.is_nonzero",
        "torch.any",
        "torch.all",
        "torch.count_nonzero",
    }:
        out.add("input_branch", f"{dotted}() inspects tensor values", node)
    if isinstance(func, ast.Name) and func.id in {"bool", "float", "int", "list", "len"}:
        if func.id != "len" and node.args and an.is_tensor(node.args[0]):
            out.add("input_branch", f"{func.id}(tensor) reads tensor values on the host", node)


def _check_torch_compute(node: ast.AST, fn: FunctionContext, out: Findings) -> None:
    """PyTorch computing part of the result: calls, operators, slice copies, gathers (per node).

    Ops the candidate declares are noted as declared uses instead.
    """
    an = fn.an
    declared = fn.host.candidate.declared_ops

    def compute(op: str, shown: str, node: ast.AST) -> None:
        if op_key(op) in declared:
            out.declare(op, f"declared torch op {op} via {shown}", node)
        else:
            out.add("torch_compute", f"PyTorch computes {shown} in the forward path", node)

    if isinstance(node, ast.Call):
        resolved = an.resolve_op(node)
        if resolved:
            compute(*resolved, node)
    elif isinstance(node, ast.BinOp):
        if an.is_tensor(node.left) or an.is_tensor(node.right):
            op = _BINOP_NAMES.get(type(node.op), "binary_op")
            compute(op, f"tensor operator {ast.unparse(node)[:60]}", node)
    elif isinstance(node, ast.AugAssign):
        if an.is_tensor(node.target) or an.is_tensor(node.value):
            op = _BINOP_NAMES.get(type(node.op), "binary_op")
            compute(op, f"in-place tensor operator {ast.unparse(node)[:60]}", node)
    elif isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
        if an.is_tensor(node.operand):
            compute("neg", f"tensor operator {ast.unparse(node)[:60]}", node)
    elif isinstance(node, ast.Compare) and id(node) not in fn.test_node_ids:
        if an.is_tensor(node):
            compute("compare", f"tensor comparison {ast.unparse(node)[:60]}", node)
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Subscript) and an.is_tensor(target.value):
                if an.is_tensor(node.value):
                    compute("copy", f"tensor slice assignment {ast.unparse(target)}", node)
    if isinstance(node, ast.Subscript) and an.is_tensor(node.value):
        if _advanced_index(node.slice, an):
            store = isinstance(node.ctx, ast.Store | ast.Del)
            op = "index_put" if store else "index"
            shown = ast.unparse(node)[:60]
            compute(op, f"advanced indexing {shown}" + (" (assignment)" if store else ""), node)


def _check_cache_decorators(fn: FunctionContext, out: Findings) -> None:
    """functools caches wrapped around a forward-path function.

    A module function that only builds and returns a launcher (a raw kernel compiled once) may
    be cached: what it keeps is the compiled kernel, not an output.
    """
    func = fn.node
    if fn.key in fn.host.external.launcher_functions:
        return
    for deco in func.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        dotted = fn.an.names.dotted(target) or _attr_chain(target) or ""
        if dotted in _CACHE_DECORATORS or dotted.rsplit(".", 1)[-1] in {"lru_cache", "cache"}:
            out.add("output_cache", f"{func.name} is wrapped in {dotted}", deco)


def _check_method_caches(method: MethodContext, out: Findings) -> None:
    """functools caches on ModelNew methods off the forward path (cached properties too)."""
    for deco in method.node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        dotted = method.host.names.dotted(target) or _attr_chain(target) or ""
        if dotted.rsplit(".", 1)[-1] in {"lru_cache", "cache", "cached_property"}:
            out.add("output_cache", f"{method.name} is wrapped in {dotted}", deco)


def _advanced_index(index: ast.AST, an: _Analyzer) -> bool:
    """Whether a subscript of a tensor gathers or scatters rather than taking a view.

    Ints, slices, ``None`` and ``...`` (and names bound to Python values) index basically, a
    view. A tensor index, a mask built by a comparison or a list of positions makes PyTorch
    gather (or, assigned to, scatter): real work. The source shows only what names are bound
    to, so a tensor is whatever the analyzer knows as one (forward's tensor arguments, module
    parameters and buffers, results of torch calls).
    """
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    for item in items:
        if isinstance(item, ast.List | ast.ListComp | ast.Tuple):
            return True
        if an.is_tensor(item):  # a tensor, or a comparison of one (a mask)
            return True
    return False


def _truth_operands(test: ast.AST) -> Iterator[ast.AST]:
    """The sub-expressions of a condition whose truth value decides it."""
    if isinstance(test, ast.BoolOp):
        for value in test.values:
            yield from _truth_operands(value)
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yield from _truth_operands(test.operand)
    elif isinstance(test, ast.Compare):
        if not all(isinstance(op, ast.Is | ast.IsNot) for op in test.ops):
            yield test
    else:
        yield test
