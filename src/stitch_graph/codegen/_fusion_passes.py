"""Fusion decisions made once the greedy grouping has met every node.

Grouping (``schedule.schedule_program``) fuses a pointwise producer into its reader only when
it has one reader, and keeps the operands of indexed ops (``cat``, ``stack``, ``flip``) in
memory. Two cases pay to revisit: a one-op producer an indexed op can compute as it reads it
(rotate_half's ``cat((-x2, x1))``), and a producer whose several readers all ended up in one
kernel (a focal loss's sigmoid). ``read_through`` decides the first from the groups alone, so
the emitter and a plan's own grouping agree.
"""

from __future__ import annotations

from collections.abc import Callable

from stitch_graph.codegen._indexed_rules import own_position_operands
from stitch_graph.codegen.ir import Group, OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import (
    GENERATED_DTYPES,
    INDEXED,
    LOADS_THROUGH_PROLOGUE,
    READS_ELSEWHERE,
    lookup,
)

# indexed ops whose rule reads its operand with ``_read``
_READS_THROUGH = ("cat", "stack", "interleave", "flip", "roll", "pad")


def _through_parameters(
    ir: ProgramIR,
    producer: OpNode,
    reader: OpNode,
    users: dict[str, list[str]],
    *,
    chained: bool = False,
) -> tuple[str, ...] | None:
    """The parameters holding the tensor operands of ``producer`` where the indexed
    ``reader`` can compute it as it reads it, else ``None``: ``cat((-x2, x1))``
    (rotate_half) negates ``x2`` at the element it picks instead of reading a negated copy
    another kernel wrote, and ``stack([cx - l, cy - t, ...])`` subtracts at the element it
    picks. Each operand has the producer's rank, its dims the producer's or 1 (broadcast), so
    the element sits at the same coordinates in it. ``chained``: ``reader`` is itself computed
    as it is read (``c + w * 0.5``), so it may be pointwise."""
    if not (chained or reader.op in _READS_THROUGH) or users.get(producer.name) != [reader.name]:
        return None
    if reader.op == "roll" and reader.args.get("dims") in (None, []):
        return None  # the flattened tensor rolled: its offsets are the source's own
    info = lookup(producer.op)
    operands = producer.tensor_refs()
    shape = tuple(producer.shape)
    if (
        any(r.kind == "node" and r.name == producer.name for r in ir.outputs)
        or producer.op in INDEXED
        or info is None
        or info.kind != "pointwise"
        or info.template(producer.args) is None
        or not operands
        or producer.dtype != "float32"
    ):
        return None
    for ref in operands:
        rshape = ir.shapes[ref]
        if ir.dtypes.get(ref) != "float32" or len(rshape) != len(shape):
            return None
        if any(n not in (m, 1) for n, m in zip(rshape, shape, strict=True)):
            return None
    return tuple(k for k, v in producer.args.items() if isinstance(v, Ref))


def read_inside(
    ir: ProgramIR,
    start: list[str],
    inside: set[str],
    through: Callable[[OpNode], bool] | None = None,
) -> set[str]:
    """The members of ``inside`` that ``start`` reads, directly, through other members, or
    through the nodes ``through`` accepts (views, which run on the host in no kernel)."""
    found: set[str] = set()
    seen: set[str] = set()
    todo = list(start)
    while todo:
        for ref in ir.node(todo.pop()).tensor_refs():
            if ref.kind != "node" or ref.name in seen:
                continue
            seen.add(ref.name)
            if ref.name in inside:
                found.add(ref.name)
                todo.append(ref.name)
            elif through is not None and through(ir.node(ref.name)):
                todo.append(ref.name)
    return found


def broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts into ``to``."""
    if len(shape) > len(to):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(to), strict=False))


def computable_on_load(ir: ProgramIR, g: Group, group_of: dict[str, Group]) -> bool:
    """Whether every epilogue node of a library anchor can be computed on a consumer's load:
    it has the anchor's shape, or a smaller one broadcast into it that reads nothing another
    kernel writes (attention's causal mask, compared from a buffer)."""
    shape = ir.node(g.anchor or "").shape
    members = set(g.epilogue)
    for m in g.epilogue:
        node = ir.node(m)
        if node.shape == shape:
            continue
        if not broadcasts(tuple(node.shape), tuple(shape)):
            return False
        for ref in node.tensor_refs():
            if ref.kind == "node" and ref.name not in members and ref.name in group_of:
                return False
    return True


def stores_beside(g: Group, users: dict[str, list[str]]) -> bool:
    """Whether a member of ``g`` besides its output is read outside it: the pointwise kernel
    stores that result too (``joins_storing``), which another kind would not."""
    inside = set(g.members)
    return any(
        u not in inside for m in g.members if m != g.output for u in users.get(m, [])
    )


def joins_storing(
    ir: ProgramIR, g: Group, node: OpNode, users: dict[str, list[str]], order: dict[str, int]
) -> bool:
    """Whether the pointwise kernel ``g``, whose results others read too, joins the pointwise
    kernel of ``node``, which then stores them beside its own (an optimizer step's new moments,
    read again by its new parameter; a recurrent cell's state, read by the next step): the
    same elements, and every other reader of them after ``node`` (the joined kernel launches
    there) or the program's output."""
    out = Ref("node", g.output)
    if g.anchor is not None or g.kind != "pointwise" or not _reads_at_own_element(ir, node, out):
        return False
    if tuple(ir.shapes[out]) != tuple(node.shape) or ir.dtypes.get(out) not in GENERATED_DTYPES:
        return False
    inside = {*g.members, node.name}
    for member in g.members:
        for user in users[member]:
            if user == "output" or user in inside:
                continue
            later = order[user] > order[node.name]
            if not later or not _reads_at_own_element(ir, ir.node(user), Ref("node", member)):
                return False
    return True


def _reads_at_own_element(ir: ProgramIR, reader: OpNode, ref: Ref) -> bool:
    """Whether ``reader`` reads ``ref`` at its own element only: a kernel that joins it reads
    no element another thread of it stores."""
    return reader.op not in INDEXED or ref in own_position_operands(ir, reader)


def groups_read_through(
    ir: ProgramIR, node: OpNode, group_of: dict[str, Group], users: dict[str, list[str]]
) -> list[Group]:
    """The pointwise kernels the indexed ``node`` computes as it reads them; none for
    a ``cat`` of kernels' results alone, which they can store in place (``_cat_slices``)."""
    refs = node.tensor_refs()
    if node.op == "cat" and all(
        r.kind == "node" and r.name in group_of and group_of[r.name].output == r.name
        and users.get(r.name) == [node.name]
        for r in refs
    ):
        return []
    found: list[Group] = []
    for ref in refs:
        g = group_of.get(ref.name) if ref.kind == "node" else None
        if g is None or g in found or g.anchor is not None or g.output != ref.name:
            continue
        if set(_chain_through(ir, g.members, {node.name: node}, users)) == set(g.members):
            found.append(g)
    return found


def _chain_through(
    ir: ProgramIR, members: list[str], readers: dict[str, OpNode], users: dict[str, list[str]]
) -> dict[str, tuple[str, ...]]:
    """The ``members`` an indexed op among ``readers`` computes as it reads them, each with the
    parameters of its operands: one read only by such an op or by another such member, whose
    operands are in memory or such members themselves."""
    inside = set(members)
    found: dict[str, tuple[str, ...]] = {}
    changed = True
    while changed:  # from the indexed readers down the chain
        changed = False
        for name in members:
            reader = users.get(name, [])
            if name in found or len(reader) != 1:
                continue
            if reader[0] not in readers and reader[0] not in found:
                continue
            node = ir.node(name)
            params = _through_parameters(
                ir, node, ir.node(reader[0]), users, chained=reader[0] in found
            )
            if params:
                found[name] = params
                changed = True
    while True:  # a member whose operand is computed in the kernel, not here, is not one
        dropped = [
            name for name, params in found.items()
            if any(
                ir.node(name).args[p].kind == "node"
                and ir.node(name).args[p].name in inside - found.keys()
                for p in params
            )
            or (users[name][0] not in readers and users[name][0] not in found)
        ]
        if not dropped:
            return found
        for name in dropped:
            del found[name]


def read_through(ir: ProgramIR, groups: list[Group]) -> dict[str, tuple[str, ...]]:
    """Members each group's indexed ops compute as they read them (node -> the parameters of
    its operands, all in memory): decided from the groups alone, so a plan's own grouping
    agrees."""
    users = ir.users()
    through: dict[str, tuple[str, ...]] = {}
    for g in groups:
        indexed = {m: ir.node(m) for m in g.members if ir.node(m).op in _READS_THROUGH}
        if indexed:
            through.update(_chain_through(ir, g.members, indexed, users))
    return through


def _epilogue_takes(ir: ProgramIR, into: Group, shape: tuple[int, ...]) -> bool:
    """Whether ``into``'s epilogue computes values of ``shape`` at its own elements: a
    pointwise kernel's, or a reduction's per row (a loss's per-item terms beside the sum over
    their last dim, as an IoU beside a smooth-L1)."""
    if into.anchor is None:
        return True
    return into.kind == "reduction" and tuple(ir.node(into.anchor).shape) == tuple(shape)


def fold_shared_producers(
    ir: ProgramIR, groups: list[Group], group_of: dict[str, Group], users: dict[str, list[str]]
) -> None:
    """Move a pointwise kernel whose result several ops read into the one kernel they all ended
    up in, where they read it at their own elements: ``p = sigmoid(x)`` read by ``p * t`` and
    ``1 - p`` in a loss's reduction is then computed on load, not written and read back; read
    in a reduction's epilogue, it is computed there, per row.

    Grouping fuses a producer only into its single reader, as it meets them; this runs once
    every group is formed, when the readers' final kernel is known."""
    outputs = {r.name for r in ir.outputs if r.kind == "node"}
    through = read_through(ir, groups)  # they read their operand from memory: it stays there
    changed = True
    while changed:
        changed = False
        for g in list(groups):
            # a kernel that stores results beside its own (``joins_storing``) folds too when
            # every reader of them ended up in the one kernel: nothing is stored then
            inside = set(g.members)
            readers = [u for m in g.members for u in users.get(m, []) if u not in inside]
            beside = stores_beside(g, users)
            if g.anchor is not None or (len(readers) < 2 and not beside):
                continue
            if inside & outputs or "output" in readers:
                continue
            if any(r in through or ir.node(r).op in READS_ELSEWHERE for r in readers):
                continue  # a reader at other positions needs it in memory
            if any(r not in group_of for r in readers):
                continue
            into = group_of[readers[0]]
            shape = ir.node(g.output).shape
            if into is g or any(group_of[r] is not into for r in readers):
                continue
            if any(ir.node(r).shape != shape and not _reads_on_load(ir, into, r, g.output)
                   for r in readers):
                continue  # a reader at other positions (a broadcast) would recompute it
            if all(r in into.prologue or _reads_on_load(ir, into, r, g.output) for r in readers):
                into.prologue.extend(g.members)
            elif _epilogue_takes(ir, into, shape) and all(r in into.epilogue for r in readers):
                into.epilogue.extend(g.members)
            else:
                continue
            for m in g.members:
                group_of[m] = into
            groups.remove(g)
            changed = True


def _reads_on_load(ir: ProgramIR, into: Group, reader: str, value: str) -> bool:
    """Whether ``reader`` is an anchor of ``into`` whose input is ``value``, which its kernel
    then computes as it loads each element (a loss's sum of ``p * t``)."""
    node = ir.node(reader)
    source = node.args.get("input")
    return (
        reader in into.anchors
        and into.kind in LOADS_THROUGH_PROLOGUE
        and isinstance(source, Ref)
        and source.name == value
        and all(r.name != value for r in node.tensor_refs() if r is not source)
    )


def join_row_passes(
    ir: ProgramIR,
    groups: list[Group],
    group_of: dict[str, Group],
    users: dict[str, list[str]],
    fits: Callable[[ProgramIR, Group, Group], bool],
) -> None:
    """Reductions of the same rows that neither reads, directly or through others, taken in
    one pass where the later one launches (a loss's row sums of ``p * t`` and ``p * log p``
    over the same logits): the earlier result is stored beside, so every reader of it must run
    after that launch. ``fits`` is the scheduler's test of sibling reductions."""
    order = {n.name: i for i, n in enumerate(ir.nodes)}

    def join(a: Group, b: Group) -> Callable[[], None] | None:
        if not fits(ir, a, b) or not _per_row(ir, a) or not _per_row(ir, b):
            return None

        def apply() -> None:
            anchors = sorted([*a.anchors, *b.anchors], key=order.__getitem__)
            b.anchor, b.siblings = anchors[0], anchors[1:]
            b.prologue = [*a.prologue, *b.prologue]
            b.epilogue = [*a.epilogue, *b.epilogue]

        return apply

    def readers(a: Group) -> set[str]:
        return {u for m in a.members for u in users.get(m, [])}

    join_reduction_pairs(ir, groups, group_of, join, readers)


def join_reduction_pairs(
    ir: ProgramIR,
    groups: list[Group],
    group_of: dict[str, Group],
    join: Callable[[Group, Group], Callable[[], None] | None],
    readers: Callable[[Group], set[str]],
) -> None:
    """Join reduction groups pairwise, the later ``b`` taking the earlier ``a``, until no pair
    joins. ``join(a, b)`` gives the change that joins them, or ``None`` where they do not fit;
    a pair whose earlier group has a reader outside both (``readers``) that runs before the
    later one's launch stays apart, since the joined kernel launches where ``b`` did."""
    order = {n.name: i for i, n in enumerate(ir.nodes)}

    def launch(name: str) -> int:  # where a node's kernel or host line runs
        g = group_of.get(name)
        return order[g.output] if g is not None else order.get(name, len(order))

    changed = True
    while changed:
        changed = False
        rows = sorted((g for g in groups if g.kind == "reduction"), key=lambda g: order[g.output])
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                apply = join(a, b)
                if apply is None:
                    continue
                inside, later = {*a.members, *b.members}, order[b.output]
                if any(u != "output" and u not in inside and launch(u) <= later
                       for u in readers(a)):
                    continue  # a reader of the earlier result runs before the joined kernel
                apply()
                for m in b.members:
                    group_of[m] = b
                groups.remove(a)
                changed = True
                break
            if changed:
                break


def _per_row(ir: ProgramIR, g: Group) -> bool:
    """Whether the reduction's results are one value a row (no epilogue broadcast back)."""
    shape = tuple(ir.node(g.anchor or g.output).shape)
    return all(tuple(ir.node(m).shape) == shape for m in [*g.epilogue, g.output])
