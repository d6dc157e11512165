"""Elements of several tensors in turn along a dim, as one indexed op (``interleave``).

``torch.stack((-x2, x1), dim=-1).flatten(-2)`` (GPT-J's rotate_every_two) and
``repeat_interleave(sin, 2, dim=-1)`` (its sin and cos tables spread over pairs of features)
both place the operands' elements in turn along a dim. Captured as a stack or an expanded copy
read through a reshape, each was a kernel of its own writing a tensor the next kernel read
back: the scheduler fuses no producer that its reader sees through a reshape. As the indexed
op ``interleave`` the reader computes the element itself (operand ``c % k`` at ``c / k``),
and a one-op producer such as the negation is computed as it is read.
"""

from __future__ import annotations

from typing import Any

import torch

from stitch_graph.codegen._capture_base import _meta
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, contiguous_strides

__all__ = ["interleave", "interleave_stacks"]

_MERGING_VIEWS = frozenset({"flatten", "view", "reshape"})


def interleave(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The tensors' elements in turn along ``dim`` (its length times their count)."""
    return torch.stack(tensors, dim + 1).flatten(dim, dim + 1)


# the host program's spelling, where the op is left to PyTorch: no PyTorch function is this op
interleave.host_call = "(lambda ts, d: torch.stack(ts, d + 1).flatten(d, d + 1))"  # type: ignore[attr-defined]


def interleave_stacks(ir: ProgramIR) -> None:
    """Replace each stack whose one reader merges the stacked dim into the one before it by an
    ``interleave`` of the stack's operands, under the reader's name; then move an unsqueeze
    of an interleave onto its operands."""
    users = ir.users()
    changed = False
    for view in ir.nodes:
        stack = _stack_merged_by(ir, view, users)
        if stack is None:
            continue
        dim = int(stack.args["dim"]) % len(stack.shape) - 1
        _become_interleave(ir, view, list(stack.args["tensors"]), dim)
        changed = True
    for view in list(ir.nodes):
        changed = _absorb_unsqueeze(ir, view, users) or changed
    if changed:
        _eliminate_dead(ir)


def _absorb_unsqueeze(ir: ProgramIR, view: OpNode, users: dict[str, list[str]]) -> bool:
    """An ``unsqueeze`` that is the one reader of an ``interleave`` becomes the interleave of
    its operands unsqueezed (host views): ``repeat_interleave(sin, 2, -1).unsqueeze(2)`` is
    read broadcast over the heads, and the reader computes it at its own element."""
    source: Any = view.args.get("input")
    if view.op != "unsqueeze" or not isinstance(source, Ref) or source.kind != "node":
        return False
    inner = ir.node(source.name)
    if inner.op != "interleave" or users[inner.name] != [view.name]:
        return False
    if any(r.kind == "node" and r.name == inner.name for r in ir.outputs):
        return False
    at = int(view.args["dim"]) % len(view.shape)
    views: dict[Ref, Ref] = {}
    added: list[OpNode] = []
    for ref in dict.fromkeys(inner.args["tensors"]):
        if len(ir.shapes[ref]) != len(inner.shape):
            return False
        meta = _meta(ir, ref).unsqueeze(at)
        name = f"{view.name}__of_{len(added)}"
        added.append(
            OpNode(
                name,
                "unsqueeze",
                {"input": ref, "dim": at},
                tuple(meta.shape),
                ir.dtypes[ref],
                "torch.unsqueeze",
                [ref, at],
            )
        )
        views[ref] = Ref("node", name)
        ir.shapes[views[ref]], ir.strides[views[ref]] = tuple(meta.shape), tuple(meta.stride())
        ir.dtypes[views[ref]] = ir.dtypes[ref]
    dim = int(inner.args["dim"]) + (at <= int(inner.args["dim"]))
    _become_interleave(ir, view, [views[ref] for ref in inner.args["tensors"]], dim)
    position = ir.nodes.index(view)
    ir.nodes[position:position] = added
    return True


def _become_interleave(ir: ProgramIR, node: OpNode, tensors: list[Ref], dim: int) -> None:
    """Turn ``node`` (a view, keeping its name and readers) into ``interleave(tensors, dim)``,
    stored contiguous."""
    node.op, node.args = "interleave", {"tensors": tensors, "dim": dim}
    node.call, node.call_args, node.call_kwargs = interleave.host_call, [tensors, dim], {}  # type: ignore[attr-defined]
    ir.strides[Ref("node", node.name)] = contiguous_strides(node.shape)


def _stack_merged_by(ir: ProgramIR, view: OpNode, users: dict[str, list[str]]) -> OpNode | None:
    """The stack ``view`` reshapes into its operands in turn (the stacked dim merged into the
    one before it), where ``view`` is the stack's only reader."""
    source: Any = view.args.get("input")
    if view.op not in _MERGING_VIEWS or not isinstance(source, Ref) or source.kind != "node":
        return None
    stack = ir.node(source.name)
    tensors, dim = stack.args.get("tensors"), stack.args.get("dim", 0)
    if stack.op != "stack" or users[stack.name] != [view.name] or not isinstance(dim, int):
        return None
    if not isinstance(tensors, list | tuple) or not all(isinstance(t, Ref) for t in tensors):
        return None
    shape = stack.shape
    d = dim % len(shape)
    if d == 0 or any(r.kind == "node" and r.name == stack.name for r in ir.outputs):
        return None
    merged = (*shape[: d - 1], shape[d - 1] * shape[d], *shape[d + 1 :])
    return stack if tuple(view.shape) == merged else None
