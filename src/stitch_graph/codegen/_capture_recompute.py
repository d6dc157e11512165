"""Cheap pointwise values that several kernels read, computed by each of them instead of stored.

A cross entropy's mask of counted targets is read by the logsumexp's pass and by the count; a
hard-swish after a convolution reads its ReLU twice, and the ReLU became the convolution's
epilogue kernel. The scheduler keeps such a value in memory: one kernel writes it and each
reader reads it back. Where the value is a cheap op, or a short chain of them, of stored
tensors (a padding mask: positions compared with lengths, cast to float), each reader gets its
own copy of the chain, which the reader's kernel computes as it loads (a prologue or an
epilogue member), and the kernel that stored it goes.

The copies are kept only where the scheduler's estimate of the device time falls. A value
reached through views (a rotary embedding's repeated sin and cos rows) is not copied yet.
"""

from __future__ import annotations

from stitch_graph.codegen._capture_base import _copy_of, _rewire
from stitch_graph.codegen._capture_estimate import adopt, device_us, trial_copy
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import LOADS_THROUGH_PROLOGUE, POINTWISE, READS_ELSEWHERE, lookup

_CHEAP_FLOPS = 12.0  # per element: an exp, a divide, a lookup, a short search, not a GELU chain
_MOST_READERS = 4
_LONGEST_CHAIN = 6  # ops and views copied for one reader (a wrapped N-body displacement: 5)
_MOST_TRIALS = 24  # values weighed, a schedule and an estimate each
_WHOLE = frozenset({"cat", "stack", "setitem"})  # written in place or by slices: kept whole
_COMPUTES_ON_LOAD = frozenset({POINTWISE, *LOADS_THROUGH_PROLOGUE})


def recompute_cheap_producers(ir: ProgramIR) -> None:
    """Give each reader kernel its own copy of a cheap pointwise value of stored tensors, where
    that lowers the estimated device time: each value weighed alone (copies of one value may
    pay where another's do not), the first ``_MOST_TRIALS`` of them."""
    best = device_us(ir)
    trials = 0
    users = ir.users()
    for name in [n.name for n in ir.nodes]:
        readers = [u for u in users[name] if u != "output"]
        if trials >= _MOST_TRIALS or not 2 <= len(readers) <= _MOST_READERS:
            continue
        chain = _cheap_chain(ir, ir.node(name), users)
        if chain is None or not all(_computes_on_load(ir.node(r)) for r in readers):
            continue
        trial = trial_copy(ir)
        members = [trial.node(member.name) for member in chain]
        for k, reader in enumerate(readers[1:], start=1):
            _give_copy(trial, members, trial.node(reader), k)
        trials += 1
        time = device_us(trial)
        if time < best:
            adopt(ir, trial)
            best = time
            users = ir.users()  # the copies' readers read them now


def _cheap_chain(ir: ProgramIR, node: OpNode, users: dict[str, list[str]]) -> list[OpNode] | None:
    """``node`` and the pointwise ops (and views) it is computed from that nothing else reads,
    in program order, when together they cost a few FLOPs an element and read only stored
    tensors (a padding mask: a position compared with a length, then cast to float); else
    ``None``. Copying the chain copies no other work."""
    chain: dict[str, OpNode] = {}
    flops = 0.0
    pending = [node]
    while pending:
        member = pending.pop()
        if member.name in chain:
            continue  # read twice inside the chain (a displacement and its wrap)
        info = lookup(member.op)
        if info is None or member.op in _WHOLE:
            return None
        if info.kind == POINTWISE:
            flops += info.flops
        elif info.kind != "view":
            return None
        chain[member.name] = member
        if flops > _CHEAP_FLOPS or len(chain) > _LONGEST_CHAIN:
            return None
        if member.op in READS_ELSEWHERE:
            continue  # its operands stay in memory for every copy to read
        for ref in member.tensor_refs():
            if not _stored(ir, ref):
                pending.append(ir.node(ref.name))
    if any(u not in chain for m in chain.values() if m is not node for u in users[m.name]):
        return None  # read elsewhere too: it is computed there anyway
    order = {n.name: i for i, n in enumerate(ir.nodes)}
    return sorted(chain.values(), key=lambda n: order[n.name])


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


def _give_copy(ir: ProgramIR, chain: list[OpNode], reader: OpNode, k: int) -> None:
    """Copies of ``chain`` (its last node is the value) placed after it, read by ``reader`` in
    the value's place."""
    swap: dict[Ref, Ref] = {}
    at = ir.nodes.index(chain[-1]) + 1
    taken = {n.name for n in ir.nodes}
    for member in chain:
        n = k
        while f"{member.name}__again{n}" in taken:  # a copy of an earlier chain holds it
            n += 1
        copy = _copy_of(ir, member, f"{member.name}__again{n}")
        taken.add(copy.name)
        _rewire(copy, swap)
        swap[Ref("node", member.name)] = Ref("node", copy.name)
        ir.nodes.insert(at, copy)
        at += 1
    _rewire(reader, {Ref("node", chain[-1].name): swap[Ref("node", chain[-1].name)]})
