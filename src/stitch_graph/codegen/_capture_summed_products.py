"""A sum over a product's output features, computed as a product with the summed weights.

``linear(x, W, b).sum(-1)`` is ``x @ W.sum(0) + b.sum()``: the dot products of one input row
with every output feature's weights, added up, are one dot product with the features' summed
weights. The GEMM of ``(rows, in)`` by ``(in, out)`` becomes a reduction of the weight (read
once a call, so changed weights are seen) and a matrix-vector product: KernelBench L2 14 runs a
1024 x 8192 x 8192 GEMM only to add up each row of its result. A mean is the sum over the
feature count; multiplications and divisions by a number between the product and the sum
commute with it and follow the new product.
"""

from __future__ import annotations

from numbers import Number

import torch

from stitch_graph.codegen._capture_base import _replace_by_built
from stitch_graph.codegen._capture_builder import Metas, _Builder
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, numel

__all__ = ["sum_products_first"]

_SCALINGS = {"mul": torch.mul, "div": torch.div}


def sum_products_first(ir: ProgramIR) -> None:
    """Rewrite each sum (or mean) over the last dim of a product's result, through scalings by
    numbers that nothing else reads, as a product with the weight summed over its features."""
    changed = False
    for name in [n.name for n in ir.nodes if n.op in ("sum", "mean")]:
        found = _summed_product(ir, ir.node(name))
        if found is not None:
            _rewrite(ir, ir.node(name), *found)
            changed = True
    if changed:
        _eliminate_dead(ir)


def _number(node: OpNode) -> tuple[Ref, float] | None:
    """The tensor a scaling by a number reads, and the number (``x * c``, ``c * x``, ``x / c``)."""
    if node.op not in _SCALINGS or node.args.get("rounding_mode") is not None:
        return None
    a, b = node.args.get("input"), node.args.get("other")
    if isinstance(a, Ref) and isinstance(b, Number) and not isinstance(b, bool):
        return a, float(b)
    if (
        node.op == "mul"
        and isinstance(b, Ref)
        and isinstance(a, Number)
        and not isinstance(a, bool)
    ):
        return b, float(a)
    return None


def _summed_product(ir: ProgramIR, total: OpNode) -> tuple[OpNode, list[OpNode]] | None:
    """The product (``linear``, or ``matmul``/``mm`` by a matrix) whose features ``total`` adds
    up, and the scalings between them, each read by the next alone; ``None`` otherwise."""
    value = total.args.get("input")
    dim = total.args.get("dim")
    dims = dim if isinstance(dim, list | tuple) else [dim]
    if not isinstance(value, Ref) or value.kind != "node" or total.args.get("dtype") is not None:
        return None
    rank = len(ir.shapes[value])
    if rank < 2 or len(dims) != 1 or not isinstance(dims[0], int) or dims[0] % rank != rank - 1:
        return None
    users = ir.users()
    chain: list[OpNode] = []
    node, reader = ir.node(value.name), total.name
    while True:
        if users[node.name] != [reader] or node.dtype != "float32":
            return None
        scaled = _number(node)
        if scaled is None:
            break
        chain.insert(0, node)
        reader = node.name
        if scaled[0].kind != "node":
            return None
        node = ir.node(scaled[0].name)
    if node.op == "linear":
        weight = node.args.get("weight")
        ok = isinstance(weight, Ref) and len(ir.shapes[weight]) == 2
    elif node.op in ("matmul", "mm"):
        other = node.args.get("other")
        ok = isinstance(other, Ref) and len(ir.shapes[other]) == 2
    else:
        return None
    x = node.args.get("input")
    if not ok or not isinstance(x, Ref) or numel(ir.shapes[x]) // ir.shapes[x][-1] < 2:
        return None
    return node, chain


def _transposed(ir: ProgramIR, ref: Ref) -> Ref | None:
    """The matrix that ``ref`` views transposed (``W.T``, ``W.t()``, ``W.permute(1, 0)``)."""
    if ref.kind != "node":
        return None
    node = ir.node(ref.name)
    source = node.args.get("input")
    if not isinstance(source, Ref) or len(ir.shapes.get(source, ())) != 2:
        return None
    dims = (node.args.get("dim0"), node.args.get("dim1"))
    swaps = node.op == "t" or (
        node.op == "transpose"
        and all(isinstance(d, int) for d in dims)
        and dims[0] % 2 != dims[1] % 2
    )
    if swaps or (node.op == "permute" and list(node.args.get("shape") or []) == [1, 0]):
        return source
    return None


def _rewrite(ir: ProgramIR, total: OpNode, product: OpNode, chain: list[OpNode]) -> None:
    """``total`` becomes the input times the summed weight (plus the summed bias), scaled as
    the chain scaled the product; the product and the chain are then read by nothing."""
    before = len(ir.nodes)
    b = _Builder(ir, Metas(ir), f"{total.name}_summed")
    x: Ref = product.args["input"]
    if product.op == "linear":  # weight (out, in)
        weight = b("sum", torch.sum, product.args["weight"], [0])
    else:  # other (in, out): a weight (out, in) transposed is summed as it lies
        other: Ref = product.args["other"]
        base = _transposed(ir, other)
        weight = b("sum", torch.sum, *((base, [0]) if base else (other, [1])))
    value = b("matmul", torch.matmul, x, b("view", "view", weight, ir.shapes[x][-1], 1))
    bias = product.args.get("bias") if product.op == "linear" else None
    if isinstance(bias, Ref):
        value = b("add", torch.add, value, b("sum", torch.sum, bias, [0], True))
    if total.op == "mean":
        value = b("div", torch.div, value, product.shape[-1])
    for step in chain:
        _, number = _number(step)  # type: ignore[misc]
        value = b(step.op, _SCALINGS[step.op], value, number)
    if not total.args.get("keepdim"):
        value = b("view", "view", value, *total.shape)
    _replace_by_built(ir, total, before, value)
