"""Which indexed ops (``ops.INDEXED``: concatenations, flips, pads, gathers, rolls, triangles,
searches) are generated, by their arguments.

Held apart from the scheduler's other rules: each reads its operands at positions of its own.
"""

from __future__ import annotations

from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref

__all__ = ["index_position", "indexed_ok", "own_position_operands"]


def index_position(ir: ProgramIR, node: OpNode) -> tuple[int, Ref] | None:
    """``(dim, index)`` of ``x[:, ..., i]`` with one integer tensor ``i`` after full slices."""
    items = node.args.get("indices")
    items = list(items) if isinstance(items, list | tuple) else [items]
    tensors = [k for k, v in enumerate(items) if isinstance(v, Ref)]
    if len(tensors) != 1:
        return None
    d = tensors[0]
    index = items[d]
    if any(v != slice(None) for v in items[:d] + items[d + 1 :]):
        return None
    if ir.dtypes.get(index) not in ("int64", "int32") or d >= len(ir.shapes[node.args["input"]]):
        return None
    return d, index


def own_position_operands(ir: ProgramIR, node: OpNode) -> list[Ref]:
    """The operands an indexed op reads at its own element's coordinates: a gather's index,
    the values a bucketize searches for, the index into a 1-D table (``k[idx]``). Their
    producers may compute them in the same kernel; the other operands are read elsewhere."""
    shape = tuple(node.shape)
    if node.op == "gather":
        found = node.args.get("index")
    elif node.op == "bucketize":
        found = node.args.get("input")
    elif node.op == "index" and (position := index_position(ir, node)) is not None:
        table = node.args["input"]
        found = position[1] if len(ir.shapes[table]) == 1 else None
    else:
        found = None
    return [found] if isinstance(found, Ref) and ir.shapes[found] == shape else []


def _index_ok(ir: ProgramIR, node: OpNode) -> tuple[str, str]:
    if not isinstance(node.args.get("input"), Ref) or index_position(ir, node) is None:
        return "unsupported", "unsupported: index (one int64 or int32 tensor index after full slices)"
    return "pointwise", ""


def indexed_ok(ir: ProgramIR, node: OpNode) -> tuple[str, str]:
    nd = max(len(node.shape), 1)
    if node.op in ("cat", "stack", "interleave"):
        tensors = node.args.get("tensors")
        if not isinstance(tensors, list | tuple) or not all(isinstance(t, Ref) for t in tensors):
            return "unsupported", f"unsupported: {node.op} of non-tensors"
        dim = node.args.get("dim", 0)
        if not isinstance(dim, int) or not tensors:
            return "unsupported", f"unsupported: {node.op} with dim={dim!r}"
        ranks = {len(ir.shapes[t]) for t in tensors}
        if ranks != {nd - (node.op == "stack")} or {ir.dtypes[t] for t in tensors} != {node.dtype}:
            return "unsupported", f"unsupported: {node.op} of mixed ranks or dtypes"
        return "pointwise", ""
    if node.op == "flip":
        dims = node.args.get("dims")
        dims = dims if isinstance(dims, list | tuple) else [dims]
        if not all(isinstance(d, int) for d in dims):
            return "unsupported", f"unsupported: flip with dims={dims!r}"
        return "pointwise", ""
    if node.op == "pad":
        pads = node.args.get("pad")
        src = node.args.get("input")
        ok = (
            isinstance(pads, list | tuple)
            and all(isinstance(v, int) for v in pads)
            and len(pads) % 2 == 0
            and len(pads) // 2 <= nd
            and isinstance(src, Ref)
            and len(ir.shapes[src]) == nd
            and isinstance(node.args.get("value") or 0.0, int | float)
        )
        mode = node.args.get("mode") or "constant"
        if ok and mode != "constant":  # PyTorch's own limits: pads at least 0, within the input
            sizes = list(ir.shapes[src])[::-1]
            ok = mode in ("reflect", "replicate", "circular") and all(
                0 <= v and (mode == "replicate" or v < sizes[i // 2] + (mode == "circular"))
                for i, v in enumerate(pads)
            )
        return ("pointwise", "") if ok else ("unsupported", f"unsupported: pad ({mode} mode)")
    if node.op == "index":
        return _index_ok(ir, node)
    if node.op == "roll":
        shifts, dims = node.args.get("shifts"), node.args.get("dims")
        shifts = list(shifts) if isinstance(shifts, list | tuple) else [shifts]
        if dims is None or dims == []:  # the flattened tensor rolled: read in its own order
            flat = len(shifts) == 1 and isinstance(shifts[0], int)
            if flat and ir.is_contiguous(node.args["input"]):
                return "pointwise", ""
            return "unsupported", "unsupported: roll (of the flattened tensor: a strided input)"
        dims = list(dims) if isinstance(dims, list | tuple) else [dims]
        if len(shifts) != len(dims) or not all(isinstance(v, int) for v in shifts + dims):
            return "unsupported", "unsupported: roll (needs int shifts and dims)"
        return "pointwise", ""
    if node.op == "gather":
        index, src = node.args.get("index"), node.args.get("input")
        if not isinstance(index, Ref) or not isinstance(src, Ref) or ir.dtypes[index] != "int64":
            return "unsupported", "unsupported: gather needs tensor input and int64 index"
        if len(ir.shapes[src]) != nd or not isinstance(node.args.get("dim"), int):
            return "unsupported", "unsupported: gather with these ranks or dim"
        return "pointwise", ""
    if node.op == "bucketize":  # the boundaries searched in memory: one row, or one a row
        edges = node.args.get("boundaries")
        ok = (
            isinstance(edges, Ref)
            and ir.shapes[edges][:-1] in ((), tuple(node.shape[:-1]))
            and len(ir.shapes[edges]) >= 1
            and not node.args["out_int32"]
        )
        return ("pointwise", "") if ok else ("unsupported", "unsupported: bucketize of this form")
    if len(node.shape) < 2 or not isinstance(node.args.get("diagonal", 0), int):
        return "unsupported", f"unsupported: {node.op} needs a matrix and an int diagonal"
    return "pointwise", ""
