"""Order statistics as one sort: ``sort``, ``argsort``, ``msort``, ``topk``, ``kthvalue``,
``median`` and ``quantile`` lowered to ``sort_values`` / ``sort_indices`` along a dim plus views
and pointwise ops of the result.

Each reads the sorted line at fixed positions, so one kernel (``_emit_sort``) covers them all.
Indices are generated for ``sort``, ``argsort``, ``topk`` and ``kthvalue`` (lines up to
``MAX_ARGSORT_LINE``); ties keep their order, which is ``stable=True``'s order and one of the
orders PyTorch's unstable sort may give. ``topk`` of longer lines selects its ``k`` (up to
``MAX_TOPK``) without sorting the line (``topk_values``, ``topk_indices``). ``median``'s
indices, other lines longer than ``MAX_SORT_LINE`` and ``topk(sorted=False)``, whose order
PyTorch leaves open, stay in PyTorch.
``median`` and ``quantile`` propagate NaN as PyTorch does: sorted, a line's NaNs come last.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen._emit_sort import MAX_ARGSORT_LINE, MAX_SORT_LINE, MAX_TOPK
from stitch_graph.codegen.ir import ProgramIR, Ref

ORDER_SIGNATURES = {
    "sort": "input, dim=-1, descending=False, stable=False",
    "argsort": "input, dim=-1, descending=False, stable=False",
    "msort": "input",
    "topk": "input, k, dim=-1, largest=True, sorted=True",
    "kthvalue": "input, k, dim=-1, keepdim=False",
    "median": "input, dim=None, keepdim=False",
    "quantile": "input, q, dim=None, keepdim=False, interpolation='linear'",
}
ORDER_METHODS = frozenset(ORDER_SIGNATURES)


def uses(fx_node: torch.fx.Node) -> set[int] | None:
    """Which of a (values, indices) result's elements the program reads; ``None`` when the
    pair itself is used in another way."""
    used = set()
    for user in fx_node.users:
        if user.target is operator.getitem and user.args[1] in (0, 1):
            if user.users:  # an exported graph picks the unused indices too
                used.add(int(user.args[1]))
        elif user.target is builtins.getattr and user.args[1] in ("values", "indices"):
            used.add(0 if user.args[1] == "values" else 1)
        else:
            return None
    return used


def _positions(ir: ProgramIR, ref: Ref) -> bool:
    """Whether ``ref`` holds a sort's positions along its lines (int64 values below a line's
    length, which float32 holds exactly)."""
    node = ir.node(ref.name) if ref.kind == "node" else None
    return node is not None and node.op == "sort_indices" and ir.dtypes.get(ref) == "int64"


def returns_pair(name: str, a: dict[str, Any]) -> bool:
    """Whether the call returns (values, indices) rather than a tensor."""
    return name in ("sort", "topk", "kthvalue") or (name == "median" and a["dim"] is not None)


def order_statistic(
    ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any], indices: bool = False
) -> Any:
    """The call's values (and indices, where ``indices``) from one sort of the line; ``None``
    where the rule does not apply."""
    x = a["input"]
    if name == "argsort" and isinstance(x, Ref) and _positions(ir, x):
        x = b("float", "float", x)  # ranks as x.argsort().argsort(): exact as floats
    if not isinstance(x, Ref) or ir.dtypes[x] != "float32" or not ir.shapes[x]:
        return None
    shape = ir.shapes[x]
    dim = 0 if name == "msort" else a.get("dim")
    whole = dim is None  # median() and quantile() of every element
    if whole:
        x, dim = b("flatten", torch.flatten, x), 0
    dim = int(dim) % len(ir.shapes[x])
    length = ir.shapes[x][dim]
    indices = indices or name == "argsort"
    if name == "topk" and length > (MAX_ARGSORT_LINE if indices else MAX_SORT_LINE):
        return _selected(ir, b, x, dim, a, indices)
    if not 0 < length <= (MAX_ARGSORT_LINE if indices else MAX_SORT_LINE):
        return None
    descending = bool(a.get("descending", False) or (name == "topk" and a["largest"]))
    values = _sorted(ir, b, x, dim, descending, "sort_values", torch.sort)
    order = _sorted(ir, b, x, dim, descending, "sort_indices", torch.argsort) if indices else None
    if name in ("sort", "msort", "argsort"):
        return {"sort": (values, order), "msort": values, "argsort": order}[name]
    if name == "topk":
        k = int(a["k"])
        if not a["sorted"] or not 0 <= k <= length:
            return None
        first = [b("narrow", torch.narrow, t, dim, 0, k) if t else None for t in (values, order)]
        return tuple(first)
    keepdim = bool(a.get("keepdim", False))
    if name == "kthvalue":
        k = int(a["k"])
        if not 1 <= k <= length:
            return None
        picked = [_pick(b, t, dim, k - 1, keepdim) if t else None for t in (values, order)]
        return tuple(picked)
    if indices:
        return None  # median's index of a NaN line is PyTorch's own choice
    last = _pick(b, values, dim, length - 1, keepdim)  # NaN when the line has one
    nan = b("isnan", torch.isnan, last)
    if name == "median":
        middle = _pick(b, values, dim, (length - 1) // 2, keepdim)
        result = b("where", torch.where, nan, last, middle)
        return result if whole else (result, None)
    q = a["q"]
    if a["interpolation"] != "linear" or not isinstance(q, float | int) or not 0 <= q <= 1:
        return None
    rank = float(q) * (length - 1)
    below = int(rank)
    above = min(below + 1, length - 1)
    low = _pick(b, values, dim, below, keepdim)
    high = _pick(b, values, dim, above, keepdim)
    result = b("where", torch.where, nan, last, b("lerp", torch.lerp, low, high, rank - below))
    if whole and keepdim:
        return b("view", "view", result, *([1] * len(shape)))
    return result


def _selected(
    ir: ProgramIR, b: _Builder, x: Ref, dim: int, a: dict[str, Any], indices: bool
) -> tuple[Ref, Ref | None] | None:
    """``topk`` of lines too long to sort in a block: its values, or its positions and the
    values gathered at them (one selection where both are read)."""
    k, largest = int(a["k"]), bool(a["largest"])
    if not a["sorted"] or not 0 < k <= MAX_TOPK:
        return None
    if not indices:
        return b.element(0, "topk_values", torch.topk, x, k, dim, largest), None
    order = b.element(1, "topk_indices", torch.topk, x, k, dim, largest)
    return b("gather", torch.gather, x, dim, order), order


def _sorted(
    ir: ProgramIR, b: _Builder, x: Ref, dim: int, descending: bool, op: str, fn: Any
) -> Ref:
    """The sorted values (or positions) of ``x`` along ``dim``: one sort however many calls
    read it."""
    args = {"input": x, "dim": dim, "descending": descending}
    for node in ir.nodes:
        if node.op == op and node.args == args:
            return Ref("node", node.name)
    return b(op, fn, x, dim, descending)


def _pick(b: _Builder, values: Ref, dim: int, index: int, keepdim: bool) -> Ref:
    """The sorted line's element ``index``, its dim kept as 1 when ``keepdim``."""
    if keepdim:
        return b("narrow", torch.narrow, values, dim, index, 1)
    return b("select", torch.select, values, dim, index)
