"""Calls that are views of their input plus at most one copy: ``F.unfold`` (im2col), ``trace``,
``diag`` of a matrix, ``kron``, ``meshgrid``, ``cartesian_prod``, ``broadcast_tensors`` and
``renorm``.

``F.unfold`` is the padded input's sliding windows (``Tensor.unfold`` twice, the dilation a
step of the window's slice) permuted to ``(N, C*kh*kw, L)``: the reshape becomes one copy
kernel. The others are products of broadcast views, or a reduction and a scale.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen._capture_compose import _vector_norm
from stitch_graph.codegen.ir import ProgramIR, Ref

ARRANGE_SIGNATURES = {
    "unfold": "input, kernel_size, dilation=1, padding=0, stride=1",
    "trace": "input",
    "diag": "input, diagonal=0",
    "diag_embed": "input, offset=0, dim1=-2, dim2=-1",
    "kron": "input, other",
    "meshgrid": "indexing=None",  # and any number of 1-D tensors
    "cartesian_prod": "",
    "broadcast_tensors": "",  # any number of tensors (an export's losses broadcast this way)
    "renorm": "input, p, dim, maxnorm",
}
ARRANGE_METHODS = frozenset({"diag", "diag_embed", "trace"})  # also taken as tensor methods (x.diag())


def _pair(value: Any) -> tuple[int, int]:
    return (int(value[0]), int(value[1])) if isinstance(value, list | tuple) else (value, value)


def arrange(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any], tensors: list[Any]) -> Any:
    """The call's result as views and registry ops; ``None`` where the rule does not apply.

    ``tensors`` are the call's positional tensors (``meshgrid`` and ``cartesian_prod`` take any
    number of them)."""
    if name in ("meshgrid", "cartesian_prod"):
        if not tensors or any(
            not isinstance(t, Ref) or len(ir.shapes[t]) != 1 or ir.dtypes[t] != ir.dtypes[tensors[0]]
            for t in tensors
        ):
            return None  # views of any one dtype (integer coordinates too)
        if name == "meshgrid" and a.get("indexing") not in (None, "ij", "xy"):
            return None
        return _grids(ir, b, tensors, a.get("indexing") == "xy", name == "cartesian_prod")
    if name == "broadcast_tensors":
        if not tensors or not all(isinstance(t, Ref) for t in tensors):
            return None
        shape = list(torch.broadcast_shapes(*(ir.shapes[t] for t in tensors)))
        return tuple(t if list(ir.shapes[t]) == shape else b("expand", "expand", t, *shape)
                     for t in tensors)
    x = a["input"]
    if not isinstance(x, Ref):
        return None
    if name == "diag" and len(ir.shapes[x]) == 2 and isinstance(a.get("diagonal", 0), int):
        return b("diagonal", torch.diagonal, x, a.get("diagonal", 0))  # a view, of any dtype
    if ir.dtypes[x] != "float32":
        return None
    if name == "unfold":
        return _im2col(ir, b, x, a) if len(ir.shapes[x]) == 4 else None
    if name == "trace":
        if len(ir.shapes[x]) != 2:
            return None
        return b("sum", torch.sum, b("diagonal", torch.diagonal, x))
    if name == "diag":  # of a matrix: its diagonal, a view; of a vector, its diagonal matrix
        offset = a.get("diagonal", 0)
        if len(ir.shapes[x]) == 1 and offset == 0:
            return _diagonal_matrices(b, x, ir.shapes[x][0])
        if len(ir.shapes[x]) != 2 or not isinstance(offset, int):
            return None
        return b("diagonal", torch.diagonal, x, offset)
    if name == "diag_embed":
        nd = len(ir.shapes[x])
        offset = a["offset"]
        if not isinstance(offset, int) or (a["dim1"] % (nd + 1), a["dim2"] % (nd + 1)) != (
            nd - 1, nd,
        ):
            return None
        if offset == 0:
            return _diagonal_matrices(b, x, ir.shapes[x][-1])
        # off the diagonal: the vector padded by |offset|, along the rows above it (or the
        # columns below), kept where the column minus the row is the offset
        size = ir.shapes[x][-1] + abs(offset)
        padded = b("pad", torch.nn.functional.pad, x, [0, abs(offset)])
        along = b("unsqueeze", "unsqueeze", padded, -1 if offset > 0 else -2)
        on = diagonal_mask(b, size, size, offset)
        return b("where", torch.where, on, along, 0.0)
    if name == "kron":
        return _kron(ir, b, x, a["other"])
    if name == "renorm":
        return _renorm(ir, b, x, a)
    return None


def diagonal_mask(b: _Builder, rows: int, cols: int, offset: int = 0) -> Ref:
    """``eye(rows, cols)`` as bools, or its diagonal ``offset`` columns to the right: baked
    row and column numbers compared, a pointwise op where a baked matrix would be too large."""
    row = b("view", "view", b.constant(torch.arange(rows)), rows, 1)
    col = b("view", "view", b.constant(torch.arange(cols)), 1, cols)
    if offset:
        return b("eq", torch.eq, b("sub", torch.sub, col, row), offset)
    return b("eq", torch.eq, row, col)


def _diagonal_matrices(b: _Builder, x: Ref, n: int) -> Ref:
    """Each last-dim vector of ``x`` on the diagonal of an n x n matrix, zeros elsewhere."""
    return b("where", torch.where, diagonal_mask(b, n, n), b("unsqueeze", "unsqueeze", x, -1), 0.0)


def _im2col(ir: ProgramIR, b: _Builder, x: Ref, a: dict[str, Any]) -> Ref | None:
    """``F.unfold`` of an (N, C, H, W) input: (N, C*kh*kw, oh*ow), channel-major rows."""
    n, c, _h, _w = ir.shapes[x]
    (kh, kw), (dh, dw) = _pair(a["kernel_size"]), _pair(a["dilation"])
    (ph, pw), (sh, sw) = _pair(a["padding"]), _pair(a["stride"])
    padded = b("pad", torch.nn.functional.pad, x, [pw, pw, ph, ph]) if ph or pw else x
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    hp, wp = ir.shapes[padded][2:]
    if span_h > hp or span_w > wp:
        return None
    rows = _windows(ir, b, padded, 2, span_h, sh)  # (N, C, oh, Wp, span_h)
    windows = _windows(ir, b, rows, 3, span_w, sw)  # (N, C, oh, ow, span_h, span_w)
    if dh > 1 or dw > 1:
        every = (slice(None),) * 4 + (slice(None, None, dh), slice(None, None, dw))
        windows = b("getitem", operator.getitem, windows, every)
    oh, ow = ir.shapes[windows][2:4]
    ordered = b("permute", "permute", windows, 0, 1, 4, 5, 2, 3)  # (N, C, kh, kw, oh, ow)
    dense = b("copy", "contiguous", ordered)
    return b("view", "view", dense, n, c * kh * kw, oh * ow)


def _windows(ir: ProgramIR, b: _Builder, x: Ref, dim: int, size: int, step: int) -> Ref:
    """``x.unfold(dim, size, step)``, spelled ``as_strided`` in host code: a view, where the
    static checks read ``Tensor.unfold`` as computing in PyTorch."""
    ref = b("unfold", "unfold", x, dim, size, step)
    node = ir.node(ref.name)
    node.call = ".as_strided"
    node.call_args = [x, list(ir.shapes[ref]), list(ir.strides[ref])]
    node.call_kwargs = {}
    return ref


def _kron(ir: ProgramIR, b: _Builder, x: Ref, y: Any) -> Ref | None:
    """Every product ``x[i...] * y[k...]`` at index ``i * y.shape + k``, dim by dim."""
    if not isinstance(y, Ref) or ir.dtypes[y] != "float32":
        return None
    xs, ys = ir.shapes[x], ir.shapes[y]
    nd = max(len(xs), len(ys))
    xs, ys = (1,) * (nd - len(xs)) + tuple(xs), (1,) * (nd - len(ys)) + tuple(ys)
    # x as (x0, 1, x1, 1, ...) and y as (1, y0, 1, y1, ...): their product, reshaped
    xv = b("view", "view", x, *[s for d in xs for s in (d, 1)])
    yv = b("view", "view", y, *[s for d in ys for s in (1, d)])
    product = b("mul", torch.mul, xv, yv)
    return b("view", "view", product, *[p * q for p, q in zip(xs, ys, strict=True)])


def _grids(
    ir: ProgramIR, b: _Builder, tensors: list[Ref], xy: bool, pairs: bool
) -> tuple[Ref, ...] | Ref:
    """``meshgrid``'s broadcast views (the first two dims swapped for ``xy``), or
    ``cartesian_prod``'s rows: the ``ij`` grids stacked along a last dim and flattened."""
    sizes = [ir.shapes[t][0] for t in tensors]
    order = list(range(len(tensors)))
    if xy and len(tensors) > 1:
        order[0], order[1] = 1, 0
    shape = [sizes[k] for k in order]
    grids = []
    for k, t in enumerate(tensors):
        place = [1] * len(tensors)
        place[order.index(k)] = sizes[k]
        grids.append(b("expand", "expand", b("view", "view", t, *place), *shape))
    if not pairs:
        return tuple(grids)
    if len(tensors) == 1:
        return tensors[0]
    stacked = b("stack", torch.stack, grids, -1)
    return b("view", "view", stacked, -1, len(tensors))


def _renorm(ir: ProgramIR, b: _Builder, x: Ref, a: dict[str, Any]) -> Ref | None:
    """Each slice along ``dim`` scaled to p-norm ``maxnorm`` where its norm is larger:
    ``x * maxnorm / (norm + 1e-7)`` there, as PyTorch computes it."""
    p, maxnorm = a["p"], a["maxnorm"]
    if not isinstance(p, int | float) or not isinstance(maxnorm, int | float) or p <= 0:
        return None
    nd = len(ir.shapes[x])
    others = [d for d in range(nd) if d != int(a["dim"]) % nd]
    if not others:
        return None
    if float(p) == 2.0:
        norm = b("norm", torch.norm, x, 2, others, True)
    else:
        norm = _vector_norm(b, x, float(p), others, True)
    if norm is None:
        return None
    shrink = b("mul", torch.mul, b("reciprocal", torch.reciprocal, b("add", torch.add, norm, 1e-7)), float(maxnorm))  # noqa: E501
    factor = b("where", torch.where, b("gt", torch.gt, norm, float(maxnorm)), shrink, 1.0)
    return b("mul", torch.mul, x, factor)
