"""A sum of a broadcast product over a dim both operands span, computed as a matrix product.

``(a.unsqueeze(1) * b.unsqueeze(0)).sum(-1)`` is ``a @ b.T``: a cosine-similarity matrix
written with ``F.cosine_similarity`` on broadcast views, attention scores written as
``(q[:, :, None] * k[:, None]).sum(-1)``. Left as they are, the product of ``M x N x K``
elements is a reduction of ``M x N`` rows that reads each operand ``N`` or ``M`` times; as an
``einsum`` of the two operands it is one (batched) GEMM. Dims both operands span are batch
dims, dims one of them spans are its free dims, the summed dim is contracted. Taken where both
sides have at least ``_LEAST_FREE`` free elements and the sum at least ``_LEAST_SUMMED``; a
vector broadcast against a matrix (a weighted sum) stays a reduction.
"""

from __future__ import annotations

import math

import torch

from stitch_graph.codegen._capture_base import _replace_by_built
from stitch_graph.codegen._capture_builder import Metas, _Builder
from stitch_graph.codegen._capture_einsum import lower_einsum
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref

__all__ = ["sum_broadcast_products_as_matmuls"]

_LEAST_FREE = 8  # rows of each side: fewer is a matrix-vector product, a reduction's work
_LEAST_SUMMED = 16


def sum_broadcast_products_as_matmuls(ir: ProgramIR) -> None:
    """Rewrite each sum (or mean) over one dim of a broadcast product as an einsum."""
    changed = False
    for name in [n.name for n in ir.nodes if n.op in ("sum", "mean")]:
        total = ir.node(name)
        found = _contraction(ir, total)
        if found is not None:
            changed |= _rewrite(ir, total, *found)
    if changed:
        _eliminate_dead(ir)


def _padded(ir: ProgramIR, ref: Ref, rank: int) -> tuple[int, ...]:
    shape = tuple(ir.shapes[ref])
    return (1,) * (rank - len(shape)) + shape


def _contraction(ir: ProgramIR, total: OpNode) -> tuple[Ref, Ref, str, int] | None:
    """The product's operands, the einsum equation (each operand's dims and the dims the sum
    keeps, size-1 dims left out) and the summed length; ``None`` where ``total`` is not such a
    sum."""
    value, dim = total.args.get("input"), total.args.get("dim")
    dims = dim if isinstance(dim, list | tuple) else [dim]
    if not isinstance(value, Ref) or value.kind != "node" or total.args.get("dtype") is not None:
        return None
    product = ir.node(value.name)
    a, b = product.args.get("input"), product.args.get("other")
    if product.op != "mul" or not isinstance(a, Ref) or not isinstance(b, Ref):
        return None
    if {product.dtype, ir.dtypes.get(a), ir.dtypes.get(b)} != {"float32"}:
        return None
    shape = tuple(product.shape)
    if len(dims) != 1 or not isinstance(dims[0], int) or not shape:
        return None
    summed = dims[0] % len(shape)
    sa, sb = _padded(ir, a, len(shape)), _padded(ir, b, len(shape))
    if not sa[summed] == sb[summed] == shape[summed] >= _LEAST_SUMMED:
        return None
    free_a = math.prod(n for n, m in zip(sa, sb, strict=True) if m == 1)
    free_b = math.prod(m for n, m in zip(sa, sb, strict=True) if n == 1)
    if min(free_a, free_b) < _LEAST_FREE:
        return None
    letters = "abcdefghijklmnopqrstuvwxyz"[: len(shape)]
    kept = "".join(c for i, c in enumerate(letters) if i != summed and shape[i] > 1)
    la = "".join(c for c, n in zip(letters, sa, strict=True) if n > 1)
    lb = "".join(c for c, n in zip(letters, sb, strict=True) if n > 1)
    return a, b, f"{la},{lb}->{kept}", shape[summed]


def _rewrite(ir: ProgramIR, total: OpNode, a: Ref, b: Ref, equation: str, length: int) -> bool:
    """``total`` becomes the einsum of the operands (their size-1 dims dropped by a view),
    divided by the summed length for a mean, viewed to ``total``'s shape; False (nothing
    changed) where the einsum cannot be built."""
    before = len(ir.nodes)
    build = _Builder(ir, Metas(ir), f"{total.name}_contracted")

    def squeezed(ref: Ref) -> Ref:
        sizes = [n for n in ir.shapes[ref] if n > 1]
        if len(sizes) == len(ir.shapes[ref]):
            return ref
        return build("view", "reshape", ref, sizes)

    value = lower_einsum(ir, build, [equation, squeezed(a), squeezed(b)])
    if value is None:
        del ir.nodes[before:]
        return False
    if total.op == "mean":
        value = build("div", torch.div, value, length)
    if tuple(ir.shapes[value]) != tuple(total.shape):
        value = build("view", "reshape", value, list(total.shape))
    _replace_by_built(ir, total, before, value)
    return True

