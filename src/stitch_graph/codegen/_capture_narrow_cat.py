"""A slice of a concatenation taken from its operands.

``torch.diff(u, dim=-1, append=u[..., :1])`` is ``cat([u, u[..., :1]])`` read twice through
``narrow``: at offset 0 (that is ``u``) and at offset 1. Through the narrow, a kernel reads
the concatenation at other positions than its own, so the concatenation was copied into a
tensor of its own first (two of a periodic stencil's three kernels). A slice along the
concatenated dim is the operands' parts that it covers: one operand's slice (a view), or a
concatenation of those slices at the reader's own positions, which the reader computes on
load. Each element is the same number, read from where it lies.
"""

from __future__ import annotations

from stitch_graph.codegen._capture_base import _describe, _read_instead
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref


def narrows_from_operands(ir: ProgramIR) -> None:
    """Replace each ``narrow`` (or one-dim ``getitem`` slice) of a ``cat`` along its dim by
    the slices of the operands it covers."""
    cats = {n.name: n for n in ir.nodes if n.op == "cat"}
    for node in list(ir.nodes):
        src = node.args.get("input")
        if not isinstance(src, Ref) or src.name not in cats or src.kind != "node":
            continue
        cat = cats[src.name]
        dim = int(cat.args["dim"]) % len(cat.shape)
        span = _span(node, dim, cat.shape)
        if span is None:
            continue
        at = ir.nodes.index(node)
        parts = _covered(ir, cat, dim, *span, node.name)
        ir.nodes[at:at] = [p for p in parts if isinstance(p, OpNode)]
        refs = [Ref("node", p.name) if isinstance(p, OpNode) else p for p in parts]
        if len(refs) == 1:
            value = refs[0]
        else:
            joined = OpNode(
                name=f"{node.name}__cat",
                op="cat",
                args={"tensors": refs, "dim": dim},
                shape=node.shape,
                dtype=node.dtype,
                call="torch.cat",
                call_args=[refs, dim],
            )
            ir.nodes.insert(ir.nodes.index(node), joined)
            _describe(ir, Ref("node", joined.name), node.shape, node.dtype)
            value = Ref("node", joined.name)
        _read_instead(ir, {Ref("node", node.name): value})
    _eliminate_dead(ir)


def _span(node: OpNode, dim: int, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(start, length)`` of ``node``'s slice along ``dim`` of a tensor of ``shape``, where
    it slices that dim alone with step one; else ``None``."""
    if node.op == "narrow" and int(node.args["dim"]) % len(shape) == dim:
        return int(node.args["start"]) % shape[dim], int(node.args["length"])
    index = node.args.get("index")
    if node.op != "getitem" or not isinstance(index, tuple):
        return None
    if Ellipsis in index:  # full slices stand for the dims the ellipsis covers
        at = index.index(Ellipsis)
        fill = (slice(None),) * (len(shape) - len(index) + 1)
        index = (*index[:at], *fill, *index[at + 1 :])
    if len(index) > len(shape) or not all(isinstance(s, slice) for s in index):
        return None
    index = (*index, *(slice(None),) * (len(shape) - len(index)))
    if any(s != slice(None) for d, s in enumerate(index) if d != dim):
        return None
    start, stop, step = index[dim].indices(shape[dim])
    return (start, stop - start) if step == 1 and stop > start else None


def _covered(
    ir: ProgramIR, cat: OpNode, dim: int, start: int, length: int, name: str
) -> list[OpNode | Ref]:
    """The operands' slices that ``[start, start + length)`` of ``cat`` covers, in order: an
    operand covered whole as itself, part of one as a new ``narrow`` node."""
    parts: list[OpNode | Ref] = []
    offset = 0
    for k, ref in enumerate(cat.args["tensors"]):
        size = ir.shapes[ref][dim]
        lo, hi = max(start, offset), min(start + length, offset + size)
        if lo < hi:
            if lo == offset and hi == offset + size:
                parts.append(ref)
            else:
                shape = (*ir.shapes[ref][:dim], hi - lo, *ir.shapes[ref][dim + 1 :])
                part = OpNode(
                    name=f"{name}__part{k}",
                    op="narrow",
                    args={"input": ref, "dim": dim, "start": lo - offset, "length": hi - lo},
                    shape=shape,
                    dtype=ir.dtypes[ref],
                    call="torch.narrow",
                    call_args=[ref, dim, lo - offset, hi - lo],
                )
                ir.shapes[Ref("node", part.name)] = shape
                ir.strides[Ref("node", part.name)] = ir.strides[ref]
                ir.dtypes[Ref("node", part.name)] = ir.dtypes[ref]
                parts.append(part)
        offset += size
    return parts

