"""A gather of a pointwise op's result taken from the op's operands instead.

A cross entropy written out, ``(logits - lse[:, None]).gather(-1, target)``, made the
subtraction a kernel of its own: it wrote the whole (rows, classes) tensor so that the gather
could read one value of each row. ``(a - b).gather(d, i) == a.gather(d, i) - b`` where ``b``
holds one value along ``d`` (the row's log-sum-exp). The gather then reads ``a`` where it lies,
and the op's other readers (a mean over the row, label smoothing's term) compute it as they
load. Each element is the same op on the same two numbers, so the result is exact.

Taken for pointwise ops whose tensor operands each either have the op's shape (gathered too) or
one value along the gathered dim that broadcasts to the gather's shape, through a chain of them
(``-(a - b)``) or one, where the scheduler's estimate of the device time falls.
"""

from __future__ import annotations

from stitch_graph.codegen._capture_base import _copy_of, _describe, _read_instead, _rewire
from stitch_graph.codegen._capture_estimate import adopt, device_us, trial_copy
from stitch_graph.codegen._capture_passes import _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import INDEXED, POINTWISE, lookup


def gather_operands_first(ir: ProgramIR) -> None:
    """Move each gather of a pointwise op's result onto the op's operands, through the whole
    chain of such ops or one op only, where the scheduler's estimate of the device time falls
    (a gathered operand that a kernel computes anyway may then be stored for the gather)."""
    for name in [n.name for n in ir.nodes if n.op == "gather"]:
        best, best_us = None, device_us(ir)
        for whole in (True, False):
            trial = trial_copy(ir)
            moved = _push(trial, name, whole)
            if not moved:
                break
            _eliminate_dead(trial)
            if (us := device_us(trial)) < best_us:
                best, best_us = trial, us
            if moved == 1:
                break  # the chain was one op: moving it alone is the same program
        if best is not None:
            adopt(ir, best)


def _push(ir: ProgramIR, name: str, whole: bool) -> int:
    """Move gather ``name`` onto its source's operands and, ``whole``, the gathers that makes
    onto theirs; how many gathers moved."""
    pending, moved = [name], 0
    while pending:
        made = _move(ir, ir.node(pending.pop()))
        if made is None:
            continue
        moved += 1
        if whole:
            pending.extend(made)
    return moved


def _move(ir: ProgramIR, gather: OpNode) -> list[str] | None:
    """Replace ``gather`` by gathers of its source's full operands and the source's op on
    them: the new gathers' names, or ``None`` (nothing changed) where the source is not such
    an op."""
    source, index, dim = gather.args.get("input"), gather.args.get("index"), gather.args.get("dim")
    if not isinstance(source, Ref) or source.kind != "node" or not isinstance(index, Ref):
        return None
    op = ir.node(source.name)
    info = lookup(op.op)
    if (
        info is None
        or info.kind != POINTWISE
        or op.op in INDEXED
        or op.attrs.get("bshape")
        or info.template(op.args) is None
        or op.dtype != "float32"
        or not isinstance(dim, int)
    ):
        return None
    shape, out = tuple(op.shape), tuple(gather.shape)
    dim %= len(shape)
    full = []
    for ref in op.tensor_refs():
        aligned = (1,) * (len(shape) - len(ir.shapes[ref])) + tuple(ir.shapes[ref])
        if aligned == shape and len(ir.shapes[ref]) == len(shape):
            full.append(ref)
        elif aligned[dim] != 1 or any(
            s not in (1, out[d]) for d, s in enumerate(aligned) if d != dim
        ):
            return None
    if not full:
        return None
    at = ir.nodes.index(gather)
    swap: dict[Ref, Ref] = {}
    for k, ref in enumerate(full):
        picked = _copy_of(ir, gather, f"{gather.name}__of{k}_{op.name}")
        _rewire(picked, {source: ref})
        picked.dtype = ir.dtypes[ref]
        _describe(ir, Ref("node", picked.name), out, ir.dtypes[ref])
        swap[ref] = Ref("node", picked.name)
        ir.nodes.insert(at, picked)
        at += 1
    applied = _copy_of(ir, op, f"{op.name}__at_{gather.name}")
    applied.shape = out
    _rewire(applied, swap)
    _describe(ir, Ref("node", applied.name), out, op.dtype)
    ir.nodes.insert(at, applied)
    _read_instead(ir, {Ref("node", gather.name): Ref("node", applied.name)})
    ir.nodes.remove(gather)
    return [swap[ref].name for ref in full]
