"""Reductions of the same rows read by different kernels (or returned), taken in one pass.

A hand-written label-smoothed cross entropy takes the logsumexp and the mean of the same
logits rows; the logsumexp is read by the picked-class term and by the smoothing term, so the
scheduler cannot make the two reductions siblings of one kernel (each result must reach its
readers), and the logits are read twice. Here the reductions' results are concatenated along
dim 0 and each reader reads its slice, a view: the scheduler then takes them as siblings that
store into their slices of the concatenation (``_cat_slices``), one pass over the rows.

Only for large inputs, and only where the scheduler's estimate of the device time (passes over
memory and launches) falls: a layer norm whose statistics are read back over the rows they
reduce is one kernel as it is, and would become two.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.codegen._capture_base import _describe, _rewire, _with_operands
from stitch_graph.codegen._capture_estimate import device_us, trial_copy
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, numel

_SHARED = frozenset({"sum", "mean", "amax", "amin", "logsumexp", "var", "std"})
_MOST = 3  # the scheduler's limit on siblings of one pass
_LARGE = 1 << 21  # elements (8 MB of float32): a pass that costs more than a launch


def share_row_passes(ir: ProgramIR) -> None:
    """Concatenate the results of reductions of the same rows of one large input that
    different kernels read, so that one pass takes them all."""
    users = ir.users()
    same_rows: dict[tuple[Any, ...], list[OpNode]] = {}
    for node in ir.nodes:
        src = node.args.get("input")
        if node.op not in _SHARED or node.dtype != "float32" or not isinstance(src, Ref):
            continue
        if not node.shape or numel(ir.shapes[src]) < _LARGE:
            continue
        if node.tensor_refs() != [src] or ir.dtypes[src] != "float32":
            continue
        dims = node.args.get("dim")
        if dims is None:
            continue  # a whole-tensor reduction: no rows to share
        rank = len(ir.shapes[src])
        dims = tuple(sorted(int(d) % rank for d in (dims if isinstance(dims, list | tuple) else [dims])))
        same_rows.setdefault((src, dims, node.shape), []).append(node)
    for nodes in same_rows.values():
        nodes = nodes[:_MOST]
        readers = {u for n in nodes for u in users[n.name]}
        if len(nodes) > 1 and (len(readers) > 1 or readers == {"output"}) and _pays(ir, nodes):
            _concatenate(ir, nodes)  # (one node reading them all makes them siblings already)


def _pays(ir: ProgramIR, nodes: list[OpNode]) -> bool:
    """Whether the scheduled program's estimated device time falls with ``nodes`` shared."""
    trial = trial_copy(ir)
    _concatenate(trial, [trial.node(n.name) for n in nodes])
    return device_us(trial) < device_us(ir)


def _concatenate(ir: ProgramIR, nodes: list[OpNode]) -> None:
    """``cat(results, 0)`` after the first reduction (the others moved up beside it: they read
    only the input it reads), and each result's readers reading its slice instead."""
    names = {n.name for n in nodes}
    refs = [Ref("node", n.name) for n in nodes]
    rows = nodes[0].shape[0]
    shape = (rows * len(nodes), *nodes[0].shape[1:])
    cat_name = f"{nodes[0].name}__rows"
    cat = OpNode(cat_name, "cat", {"tensors": refs, "dim": 0}, shape, "float32", "torch.cat",
                 [refs, 0], {})
    cat_ref = Ref("node", cat_name)
    _describe(ir, cat_ref, shape, "float32")
    views: dict[Ref, Ref] = {}
    added = [*nodes, cat]
    for k, n in enumerate(nodes):
        index = (slice(k * rows, (k + 1) * rows, None),)
        view = OpNode(f"{n.name}__row", "getitem", {"input": cat_ref, "index": index}, n.shape,
                      "float32", "operator.getitem", [cat_ref, index], {})
        views[Ref("node", n.name)] = Ref("node", view.name)
        _describe(ir, Ref("node", view.name), n.shape, "float32")
        added.append(view)
    for node in ir.nodes:
        if node.name not in names:
            _rewire(node, views)
    ir.outputs = _with_operands(ir.outputs, views)
    at = ir.nodes.index(nodes[0])
    rest = [n for n in ir.nodes if n.name not in names]
    ir.nodes = [*rest[:at], *added, *rest[at:]]

