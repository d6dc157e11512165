"""Attention as one kernel: ``softmax(f(q @ k.T)) @ v`` with the scores kept on chip.

Scheduled apart, attention is a batched GEMM writing the (..., Lq, Lk) scores, a row kernel
applying the scale, the mask and the softmax, and a second GEMM reading the probabilities back:
the scores cross memory four times, and for long sequences they are most of the traffic
(KernelBench L3 43: 1.1 GB of scores against 0.6 GB of q, k and v). Fused, a block keeps a tile
of queries, walks the keys in tiles and keeps a running row maximum and sum (the online
softmax). Without a softmax (``relu(q @ k.T) @ v``) the tiles are summed as they are.

The pattern is found on groups the scheduler built (``join_attention``) and again on a plan's
items (``attention_group``), so a Planner's own grouping is read the same way; ``split`` gives
back the three kernels the tuner times it against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from stitch_graph.codegen._emit_base import _SMS
from stitch_graph.codegen._fusion_passes import broadcasts, read_inside
from stitch_graph.codegen.ir import Group, ProgramIR, Ref, numel
from stitch_graph.codegen.ops import READS_ELSEWHERE, lookup

_PRODUCTS = ("matmul", "bmm")
# views that keep the element at offset 0 where it was: the viewed value's index is the offset
_WHOLE_VIEWS = ("view", "flatten", "unflatten", "unsqueeze", "squeeze", "permute", "transpose",
                "t", "expand", "expand_as", "view_as")
MAX_HEAD = 128  # the widest q/k and v rows a block holds in shared memory
# a chain may compute positions in integers (ALiBi's key - query, a relative bucket)
_CHAIN_DTYPES = ("float32", "bool", "int64", "int32")
_LONG_KEYS = 256  # keys whose walk by too few blocks leaves the GPU idle


@dataclass(frozen=True)
class Attention:
    """The nodes of one fused attention: ``scores`` (q @ k.T), the pointwise ``chain`` on
    them, the ``softmax`` over keys (``None``: the chain's value is summed as it is), the
    ``product`` with the values and the pointwise ``epilogue`` on its result. ``gate``: products
    of the probabilities with values that do not read them (a head's gate), applied to each
    tile's unnormalised probabilities, which the normalisation then divides as it divides
    the rest. ``operands``:
    for q, k or v (the products' operands, by node name of the value viewed) computed where
    the kernel loads them, the pointwise members that compute it (a scale, a rotary
    embedding)."""

    scores: str
    chain: list[str]
    softmax: str | None
    product: str
    epilogue: list[str]
    operands: dict[str, list[str]] = field(default_factory=dict)
    gate: list[str] = field(default_factory=list)

    def q(self, ir: ProgramIR) -> Ref:
        return ir.node(self.scores).args["input"]

    def k(self, ir: ProgramIR) -> Ref:
        """The keys, transposed: (..., head, keys)."""
        return ir.node(self.scores).args["other"]

    def v(self, ir: ProgramIR) -> Ref:
        return ir.node(self.product).args["other"]

    @property
    def members(self) -> list[str]:
        loads = [m for chain in self.operands.values() for m in chain]
        return [*loads, self.scores, *self.chain, *([self.softmax] if self.softmax else []),
                *self.gate, self.product, *self.epilogue]


def _product_ok(ir: ProgramIR, name: str) -> bool:
    node = ir.node(name)
    if node.op not in _PRODUCTS or node.dtype != "float32" or len(node.shape) < 2:
        return False
    a, b = node.args.get("input"), node.args.get("other")
    if not (isinstance(a, Ref) and isinstance(b, Ref)):
        return False
    sa, sb = ir.shapes[a], ir.shapes[b]
    batch = tuple(node.shape[:-2])
    return (
        len(sa) >= 2 and len(sb) >= 2
        and ir.dtypes.get(a) == ir.dtypes.get(b) == "float32"
        and broadcasts(tuple(sa[:-2]), batch) and broadcasts(tuple(sb[:-2]), batch)
    )


def find(ir: ProgramIR, members: list[str], users: dict[str, list[str]]) -> Attention | None:
    """The attention ``members`` compute, or ``None`` where they are not one: two products
    whose second reads the first's scores through pointwise ops and at most a softmax over
    the keys, each intermediate read only inside, q/k and v rows at most ``MAX_HEAD`` wide."""
    order = {n.name: i for i, n in enumerate(ir.nodes)}
    names = sorted(members, key=order.__getitem__)
    products = [m for m in names if ir.node(m).op in _PRODUCTS]
    if len(products) != 2 or not all(_product_ok(ir, p) for p in products):
        return None
    first, second = products
    s_node, o_node = ir.node(first), ir.node(second)
    shape = tuple(s_node.shape)
    q, kt, v = s_node.args["input"], s_node.args["other"], o_node.args["other"]
    head, lk = ir.shapes[q][-1], shape[-1]
    if (
        ir.shapes[kt][-2] != head
        or ir.shapes[v][-2] != lk
        or max(head, ir.shapes[v][-1]) > MAX_HEAD
        or tuple(o_node.shape[:-2]) != shape[:-2]
        or tuple(ir.shapes[o_node.args["input"]]) != shape
    ):
        return None
    inside = set(names)
    # v's own chain may come after the scores (a copy of v written just before its product):
    # it is an operand's, computed on load, not the scores' chain
    v_base, _ = whole_view_base(ir, v)
    v_side: set[str] = set()
    if v_base.kind == "node" and v_base.name in inside:
        v_side = read_inside(ir, [v_base.name], inside) | {v_base.name}
        if first in v_side:
            return None
    between = [m for m in names if order[first] < order[m] < order[second] and m not in v_side]
    after = [m for m in names if order[m] > order[second]]
    before = [m for m in names if order[m] < order[first] or (m in v_side and order[m] < order[second])]
    chained = _operand_chains(ir, before, [(q, first), (kt, first), (v, second)], users)
    if chained is None:
        return None
    operands, early = chained  # early: a mask or bias written before the scores
    softmaxes = [m for m in between if ir.node(m).op == "softmax"]
    if len(softmaxes) > 1:
        return None
    softmax = softmaxes[0] if softmaxes else None
    if softmax is not None:
        node = ir.node(softmax)
        dim = node.args.get("dim")
        if dim not in (-1, len(shape) - 1) or node.args.get("dtype") not in (None, torch.float32):
            return None
        if tuple(node.shape) != shape:
            return None
    gate = _gate(ir, softmax, between, second, users) if softmax else []
    if gate is None:
        return None
    chain = [*early, *(m for m in between if m != softmax and m not in gate)]
    output = after[-1] if after else second
    for m in [first, *chain, *gate, second, *after]:
        if m != output and any(u not in inside for u in users.get(m, [])):
            return None  # read elsewhere: it would have to be stored
    for m in [*chain, *gate, *after]:
        node = ir.node(m)
        info = lookup(node.op)
        if info is None or info.kind != "pointwise" or node.dtype not in _CHAIN_DTYPES:
            return None
        if node.op in READS_ELSEWHERE and any(
            r.kind == "node" and r.name in inside for r in node.tensor_refs()
        ):
            return None  # reads a value of the kernel at another element
        out = tuple(o_node.shape) if m in after else shape
        if not broadcasts(tuple(node.shape), out):
            return None
    for m in after:
        if any(r.kind == "node" and r.name in [first, *chain] for r in ir.node(m).tensor_refs()):
            return None  # the epilogue runs on the product's elements, not the scores'
    taken = ir.node(softmax).args.get("input") if softmax is not None else o_node.args["input"]
    if not isinstance(taken, Ref) or taken.kind != "node":
        return None
    if taken.name not in _reaching(ir, first, chain):
        return None  # the softmax (or the product) must take a value of the scores
    return Attention(first, chain, softmax, second, after, operands, gate)


def _gate(
    ir: ProgramIR, softmax: str, between: list[str], second: str, users: dict[str, list[str]]
) -> list[str] | None:
    """The members between the softmax and the product with the values, each a product (or
    a quotient) of the last with a value that reads neither it nor the scores; ``None`` where
    the probabilities reach the product otherwise."""
    gate: list[str] = []
    last = softmax
    while True:
        readers = users.get(last, [])
        if readers == [second]:
            if ir.node(second).args["input"] != Ref("node", last):
                return None
            return gate
        if len(readers) != 1 or readers[0] not in between:
            return None
        node = ir.node(readers[0])
        a, b = node.args.get("input"), node.args.get("other")
        if node.op not in ("mul", "div") or (node.op == "div" and a != Ref("node", last)):
            return None
        factor = b if a == Ref("node", last) else a
        if isinstance(factor, Ref) and _reads_scores(ir, factor, between):
            return None
        gate.append(node.name)
        last = node.name


def _reads_scores(ir: ProgramIR, ref: Ref, between: list[str]) -> bool:
    """Whether ``ref`` is the scores, the softmax, or a member between the products that is
    computed from them."""
    if ref.kind != "node":
        return False
    node = ir.node(ref.name)
    if node.op in (*_PRODUCTS, "softmax"):
        return True
    if ref.name not in between:
        return False
    return any(_reads_scores(ir, r, between) for r in node.tensor_refs())


def whole_view_base(ir: ProgramIR, ref: Ref) -> tuple[Ref, list[str]]:
    """The value ``ref`` views through views that keep offset 0, and those views' names."""
    views: list[str] = []
    while ref.kind == "node" and ir.node(ref.name).op in _WHOLE_VIEWS:
        views.append(ref.name)
        src = ir.node(ref.name).args.get("input")
        if not isinstance(src, Ref):
            break
        ref = src
    return ref, views


def _operand_chains(
    ir: ProgramIR,
    before: list[str],
    operands: list[tuple[Ref, str]],
    users: dict[str, list[str]],
) -> tuple[dict[str, list[str]], list[str]] | None:
    """The members computed before the scores: by the operand value each computes where the
    kernel loads it, and the rest (a mask or a bias the forward writes before ``q @ k.T``,
    computed with the scores' chain). ``None`` unless each operand's members are pointwise
    and feed it alone (the product paired with it reading it through its views), nothing
    outside reading them."""
    chains: dict[str, list[str]] = {}
    left = list(before)
    for ref, product in operands:
        base, views = whole_view_base(ir, ref)
        if base.kind != "node" or base.name not in left:
            continue
        path = [*reversed(views), product]
        if users.get(base.name) != path[:1]:
            return None
        if any(users.get(a) != [b] for a, b in zip(path, path[1:], strict=False)):
            return None
        chain = feeding(ir, left, base.name)
        left = [m for m in left if m not in chain]
        chains[base.name] = chain
    for m in left:  # the scores' chain computes them: pointwise, reading no operand's chain
        info = lookup(ir.node(m).op)
        if info is None or info.kind != "pointwise":
            return None
        computed = {c for chain in chains.values() for c in chain}
        if any(r.kind == "node" and r.name in computed for r in ir.node(m).tensor_refs()):
            return None
    for name, chain in chains.items():
        for m in chain:
            node = ir.node(m)
            info = lookup(node.op)
            if info is None or info.kind != "pointwise":
                return None
            if m == name and node.dtype != "float32":
                return None
            if m != name and any(u not in chain for u in users.get(m, [])):
                return None
    return chains, left


def feeding(ir: ProgramIR, members: list[str], name: str) -> list[str]:
    """The ``members`` that ``name`` is computed from, itself included, in order."""
    needed = read_inside(ir, [name], set(members)) | {name}
    return [m for m in members if m in needed]


def _reaching(ir: ProgramIR, first: str, chain: list[str]) -> set[str]:
    """The scores and the chain's members computed from them (not a mask alone)."""
    seen = {first}
    for m in chain:
        if any(r.kind == "node" and r.name in seen for r in ir.node(m).tensor_refs()):
            seen.add(m)
    return seen


def join_attention(
    ir: ProgramIR, groups: list[Group], group_of: dict[str, Group], users: dict[str, list[str]]
) -> None:
    """Merge each GEMM of probabilities and values with the softmax kernel and the score GEMM
    before it into one ``attention`` group, where ``find`` reads them as one."""
    for second in [g for g in groups if g.kind == "gemm" and not g.prologue]:
        node = ir.node(second.anchor or "")
        p = node.args.get("input")
        if node.op not in _PRODUCTS or not isinstance(p, Ref) or p.kind != "node":
            continue
        rows = group_of.get(p.name)
        parts = [rows] if rows is not None else []
        if rows is not None and rows.kind == "softmax" and rows.prologue:
            source = next(
                (group_of[r.name] for m in rows.prologue for r in ir.node(m).tensor_refs()
                 if r.kind == "node" and group_of.get(r.name) not in (None, rows)
                 and group_of[r.name].kind == "gemm"),
                None,
            )
            parts = [source, rows] if source is not None else []
        elif rows is not None and rows.kind == "softmax":
            src = ir.node(rows.anchor or "").args.get("input")
            g = group_of.get(src.name) if isinstance(src, Ref) else None
            parts = [g, rows] if g is not None and g.kind == "gemm" else []
        if not parts or any(g is None or g.before is not None or g.siblings for g in parts):
            continue
        if parts[0].kind != "gemm" or parts[0].prologue:
            continue
        members = [m for g in [*parts, second] for m in g.members]
        found = find(ir, members, users)
        if found is None or not _fills_gpu(ir, found):
            continue
        # a pointwise kernel writing q, k or v for these products alone: computed on load
        for ref in (found.q(ir), found.k(ir), found.v(ir)):
            base, _ = whole_view_base(ir, ref)
            g = group_of.get(base.name) if base.kind == "node" else None
            if g is None or g.anchor is not None or g.output != base.name or g in parts:
                continue
            wider = find(ir, [*g.members, *members], users)
            if wider is not None:
                found, members = wider, [*g.members, *members]
                parts.append(g)
        for g in parts:
            groups.remove(g)
        second.kind = "attention"
        second.prologue = _prologue(ir, found)
        for m in second.prologue:
            group_of[m] = second


def _fills_gpu(ir: ProgramIR, found: Attention) -> bool:
    """Whether the fused kernel keeps the GPU busy: blocks of 64 queries, one batch entry
    each, give every SM two, or the keys are too few for a block's walk over them to matter.
    A Perceiver's 128 latents over 1024 inputs (128 blocks) ran 4x slower fused (the whole
    block 1.375 ms, 0.340 ms with three kernels, H100): few queries over many keys stay three
    kernels."""
    shape = ir.node(found.scores).shape
    blocks = numel(shape[:-2]) * math.ceil(shape[-2] / 64)
    return blocks >= 2 * _SMS or shape[-1] < _LONG_KEYS


def attention_group(ir: ProgramIR, item: str, members: list[str]) -> Group | None:
    """The ``attention`` group a plan item's ops form, else ``None``."""
    found = find(ir, members, ir.users())
    if found is None:
        return None
    output = found.epilogue[-1] if found.epilogue else found.product
    prologue = _prologue(ir, found)
    return Group(item, "attention", found.product, prologue, list(found.epilogue), output)


def _prologue(ir: ProgramIR, found: Attention) -> list[str]:
    """An attention group's members before its product, in program order."""
    order = {n.name: i for i, n in enumerate(ir.nodes)}
    return sorted(found.members[: found.members.index(found.product)], key=order.__getitem__)


def split(ir: ProgramIR, g: Group) -> list[Group]:
    """The kernels an ``attention`` group replaced: a pointwise kernel for each operand it
    computed on load, the score GEMM, the row kernel with the chain on load (or the chain as
    the GEMM's epilogue) and the GEMM with the values."""
    found = find(ir, g.members, ir.users())
    if found is None:
        msg = f"{g.id}: not an attention"
        raise ValueError(msg)
    loads = [
        Group(f"{g.id}o{n}", "pointwise", None, [], list(chain), value)
        for n, (value, chain) in enumerate(found.operands.items())
    ]
    last = found.epilogue[-1] if found.epilogue else found.product
    second = Group(g.id, "gemm", found.product, [], list(found.epilogue), last)
    if found.softmax is None:
        end = found.chain[-1] if found.chain else found.scores
        return [*loads, Group(f"{g.id}a", "gemm", found.scores, [], list(found.chain), end), second]
    return [
        *loads,
        Group(f"{g.id}a", "gemm", found.scores, [], [], found.scores),
        Group(f"{g.id}b", "softmax", found.softmax, list(found.chain), list(found.gate),
              found.gate[-1] if found.gate else found.softmax),
        second,
    ]


def hiding_fill(ir: ProgramIR, found: Attention) -> str | None:
    """The ``masked_fill`` whose mask hides scores from the result, where one does: it fills
    with ``-inf`` and is the softmax's input, or (no softmax) it fills with 0 or ``-inf`` and
    only ReLUs follow it to the product. Its mask must not read the scores."""
    chain = found.chain
    if found.softmax is not None:
        taken = ir.node(found.softmax).args["input"].name
        node = ir.node(taken)
        value = node.args.get("value")
        if node.op != "masked_fill" or not isinstance(value, int | float) or value != -math.inf:
            return None
    else:
        taken = ir.node(found.product).args["input"].name
        while taken in chain and ir.node(taken).op == "relu":
            taken = ir.node(taken).args["input"].name
        node = ir.node(taken)
        relu_after = taken != ir.node(found.product).args["input"].name
        value = node.args.get("value", 1) if node.op == "masked_fill" else 1
        if node.op != "masked_fill" or not isinstance(value, int | float):
            return None
        if not (float(value) == 0.0 or (relu_after and float(value) == -math.inf)):
            return None
    mask = node.args.get("mask")
    if not isinstance(mask, Ref) or taken not in chain:
        return None
    if mask.kind == "node" and mask.name in chain:
        if set(feeding(ir, chain, mask.name)) & _reaching(ir, found.scores, chain):
            return None
    elif mask.kind == "node" and mask.name == found.scores:
        return None
    return taken


def runs_fused(ir: ProgramIR, g: Group, fused: bool | None) -> bool:
    """Whether the attention group ``g`` is emitted as one kernel under the tuning's
    ``fused_attention`` (``None``: where a mask lets it skip tiles)."""
    if fused is not None:
        return fused
    found = find(ir, g.members, ir.users())
    return found is not None and hiding_fill(ir, found) is not None
