"""Products that share a weight and read nothing any of them computes, run as one GEMM.

A recurrent network written as a Python loop (KernelBench L3 34) runs, each of its 256 steps,
``linear(cat([x[t], h]), W)`` and ``linear(h, W_out)``: GEMMs of 8 rows that read their weights
again every step, four launches a step. The part of ``W`` that multiplies ``x[t]`` needs no
earlier step: split off as ``W[:, :inputs]``, its 256 products are one GEMM of 2048 rows before
the loop (``_split_free_operands``). The output products read states that no output product
computes: one GEMM over the stacked states after the loop (``_batch_free_products``). The loop
keeps the product of the state, the addend and the activation.

The split adds each product's two partial sums in another order than the concatenated product
does: capture lists the rewrite among its reorderings (``exact_order`` leaves it out).
"""

from __future__ import annotations

import torch

from stitch_graph.codegen._capture_base import _read_instead, _replace_by_built
from stitch_graph.codegen._capture_builder import Metas, _Builder
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref

__all__ = ["batch_shared_products"]

_LEAST_BATCHED = 4  # products a batch replaces, at least: fewer are not worth a stacked copy


def batch_shared_products(ir: ProgramIR) -> None:
    """Split the free operand off products of concatenations, then batch every family of
    products (one weight, one bias, one input shape) whose inputs none of them computes."""
    try:
        if _split_free_operands(ir) | _batch_free_products(ir):
            _stacks_of_selects(ir)
    finally:  # nodes a failed build appended are read by nothing
        _eliminate_dead(ir)


def _ancestry(ir: ProgramIR) -> dict[str, int]:
    """Each node's ancestors (itself included) as bits of their program positions."""
    bits: dict[str, int] = {}
    for index, node in enumerate(ir.nodes):
        mask = 1 << index
        for ref in node.tensor_refs():
            if ref.kind == "node":
                mask |= bits[ref.name]
        bits[node.name] = mask
    return bits


def _families(ir: ProgramIR, key_of) -> dict[tuple, list[OpNode]]:  # type: ignore[no-untyped-def]
    """Float32 linear layers with a row-major weight, grouped by ``key_of(node)`` (``None``:
    left out)."""
    families: dict[tuple, list[OpNode]] = {}
    for node in ir.nodes:
        weight, bias = node.args.get("weight"), node.args.get("bias")
        if node.op != "linear" or node.dtype != "float32" or not isinstance(weight, Ref):
            continue
        if len(ir.shapes[weight]) != 2 or ir.strides[weight][1] != 1:
            continue
        if bias is not None and not isinstance(bias, Ref):
            continue
        key = key_of(node)
        if key is not None:
            families.setdefault(key, []).append(node)
    return families


def _bits_of(ref: object, bits: dict[str, int]) -> int:
    return bits[ref.name] if isinstance(ref, Ref) and ref.kind == "node" else 0


def _split_free_operands(ir: ProgramIR) -> bool:
    """``linear(cat([a, h], -1), W, b)`` as ``linear(a, W[:, :n], b) + linear(h, W[:, n:])``
    where, across every product of ``W``, the ``a`` operands read no product of ``W``."""
    users = ir.users()

    def key_of(node: OpNode) -> tuple | None:
        cat = node.args["input"]
        if not isinstance(cat, Ref) or cat.kind != "node":
            return None
        if any(u == "output" or ir.node(u).op != "linear" for u in users[cat.name]):
            return None  # read by products alone (a GRU's gates share one): split, it goes
        source = ir.node(cat.name)
        parts = source.args.get("tensors")
        rank = len(source.shape)
        if source.op != "cat" or not isinstance(parts, list) or len(parts) != 2:
            return None
        if source.args.get("dim", 0) % rank != rank - 1:
            return None
        if not all(isinstance(p, Ref) and ir.dtypes[p] == "float32" for p in parts):
            return None
        widths = tuple(ir.shapes[p][-1] for p in parts)
        weight, bias = node.args["weight"], node.args.get("bias")
        if weight.kind != "param" or (bias is not None and bias.kind != "param"):
            return None  # views of parameters go first in the program
        return (weight, bias, widths)

    changed = False
    for (weight, _bias, widths), members in _families(ir, key_of).items():
        bits = _ancestry(ir)
        family = 0
        for member in members:
            family |= 1 << ir.nodes.index(member)
        parts = [ir.node(m.args["input"].name).args["tensors"] for m in members]
        free = [all(not _bits_of(p[k], bits) & family for p in parts) for k in (0, 1)]
        if len(members) < _LEAST_BATCHED or all(free) or not any(free):
            continue
        at = free.index(True)
        if _ready_at(ir, [p[at] for p in parts]) >= ir.nodes.index(members[0]):
            continue  # their product could not go before the first step: no split
        before = len(ir.nodes)
        b = _Builder(ir, Metas(ir), f"{members[0].name}_weight")
        own = b("narrow", torch.narrow, weight, 1, 0 if at == 0 else widths[0], widths[at])
        rest = b("narrow", torch.narrow, weight, 1, widths[0] if at == 0 else 0, widths[1 - at])
        views = ir.nodes[before:]
        del ir.nodes[before:]
        ir.nodes[0:0] = views
        linear = torch.nn.functional.linear
        for member, (first, second) in zip(members, parts, strict=True):
            before = len(ir.nodes)
            b = _Builder(ir, Metas(ir), f"{member.name}_split")
            loose, bound = (first, second) if at == 0 else (second, first)
            value = b(
                "add",
                torch.add,
                b("linear", linear, bound, rest),
                b("linear", linear, loose, own, member.args.get("bias")),
            )
            _replace_by_built(ir, member, before, value)
        changed = True
    return changed


def _batch_free_products(ir: ProgramIR) -> bool:
    """Each family of products whose inputs read none of them, as one product of the stacked
    inputs placed after the last of their producers, each product a row of it."""
    changed = False
    families = _families(
        ir,
        lambda n: (n.args["weight"], n.args.get("bias"), ir.shapes[n.args["input"]])
        if isinstance(n.args["input"], Ref)
        else None,
    )
    for members in families.values():
        bits = _ancestry(ir)
        position = {n.name: i for i, n in enumerate(ir.nodes)}
        family = 0
        for member in members:
            family |= 1 << position[member.name]
        inputs = [m.args["input"] for m in members]
        if len(members) < _LEAST_BATCHED or any(_bits_of(x, bits) & family for x in inputs):
            continue
        users = ir.users()
        weight, bias = members[0].args["weight"], members[0].args.get("bias")
        last_input = max(_ready_at(ir, inputs), _ready_at(ir, [weight, bias]))
        readers = [position[u] for m in members for u in users[m.name] if u in position]
        if readers and min(readers) <= last_input:
            continue
        _batch(ir, members, last_input + 1)
        changed = True
    return changed


def _ready_at(ir: ProgramIR, refs: list[object]) -> int:
    """The position of the last node that computes ``refs`` (rows of one tensor: that
    tensor's), -1 where only inputs and parameters do."""
    tensors = [r for r in refs if isinstance(r, Ref)]
    rows = _rows_of(ir, tensors) if len(tensors) == len(refs) else None
    names = {r.name for r in ([rows[0]] if rows is not None else tensors) if r.kind == "node"}
    return max((i for i, n in enumerate(ir.nodes) if n.name in names), default=-1)


def _batch(ir: ProgramIR, members: list[OpNode], at: int) -> None:
    """``members`` replaced by rows of one product, its nodes placed at position ``at``."""
    before = len(ir.nodes)
    b = _Builder(ir, Metas(ir), f"{members[0].name}_batched")
    inputs: list[Ref] = [m.args["input"] for m in members]
    rows = _rows_of(ir, inputs)
    if rows is None:
        dim = _stacked_along(ir, members)
        rows = (b("stack", torch.stack, inputs, dim), dim)
    stacked, dim = rows
    product = b(
        "linear",
        torch.nn.functional.linear,
        stacked,
        members[0].args["weight"],
        members[0].args.get("bias"),
    )
    picks = [b("select", torch.select, product, dim, k) for k in range(len(members))]
    built = ir.nodes[before:]
    del ir.nodes[before:]
    ir.nodes[at:at] = built
    _read_instead(ir, {Ref("node", m.name): pick for m, pick in zip(members, picks, strict=True)})
    gone = {m.name for m in members}
    ir.nodes = [n for n in ir.nodes if n.name not in gone]


def _stacked_along(ir: ProgramIR, members: list[OpNode]) -> int:
    """The dim a stack of the members' results, in order and their one reader, takes them
    along (then the batched product is that stack, and the stack goes); else 0."""
    users = ir.users()
    readers = {r for m in members for r in users[m.name]}
    if len(readers) != 1 or any(len(users[m.name]) != 1 for m in members):
        return 0
    stack = ir.node(readers.pop()) if "output" not in readers else None
    names = [p.name for p in stack.args.get("tensors") or []] if stack is not None else []
    if stack is None or stack.op != "stack" or names != [m.name for m in members]:
        return 0
    dim = stack.args.get("dim", 0) % len(stack.shape)
    return dim if dim < len(stack.shape) - 1 else 0


def _rows_of(ir: ProgramIR, refs: list[Ref]) -> tuple[Ref, int] | None:
    """The tensor whose slices along one dim (not its last) ``refs`` are, in order and all of
    them (``x[0], x[1], ...``; ``x[:, 0], x[:, 1], ...``), and that dim."""
    sources, dims = set(), set()
    for k, ref in enumerate(refs):
        node = ir.node(ref.name) if ref.kind == "node" else None
        if node is None or node.op != "select" or node.args.get("index") != k:
            return None
        source, dim = node.args["input"], node.args.get("dim")
        if not isinstance(source, Ref) or not isinstance(dim, int):
            return None
        sources.add(source)
        dims.add(dim % len(ir.shapes[source]))
    if len(sources) != 1 or len(dims) != 1:
        return None
    source, dim = sources.pop(), dims.pop()
    shape = ir.shapes[source]
    if dim == len(shape) - 1 or shape[dim] != len(refs) or not ir.is_contiguous(source):
        return None
    return source, dim


def _stacks_of_selects(ir: ProgramIR) -> None:
    """``stack([y[0], y[1], ...])`` of every row of ``y`` in order is ``y`` (along any dim
    but the last)."""
    for node in list(ir.nodes):
        parts = node.args.get("tensors")
        if node.op != "stack" or not isinstance(parts, list):
            continue
        rows = _rows_of(ir, parts)
        if rows is None or rows[0].kind != "node" or ir.node(rows[0].name).op != "linear":
            continue
        if rows[1] != node.args.get("dim", 0) % len(node.shape):
            continue
        _read_instead(ir, {Ref("node", node.name): rows[0]})
