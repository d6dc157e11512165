"""Which scatters are generated, and which of their operands' producers their kernels compute.

Held apart from the scheduler's other rules: a scatter's two kernels (the input copied, then a
thread per source element) read their operands in their own ways.
"""

from __future__ import annotations

from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref

__all__ = ["scatter_operands", "scatter_unsupported"]

_SCATTER_REDUCE = ("sum", "amax", "amin")  # scatter_reduce's reductions that are generated


def scatter_operands(ir: ProgramIR, node: OpNode) -> list[Ref]:
    """A scatter's input, and its source where each source element is read at its own position
    (a fresh tensor of the index's shape, or ``index_add``'s source): the operands whose
    pointwise producers its kernels can compute."""
    x = node.args.get("input")
    refs = [x] if isinstance(x, Ref) and x.kind == "node" else []
    name = "source" if node.op == "index_add" else "src"
    src, index = node.args.get(name), node.args.get("index")
    if (
        isinstance(src, Ref) and src.kind == "node" and src != x and isinstance(index, Ref)
        and (name == "source" or tuple(ir.shapes[src]) == tuple(ir.shapes[index]))
        and ir.is_contiguous(src)
    ):
        refs.append(src)
    return refs


def scatter_unsupported(ir: ProgramIR, node: OpNode) -> str:
    """Why a scatter stays in PyTorch ("" when it is generated)."""
    a = node.args
    x, index = a.get("input"), a.get("index")
    dtypes = ("float32", "bool") if node.op == "scatter" else ("float32",)  # stores, or adds
    if not isinstance(x, Ref) or ir.dtypes.get(x) not in dtypes or node.dtype != ir.dtypes[x]:
        return f"needs a {' or '.join(dtypes)} input"
    if not isinstance(index, Ref) or ir.dtypes.get(index) not in ("int64", "int32"):
        return "needs an int64 or int32 index"
    if not isinstance(a.get("dim"), int):
        return "dim must be an int"
    shape, space = ir.shapes[x], ir.shapes[index]
    dim = a["dim"] % max(len(shape), 1)
    if node.op == "index_add":
        source = a.get("source")
        if not isinstance(source, Ref) or ir.dtypes.get(source) != "float32" or len(space) != 1:
            return "needs a float32 source and a 1-D index"
        expected = tuple(space[0] if d == dim else s for d, s in enumerate(shape))
        return "" if tuple(ir.shapes[source]) == expected else "source shape"
    src = a.get("src") if a.get("src") is not None else a.get("value")
    if node.op == "scatter" and a.get("reduce") is not None:
        return "a reduce argument"
    if node.op == "scatter_reduce" and (
        a.get("reduce") not in _SCATTER_REDUCE or not isinstance(src, Ref)
        or (a.get("include_self") is not True and node.dtype != "float32")
    ):
        return "reduce must be sum, amax or amin, with a tensor src (float32 without include_self)"
    if isinstance(src, Ref) and (
        ir.dtypes.get(src) != node.dtype
        or len(ir.shapes[src]) != len(space)
        or any(i > s for i, s in zip(space, ir.shapes[src], strict=True))
    ):
        return "src must have the input's dtype and at least the index's size"
    fits = len(space) == len(shape) and all(
        i <= s for d, (i, s) in enumerate(zip(space, shape, strict=True)) if d != dim
    )
    return "" if fits else "index shape"
