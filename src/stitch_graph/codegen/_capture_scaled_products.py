"""A matrix product scaled by a number, scaled through one of its operands instead.

Attention scores returned as ``q @ k.transpose(-2, -1) * scale`` made cuBLAS write the product
and a kernel of its own read it back to scale it: a pass over the largest tensor of the
program. ``(a @ b) * s == (a * s) @ b``, and where ``a`` is written by a pointwise kernel (the
rotated queries) the factor costs that kernel one multiply. Rounding moves by an ulp of the
operand, far inside the 1e-4 the outputs are judged at.

Taken for ``matmul`` and a ``linear`` without bias, read only by the scaling (directly or
through views, as an einsum's batched product is), and only where the scheduler's estimate of
the device time falls (a product whose scaling a softmax computes as it loads stays as it is).
An operand that is a view is scaled before its views, where a kernel writes it.
"""

from __future__ import annotations

from stitch_graph.codegen._capture_base import _describe, _rewire, _with_operands
from stitch_graph.codegen._capture_estimate import adopt, device_us, trial_copy
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import lookup

_PRODUCTS = {"matmul": ("input", "other"), "linear": ("input", "weight")}


def scale_operands_of_products(ir: ProgramIR) -> None:
    """Move each number that scales a matrix product onto the operand where it costs least."""
    for name in [n.name for n in ir.nodes]:
        node = next((n for n in ir.nodes if n.name == name), None)  # the IR adopted so far
        found = _scaled_product(ir, node) if node is not None else None
        if found is None:
            continue
        product, factor = found
        best, best_us = None, device_us(ir)
        for slot in _PRODUCTS[product.op]:
            trial = trial_copy(ir)
            _move_factor(trial, trial.node(node.name), trial.node(product.name), slot, factor)
            if (us := device_us(trial)) < best_us:
                best, best_us = trial, us
        if best is not None:
            adopt(ir, best)


def _scaled_product(ir: ProgramIR, node: OpNode) -> tuple[OpNode, float] | None:
    """``(product, factor)`` where ``node`` multiplies (or divides) a float32 matrix product
    read by nothing else by a number; ``None`` otherwise."""
    if node.op not in ("mul", "div") or node.dtype != "float32" or node.args.get("rounding_mode"):
        return None
    x, other = node.args.get("input"), node.args.get("other")
    if node.op == "mul" and isinstance(other, Ref) and not isinstance(x, Ref):
        x, other = other, x
    if not isinstance(x, Ref) or x.kind != "node" or isinstance(other, Ref | bool):
        return None
    if not isinstance(other, int | float) or (node.op == "div" and other == 0):
        return None
    users = ir.users()
    # an einsum's product reaches its scaling through views
    value, reader = _before_views(ir, x, node.name, users)
    if value.kind != "node":
        return None
    product = ir.node(value.name)
    if product.op not in _PRODUCTS or isinstance(product.args.get("bias"), Ref):
        return None
    if len({product.args[slot] for slot in _PRODUCTS[product.op]}) < 2:
        return None  # x @ x: scaling the one operand would scale both factors
    if users[product.name] != [reader]:
        return None  # read again (or returned) unscaled
    return product, float(other) if node.op == "mul" else 1.0 / float(other)


def _before_views(
    ir: ProgramIR, ref: Ref, reader: str, users: dict[str, list[str]]
) -> tuple[Ref, str]:
    """The value that ``ref`` views, through views each read only by the next (``reader``
    reads the last), and the node that reads that value."""
    while ref.kind == "node" and _is_view(view := ir.node(ref.name)):
        source = view.args.get("input")
        if users[view.name] != [reader] or not isinstance(source, Ref):
            break
        if ir.dtypes.get(source) == "tuple":
            break  # a split's pieces: the tuple itself is no tensor to scale
        ref, reader = source, view.name
    return ref, reader


def _is_view(node: OpNode) -> bool:
    info = lookup(node.op)
    return info is not None and info.kind == "view"


def _move_factor(ir: ProgramIR, node: OpNode, product: OpNode, slot: str, factor: float) -> None:
    """Scale ``product``'s operand ``slot`` by ``factor``; the scaling's readers read what it
    scaled (the product, or a view of it) instead."""
    # scaled before the operand's views: where a kernel writes it
    operand, reader_name = _before_views(ir, product.args[slot], product.name, ir.users())
    reader = ir.node(reader_name)
    scaled = OpNode(
        f"{node.name}__of_{slot}", "mul", {"input": operand, "other": factor},
        tuple(ir.shapes[operand]), ir.dtypes[operand], "operator.mul", [operand, factor], {},
    )
    ref = Ref("node", scaled.name)
    _describe(ir, ref, scaled.shape, scaled.dtype)
    _rewire(reader, {operand: ref})
    ir.nodes.insert(ir.nodes.index(reader), scaled)
    ir.nodes.remove(node)
    scaled_value = next(a for a in (node.args["input"], node.args["other"]) if isinstance(a, Ref))
    swap = {Ref("node", node.name): scaled_value}
    for other in ir.nodes:
        _rewire(other, swap)
    ir.outputs = _with_operands(ir.outputs, swap)
