"""Cheap pointwise values that several kernels read, computed by each of them instead of stored.

A cross entropy's mask of counted targets is read by the logsumexp's pass and by the count; a
hard-swish after a convolution reads its ReLU twice, and the ReLU became the convolution's
epilogue kernel. The scheduler keeps such a value in memory: one kernel writes it and each
reader reads it back. Where the value is one cheap op of stored tensors, each reader gets its
own copy of the op, which the reader's kernel computes as it loads (a prologue or an epilogue
member), and the kernel that stored it goes.

The copies are kept only where the scheduler's estimate of the device time falls. A value
reached through views (a rotary embedding's repeated sin and cos rows) is not copied yet.
"""

from __future__ import annotations

from stitch_graph.codegen._capture_base import _copy_of, _rewire
from stitch_graph.codegen._capture_estimate import adopt, device_us, trial_copy
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import LOADS_THROUGH_PROLOGUE, POINTWISE, lookup

_CHEAP_FLOPS = 8.0  # per element: an exp, a divide, a lookup, not a GELU chain
_MOST_READERS = 4
_WHOLE = frozenset({"cat", "stack", "setitem"})  # written in place or by slices: kept whole
_COMPUTES_ON_LOAD = frozenset({POINTWISE, *LOADS_THROUGH_PROLOGUE})


def recompute_cheap_producers(ir: ProgramIR) -> None:
    """Give each reader kernel its own copy of a cheap pointwise value of stored tensors, where
    that lowers the estimated device time."""
    users = ir.users()
    trial = trial_copy(ir)
    copies = 0
    for node in list(trial.nodes):
        readers = [u for u in users[node.name] if u != "output"]
        if not 2 <= len(readers) <= _MOST_READERS or not _cheap(trial, node):
            continue
        if not all(_computes_on_load(trial.node(r)) for r in readers):
            continue
        for k, reader in enumerate(readers[1:], start=1):
            _give_copy(trial, node, trial.node(reader), k)
            copies += 1
    if copies and device_us(trial) < device_us(ir):
        adopt(ir, trial)


def _cheap(ir: ProgramIR, node: OpNode) -> bool:
    """A pointwise op of a few FLOPs whose operands are stored anyway (inputs, parameters,
    results of other kinds of ops, views of them): copying it copies no chain of work."""
    info = lookup(node.op)
    if info is None or info.kind != POINTWISE or node.op in _WHOLE or info.flops > _CHEAP_FLOPS:
        return False
    return all(_stored(ir, ref) for ref in node.tensor_refs())


def _stored(ir: ProgramIR, ref: Ref) -> bool:
    """Whether ``ref`` (through views) is in memory whatever this pass does: not the result of
    a pointwise op, which a copy of its reader would then have to recompute too."""
    while ref.kind == "node":
        node = ir.node(ref.name)
        info = lookup(node.op)
        if info is None or info.kind != "view":
            return info is None or info.kind != POINTWISE
        source = node.args.get("input")
        if not isinstance(source, Ref):
            return True
        ref = source
    return True


def _computes_on_load(reader: OpNode) -> bool:
    """Whether the reader's kernel can compute a pointwise operand as it loads it."""
    info = lookup(reader.op)
    return info is not None and info.kind in _COMPUTES_ON_LOAD and reader.op not in _WHOLE


def _give_copy(ir: ProgramIR, node: OpNode, reader: OpNode, k: int) -> None:
    """A copy of ``node`` placed after it, read by ``reader`` in its place."""
    copy = _copy_of(ir, node, f"{node.name}__again{k}")
    _rewire(reader, {Ref("node", node.name): Ref("node", copy.name)})
    ir.nodes.insert(ir.nodes.index(node) + 1, copy)
