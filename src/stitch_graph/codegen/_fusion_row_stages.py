"""Row reductions that read an earlier reduction of the same rows, taken in one kernel.

``mean(x - logsumexp(x))`` (label smoothing written by hand), a sum of ``p * (x - lse)`` (an
entropy), a max over ``exp(x / t - lse)`` (a calibration's confidence): the later reduction's
loads read the earlier one's per-row result, so they were two kernels, each reading the rows
from memory, with the result stored between them. Here the later group takes the earlier one
as its ``before`` stage: one kernel reduces a row, keeps the result in registers and reads the
row again for the next reduction, from L1 or L2 where the row fits (up to four stages: a
maximum, a sum of ``exp(x - m)``, a sum weighted by the resulting probabilities).

Only rows whose reduced dims are the last ones are staged (the row kernel is the one layout
with both passes), and only where the rows are many enough that a row each leaves no GPU idle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from stitch_graph.codegen._fusion_passes import join_reduction_pairs, read_inside
from stitch_graph.codegen.ir import Group, OpNode, ProgramIR, Ref, numel

_MOST_ANCHORS = 3  # reductions of one stage (the accumulators' pair or triple)
_MOST_STAGES = 4
_FEW_ROWS = 132  # below this many rows a long row is split over blocks instead
_LONG_ROW = 65536
_REGROUPING = frozenset({"view", "flatten", "unflatten", "unsqueeze", "squeeze", "view_as"})


def join_dependent_row_passes(
    ir: ProgramIR,
    groups: list[Group],
    group_of: dict[str, Group],
    users: dict[str, list[str]],
    is_view: Callable[[OpNode], bool],
    rows_of: Callable[[ProgramIR, OpNode], tuple | None],
) -> None:
    """Give each reduction group whose loads read an earlier reduction of the same rows, one
    value a row, that reduction as its ``before`` stage. The earlier group's results that other
    kernels read are stored beside, so each such reader must run after the joined kernel."""

    def join(a: Group, b: Group) -> Callable[[], None] | None:
        head = stages(b)[0]
        first, lifted = _lifted(ir, a, head, users)
        if not stages_fit(ir, first, [lifted, *stages(b)[1:]], is_view, rows_of):
            return None

        def apply() -> None:
            a.epilogue, a.output = first.epilogue, first.output
            head.prologue, head.before = lifted.prologue, a

        return apply

    join_reduction_pairs(
        ir, groups, group_of, join, lambda a: readers_past_views(ir, a.members, users, is_view)
    )


def stages_fit(
    ir: ProgramIR,
    a: Group,
    later: list[Group],
    is_view: Callable[[OpNode], bool],
    rows_of: Callable[[ProgramIR, OpNode], tuple | None],
) -> bool:
    """Whether the stages ``later`` can take ``a`` (with any stages of its own) before them:
    all reductions of the same contiguous rows, ``a``'s results one value a row, read by
    ``later`` only as that value broadcast along the row (through views), nothing per element
    of ``a`` read by them, and no row rewritten from a result."""
    chain = stages(a)
    if any(g.kind != "reduction" for g in [*chain, *later]) or len(chain) + len(later) > _MOST_STAGES:
        return False
    if any(len(g.anchors) > _MOST_ANCHORS for g in [*chain, *later]):
        return False
    earlier_anchors = [ir.node(n) for g in chain for n in g.anchors]
    if any(x.dtype != "float32" for x in earlier_anchors):
        return False
    anchors = [*earlier_anchors, *(ir.node(n) for g in later for n in g.anchors)]
    rows = [rows_of(ir, x) for x in anchors]
    if rows[0] is None or any(r is None or r[:2] != rows[0][:2] for r in rows):
        return False
    shape, dims = rows[0][0], rows[0][1]
    if not shape or dims != tuple(range(len(shape) - len(dims), len(shape))):
        return False  # the row kernel reads the reduced dims last
    length = numel(tuple(shape[d] for d in dims))
    if numel(shape) // max(length, 1) < _FEW_ROWS and length >= _LONG_ROW:
        return False
    per_element = {m for g in [*chain, *later] for m in g.prologue}
    per_row = numel(tuple(anchors[0].shape))
    results = [*a.members, *(m for g in later for m in [*g.anchors, *g.epilogue])]
    if any(numel(tuple(ir.node(m).shape)) != per_row for m in results if m not in per_element):
        return False  # a row rewritten from its result (a broadcast epilogue) is not staged
    keep = _squeezed(tuple(1 if d in dims else n for d, n in enumerate(shape)))
    earlier = set(a.members)
    read = False
    for name in (m for g in later for m in [*g.prologue, *g.epilogue]):
        prologue = any(name in g.prologue for g in later)
        for ref in ir.node(name).tensor_refs():
            if ref.kind != "node" or _through_views(ir, ref.name, is_view) not in earlier:
                continue
            source = row_value_source(ir, ref.name, is_view)
            if source is None or source in per_element:
                return False  # rows regrouped, or a per-element value of an earlier pass
            if prologue:  # one value a row, broadcast along the row
                if _squeezed(tuple(ir.shapes[ref])) != keep:
                    return False
                read = True
    return read and not read_inside(
        ir, a.members, {m for g in later for m in g.members}, is_view
    )


def _lifted(
    ir: ProgramIR, a: Group, b: Group, users: dict[str, list[str]]
) -> tuple[Group, Group]:
    """``a`` and ``b`` with ``a``'s rows rewritten from its result (``(x - m) / s``) moved
    into ``b``'s loads, where ``b`` is their one reader and one of its reductions reduces
    them: the rewrite is then computed as ``b`` reads the row, never stored. Unchanged where
    that does not hold."""
    if a.anchor is None or b.anchor is None or a.before is not None:
        return a, b
    per_row = numel(tuple(ir.node(a.anchor).shape))
    rewrite = [m for m in a.epilogue if numel(tuple(ir.node(m).shape)) != per_row]
    sources = [ir.node(x).args.get("input") for x in b.anchors]
    source = next((r for r in sources if isinstance(r, Ref) and r.name == a.output), None)
    if not rewrite or source is None:
        return a, b
    inside = {*rewrite, *b.members}
    shape = ir.shapes[source]
    if any(ir.node(m).shape != shape or any(u not in inside for u in users.get(m, []))
           for m in rewrite):
        return a, b
    kept = [m for m in a.epilogue if m not in rewrite]
    first = replace(a, epilogue=kept, output=(kept or a.anchors)[-1])
    return first, replace(b, prologue=[*rewrite, *b.prologue])


def stages(g: Group) -> list[Group]:
    """``g``'s stages, the first first: ``g`` itself where it has none before it."""
    chain = [g]
    while chain[0].before is not None:
        chain.insert(0, chain[0].before)
    return chain


def row_value_source(ir: ProgramIR, name: str, is_view: Callable[[OpNode], bool]) -> str | None:
    """The node whose values ``name`` is, in the same order, through views that only regroup
    dims (``unsqueeze``, ``view``, ...); ``None`` where a view in between reorders or picks."""
    node = ir.node(name)
    while is_view(node):
        src = node.args.get("input")
        if node.op not in _REGROUPING or not isinstance(src, Ref) or src.kind != "node":
            return None
        node = ir.node(src.name)
    return node.name


def staged_group(
    ir: ProgramIR,
    gid: str,
    members: list[str],
    anchors: list[str],
    is_view: Callable[[OpNode], bool],
    given: list[list[str]] | None = None,
) -> Group | None:
    """The staged group a plan item's members make, or ``None`` when no anchor reads another.
    A stage's anchors are ``given`` (the plan's, stage by stage), else the earliest stage
    after every anchor they read; it loads what they read that no earlier stage computes, and
    its epilogue holds the per-row values later stages read."""
    inside = set(members)
    reads = {x: read_inside(ir, [x], inside, is_view) for x in anchors}
    level: dict[str, int] = {x: k for k, stage in enumerate(given or []) for x in stage}
    if set(level) != set(anchors):
        level = {}
        for x in anchors:  # evaluation order: what an anchor reads comes before it
            level[x] = 1 + max((level[y] for y in anchors if y in reads[x] and y in level),
                               default=-1)
    depth = max(level.values(), default=0) + 1
    if depth < 2:
        return None
    per_row = numel(tuple(ir.node(anchors[0]).shape))
    parts: list[tuple[list[str], set[str], set[str]]] = []  # anchors, loads, epilogue
    assigned: set[str] = set()
    for k in range(depth):
        mine = [x for x in anchors if level[x] == k]
        read = set().union(*(reads[x] for x in mine)) - assigned - set(anchors)
        before = {x for x in anchors if level[x] < k}
        row_values = {  # per-row values of earlier stages' results
            m for m in read
            if numel(tuple(ir.node(m).shape)) == per_row
            and read_inside(ir, [m], inside, is_view) & before
        }
        if k:
            parts[-1][2].update(row_values)
        loads = read - row_values
        assigned |= loads | row_values | set(mine)
        parts.append((mine, loads, set()))
    parts[-1][2].update(inside - assigned)
    for k, (mine, loads, epilogue) in enumerate(parts[1:], start=1):
        earlier = set().union(*(p[1] for p in parts[:k]))  # values per element, gone by now
        reads = {_through_views(ir, r.name, is_view) for m in [*mine, *loads, *epilogue]
                 for r in ir.node(m).tensor_refs() if r.kind == "node"}
        if reads & earlier:
            msg = (f"plan item {gid}: stage {k} reads {sorted(reads & earlier)}, values an "
                   "earlier stage computes per element; re-plan from this program")
            raise ValueError(msg)
    group: Group | None = None
    for k, (mine, loads, epilogue) in enumerate(parts):
        last = k == depth - 1
        group = Group(
            gid if last else f"{gid}_stage{k}", "reduction", mine[0],
            [m for m in members if m in loads],
            [m for m in members if m in epilogue],
            members[-1] if last else ([m for m in members if m in epilogue] or mine)[-1],
            mine[1:], group,
        )
    return group


def readers_past_views(
    ir: ProgramIR, names: list[str], users: dict[str, list[str]], is_view: Callable[[OpNode], bool]
) -> set[str]:
    """The nodes that read ``names``, a view's readers in its place (views run on the host)."""
    found: set[str] = set()
    todo = [u for m in names for u in users.get(m, [])]
    while todo:
        u = todo.pop()
        if u in found:
            continue
        found.add(u)
        if u != "output" and is_view(ir.node(u)):
            todo.extend(users.get(u, []))
    return {u for u in found if u == "output" or not is_view(ir.node(u))}


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` without its leading ones: the shapes a broadcast treats alike."""
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _through_views(ir: ProgramIR, name: str, is_view: Callable[[OpNode], bool]) -> str:
    """The node a chain of views reads, or ``name`` when it is no view."""
    node = ir.node(name)
    while is_view(node):
        src = node.args.get("input")
        if not isinstance(src, Ref) or src.kind != "node":
            break
        node = ir.node(src.name)
    return node.name


