"""Pointwise values read through views, computed in the view's shape instead.

A mask built as ``arange(S) < lengths[:, None]`` and read as ``mask.unsqueeze(-1).float()``
has a view between two pointwise ops; the scheduler fuses a pointwise op only with the producer
of its operand itself, so the comparison and the conversion became two kernels, the first
storing a mask only the second read. A pointwise op commutes with re-indexing: ``view(f(a, b))
== f(view(a'), view(b'))``, where ``a'`` is ``a`` expanded to ``f``'s shape. So the view moves
onto the operands (host views, no kernel) and the op is computed in the view's shape, where its
reader fuses it like any producer. A chain of views (an unsqueeze, then an expand) moves whole.
Taken only where every reader of the op is a view and the views' strides exist (a reshape of an
expanded operand may not be a view).

The other way round, a pointwise op that reads a reshaped kernel result (a softmax over each
channel's flattened pixels, read back as images and scaled per channel) is computed in the
result's shape, its other operands viewed alike, and its own result reshaped after: it then
reads the kernel's output itself, and joins that kernel as an epilogue.

Both are kept only where the scheduler's estimate of the device time falls.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from stitch_graph.codegen._capture_base import _copy_of, _meta, _rewire
from stitch_graph.codegen._capture_estimate import adopt, device_us, trial_copy
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, contiguous_strides
from stitch_graph.codegen.ops import INDEXED, POINTWISE, lookup

_MOVED = frozenset(
    {
        "view", "flatten", "unflatten", "unsqueeze", "squeeze", "permute", "transpose", "t",
        "expand", "getitem", "narrow", "select",
    }
)  # one tensor in, one view out, no other tensor argument
_MOST_VIEWS = 4  # views of one value: each computes it again
_KEPT_WHOLE = frozenset({"setitem", "dropout_train"})


def compute_through_views(ir: ProgramIR) -> None:
    """Move views of pointwise values onto those values' operands, one view at a time, where
    the estimated device time falls; then pointwise ops that read a reshaped value are computed
    in the value's shape, their results reshaped."""
    _each_node_once_a_round(
        ir, lambda view, users, base: _movable(ir, view, users) and _move_pays(ir, view, base)
    )
    _each_node_once_a_round(ir, lambda node, _users, base: _reshape_after_pays(ir, node, base))


def _each_node_once_a_round(
    ir: ProgramIR, attempt: Callable[[OpNode, dict[str, list[str]], float], bool]
) -> None:
    """``attempt(node, users, base)`` on every node once a round, rounds until none changes
    the program; the users and the estimate are taken again after each change."""
    moved = True
    while moved:
        moved = False
        users, base, nodes = ir.users(), device_us(ir), _by_name(ir)
        for name in list(nodes):
            node = nodes.get(name)  # an adopted trial replaced the nodes: look each up again
            if node is not None and attempt(node, users, base):
                moved = True
                users, base, nodes = ir.users(), device_us(ir), _by_name(ir)


def _by_name(ir: ProgramIR) -> dict[str, OpNode]:
    return {n.name: n for n in ir.nodes}


def _movable(ir: ProgramIR, view: OpNode, users: dict[str, list[str]]) -> bool:
    """Whether ``view`` views a pointwise value that only views read."""
    src = view.args.get("input")
    if view.op not in _MOVED or not isinstance(src, Ref) or src.kind != "node":
        return False
    if view.tensor_refs() != [src] or ir.dtypes.get(Ref("node", view.name)) == "tuple":
        return False
    producer = ir.node(src.name)
    info = lookup(producer.op)
    if info is None or info.kind != POINTWISE or producer.op in INDEXED | _KEPT_WHOLE:
        return False
    if producer.attrs or not producer.tensor_refs():
        return False  # per-channel broadcast shapes, or a constant fill: kept as they are
    readers = users[producer.name]
    if not readers or len(readers) > _MOST_VIEWS or "output" in readers:
        return False
    return all(lookup(ir.node(r).op) is not None and ir.node(r).op in _MOVED for r in readers)


def _move_pays(ir: ProgramIR, view: OpNode, base: float) -> bool:
    """Move ``view`` onto its producer's operands in a trial copy, and then the views of the
    value it becomes, as far as they move (a chain pays only whole); adopt them if the
    estimate falls."""
    trial = trial_copy(ir)
    moved = _move(trial, trial.node(view.name))
    if moved is None:
        return False
    chain = moved
    while chain:  # the operands' new views, and the views of the moved value
        _eliminate_dead(trial)  # the value the view read, if nothing else reads it
        users = trial.users()
        name = chain.pop()
        if _movable(trial, trial.node(name), users):
            chain += _move(trial, trial.node(name)) or []  # else the chain stops at that view
    _eliminate_dead(trial)
    if device_us(trial) >= base:
        return False
    adopt(ir, trial)
    return True


def _move(ir: ProgramIR, view: OpNode) -> list[str] | None:
    """Replace ``view`` by its producer computed on views of the producer's operands; the
    views that may move next (those of the operands, then those of the value), or ``None``
    where the view does not move."""
    producer = ir.node(view.args["input"].name)
    shape = tuple(producer.shape)
    added: list[OpNode] = []
    swap: dict[Ref, Ref] = {}
    for k, operand in enumerate(producer.tensor_refs()):
        base = operand
        if tuple(ir.shapes[operand]) != shape:
            expand = _expanded(ir, f"{view.name}__x{k}", operand, list(shape))
            if expand is None:
                return None
            added.append(expand)
            base = Ref("node", expand.name)
        moved = _replayed(ir, view, f"{view.name}__v{k}", base)
        if moved is None:
            return None
        added.append(moved)
        swap[operand] = Ref("node", moved.name)
    out = Ref("node", view.name)
    viewed = tuple(ir.shapes[out])
    value = _copy_of(ir, producer, view.name)  # the view's name: its readers read the value
    _rewire(value, swap)
    value.shape = viewed
    ir.shapes[out], ir.strides[out] = viewed, contiguous_strides(viewed)
    at = ir.nodes.index(view)
    ir.nodes[at : at + 1] = [*added, value]
    later = [u for u in ir.users()[view.name] if u != "output"]
    return [n.name for n in added] + later


def _expanded(ir: ProgramIR, name: str, source: Ref, shape: list[int]) -> OpNode | None:
    """An ``expand`` of ``source`` to ``shape``, its layout recorded; ``None`` if none exists."""
    node = OpNode(
        name, "expand", {"input": source, "shape": shape}, tuple(shape), ir.dtypes[source],
        ".expand", [source, list(shape)], {},
    )
    meta = _meta(ir, source).expand(shape) if _expands(ir, source, shape) else None
    return _recorded(ir, node, meta)


def _expands(ir: ProgramIR, source: Ref, shape: list[int]) -> bool:
    have = list(ir.shapes[source])
    if len(have) > len(shape):
        return False
    return all(a in (1, b) for a, b in zip(have, shape[len(shape) - len(have) :], strict=True))


def _replayed(ir: ProgramIR, view: OpNode, name: str, source: Ref) -> OpNode | None:
    """A copy of ``view`` applied to ``source``, its layout found by running it on meta."""
    node = _copy_of(ir, view, name)
    swap = {view.args["input"]: source}
    _rewire(node, swap)
    try:
        meta = _apply(node, _meta(ir, source))
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None
    node.dtype = ir.dtypes[source]
    if not torch.is_tensor(meta) or meta._base is None:
        return None  # a reshape the expanded strides do not allow as a view copies
    if str(meta.dtype).removeprefix("torch.") != node.dtype:
        return None  # a view as another dtype
    return _recorded(ir, node, meta)


def _recorded(ir: ProgramIR, node: OpNode, meta: Any) -> OpNode | None:
    if not torch.is_tensor(meta):
        return None
    ref = Ref("node", node.name)
    node.shape = tuple(meta.shape)
    ir.shapes[ref], ir.strides[ref] = tuple(meta.shape), tuple(meta.stride())
    ir.dtypes[ref] = node.dtype
    return node


def _apply(node: OpNode, source: torch.Tensor) -> Any:
    """The view ``node`` of ``source``, spelled as the program spells it."""
    args = [source if isinstance(a, Ref) else a for a in node.call_args]
    if node.call.startswith("."):
        return getattr(args[0], node.call[1:])(*args[1:], **node.call_kwargs)
    if node.call == "operator.getitem":
        return operator.getitem(*args)
    if node.call.startswith("torch."):
        return getattr(torch, node.call.removeprefix("torch."))(*args, **node.call_kwargs)
    msg = f"no replay of {node.call}"
    raise ValueError(msg)


_RESHAPES = frozenset({"view", "flatten", "unflatten", "unsqueeze", "squeeze"})


def _reshaped_operand(ir: ProgramIR, node: OpNode) -> Ref | None:
    """The operand of pointwise ``node`` that reshapes a contiguous kernel result in the node's
    own shape (a softmax over flattened pixels, read back as an image), or ``None``."""
    info = lookup(node.op)
    if info is None or info.kind != POINTWISE or node.op in INDEXED | _KEPT_WHOLE or node.attrs:
        return None
    for ref in node.tensor_refs():
        if ref.kind != "node" or tuple(ir.shapes[ref]) != tuple(node.shape):
            continue
        view = ir.node(ref.name)
        src = view.args.get("input")
        if view.op not in _RESHAPES or not isinstance(src, Ref) or src.kind != "node":
            continue
        kind = lookup(ir.node(src.name).op)
        if view.tensor_refs() != [src] or (kind is not None and kind.kind == "view"):
            continue
        shape = tuple(ir.shapes[src])
        if ir.strides[src] == contiguous_strides(shape) and ir.strides[ref] == contiguous_strides(
            tuple(node.shape)
        ):
            return ref
    return None


def _reshape_after_pays(ir: ProgramIR, node: OpNode, base: float) -> bool:
    """Where ``node`` reads a reshaped kernel result, compute it in the shape of the value that
    operand views (its other operands viewed the same way), its result reshaped back, in a
    trial copy; adopt it if the estimate falls."""
    reshaped = _reshaped_operand(ir, node)
    if reshaped is None:
        return False
    trial = trial_copy(ir)
    if not _reshape_after(trial, trial.node(node.name), reshaped):
        return False
    _eliminate_dead(trial)  # the view, if nothing else reads it
    if device_us(trial) >= base:
        return False
    adopt(ir, trial)
    return True


def _reshape_after(ir: ProgramIR, node: OpNode, reshaped: Ref) -> bool:
    """Replace ``node`` by its copy computed in the shape ``reshaped`` views, and a view of
    that copy in ``node``'s shape, under ``node``'s name; ``False`` where an operand has no
    view in that shape."""
    source = ir.node(reshaped.name).args["input"]
    shape = tuple(ir.shapes[source])
    added: list[OpNode] = []
    swap: dict[Ref, Ref] = {reshaped: source}
    for k, operand in enumerate(node.tensor_refs()):
        if operand == reshaped:
            continue
        base = operand
        if tuple(ir.shapes[operand]) != tuple(node.shape):
            expand = _expanded(ir, f"{node.name}__x{k}", operand, list(node.shape))
            if expand is None:
                return False
            added.append(expand)
            base = Ref("node", expand.name)
        view = OpNode(
            f"{node.name}__r{k}", "view", {"input": base, "shape": list(shape)}, shape,
            ir.dtypes[base], ".view", [base, list(shape)], {},
        )
        try:
            meta = _meta(ir, base).view(shape)
        except RuntimeError:
            return False  # e.g. a per-channel weight, whose channels the flattening merges
        added.append(_recorded(ir, view, meta))
        swap[operand] = Ref("node", view.name)
    inner = _copy_of(ir, node, f"{node.name}__in")
    _rewire(inner, swap)
    inner.shape = shape
    inner_ref = Ref("node", inner.name)
    ir.shapes[inner_ref], ir.strides[inner_ref] = shape, contiguous_strides(shape)
    back = OpNode(
        node.name, "view", {"input": inner_ref, "shape": list(node.shape)}, tuple(node.shape),
        node.dtype, ".view", [inner_ref, list(node.shape)], {},
    )
    at = ir.nodes.index(node)
    ir.nodes[at : at + 1] = [*added, inner, back]
    return True
