"""Passes over the lowered IR: drop the nodes nothing reads, then give the kernels that need
contiguous operands a copy of each strided view they read.

They run once the whole graph is lowered: the first needs every node's users, the second every
operand's final layout.
"""

from __future__ import annotations

from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, contiguous_strides, matrix_layout
from stitch_graph.codegen.ops import lookup


def _eliminate_dead(ir: ProgramIR) -> None:
    """Drop nodes nothing reads (e.g. the tuple-valued ``max`` once its getitems are lowered)."""
    while True:
        users = ir.users()
        dead = {n for n, u in users.items() if not u}
        if not dead:
            return
        ir.nodes = [n for n in ir.nodes if n.name not in dead]


_NEEDS_CONTIGUOUS = ("reduction", "norm", "softmax", "conv", "pool", "scan")
_RESHAPES = ("view", "flatten", "unflatten", "view_as")  # reshape is an alias of view


def _insert_copies(ir: ProgramIR) -> None:
    """Give anchors that read strided views a contiguous copy (a pointwise ``copy`` node)."""
    new_nodes: list[OpNode] = []
    for node in ir.nodes:
        info = lookup(node.op)
        keys: tuple[str, ...] = ()
        if info is not None and (info.kind in _NEEDS_CONTIGUOUS or node.op in _RESHAPES):
            keys = ("input",)
        elif info is not None and info.kind == "gemm":
            gemm_keys = {"addmm": ("mat1", "mat2"), "linear": ("input", "weight")}
            keys = gemm_keys.get(node.op, ("input", "other"))
        for key in keys:
            src = node.args.get(key)
            needs = isinstance(src, Ref) and src.kind == "node" and not ir.is_contiguous(src)
            if needs and info.kind == "gemm" and node.op != "linear":
                needs = matrix_layout(ir.shapes[src], ir.strides[src]) is None
            if needs:
                name = f"{node.name}_{key}"
                shape = ir.shapes[src]
                copy = OpNode(
                    name, "copy", {"input": src}, shape, ir.dtypes[src], ".contiguous", [src]
                )
                new_nodes.append(copy)
                ref = Ref("node", name)
                ir.shapes[ref] = shape
                ir.strides[ref] = contiguous_strides(shape)
                ir.dtypes[ref] = ir.dtypes[src]
                node.args = {**node.args, key: ref}
                node.call_args = [ref if a == src else a for a in node.call_args]
        new_nodes.append(node)
    ir.nodes = new_nodes
