"""A scatter of one number into a constant tensor at one position of each line
(``torch.zeros_like(x).scatter_(1, labels[:, None], 1.0)``: a one-hot of the labels) as the
comparison it is: each element is the number where its coordinate along the line equals the
line's index, else the constant. Pointwise, so the loss that multiplies it in computes it on
load, where the scatter was a kernel of its own writing the whole tensor first."""

from __future__ import annotations

from numbers import Number

import torch

from stitch_graph.codegen._capture_base import _replace_by_built
from stitch_graph.codegen._capture_builder import Metas, _Builder
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref

_FILLS = {"zeros": 0.0, "ones": 1.0}
_MOST_POSITIONS = 1 << 16  # positions along the line: their coordinates are a baked constant


def scatters_as_comparisons(ir: ProgramIR) -> None:
    """Rewrite every such scatter; its constant is then read by nothing."""
    changed = False
    for node in [n for n in ir.nodes if n.op == "scatter"]:
        found = _one_per_line(ir, node)
        if found is None:
            continue
        fill, value, dim = found
        before = len(ir.nodes)
        b = _Builder(ir, Metas(ir), f"{node.name}_compared")
        shape = node.shape
        along = [1] * len(shape)
        along[dim] = shape[dim]
        positions = b.constant(torch.arange(shape[dim]).view(along))
        hit = b("eq", torch.eq, node.args["index"], positions)
        result = b("where", torch.where, hit, float(value), float(fill))
        _replace_by_built(ir, node, before, result)
        changed = True
    if changed:
        _eliminate_dead(ir)


def _one_per_line(ir: ProgramIR, node: OpNode) -> tuple[float, float, int] | None:
    """The constant, the number and the dim of a float32 scatter of one number into a filled
    tensor whose index holds one position per line; ``None`` for any other scatter."""
    base, index = node.args.get("input"), node.args.get("index")
    number = node.args.get("value") if node.args.get("src") is None else node.args.get("src")
    if node.args.get("reduce") is not None or node.dtype != "float32":
        return None
    if not isinstance(number, Number) or isinstance(number, bool):
        return None
    if not isinstance(base, Ref) or base.kind != "node" or not isinstance(index, Ref):
        return None
    filled = ir.node(base.name)
    fill = _FILLS.get(filled.op, filled.args.get("fill_value") if filled.op == "full" else None)
    if not isinstance(fill, Number) or isinstance(fill, bool) or ir.dtypes[base] != "float32":
        return None
    shape, held = tuple(node.shape), tuple(ir.shapes[index])
    dim = int(node.args["dim"]) % max(len(shape), 1)
    if ir.dtypes[index] != "int64" or len(held) != len(shape) or held[dim] != 1:
        return None
    if any(h != n for d, (h, n) in enumerate(zip(held, shape, strict=True)) if d != dim):
        return None  # an index shorter than the tensor leaves the other lines as they were
    if shape[dim] > _MOST_POSITIONS:
        return None
    return float(fill), float(number), dim
