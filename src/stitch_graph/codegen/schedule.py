"""Fusion scheduling and planning: group IR nodes into kernels and write the ``Plan``.

Rules, in the spirit of Inductor's scheduler but much smaller:

* a pointwise node joins the group that produces one of its operands when that value has no other
  reader and is not a program output; pure pointwise groups merge freely (their expressions are
  recomputed at each output element, broadcasting by stride-0 indexing), an anchored group takes
  the node as epilogue when the node has the anchor's output shape;
* reductions, normalisations, softmax, pooling and scans take their single-reader pointwise
  producer group as a prologue (computed on load) and their pointwise consumers as epilogue;
  a keepdim reduction also takes the pointwise consumer that broadcasts its (single-reader)
  result back over the reduced input's shape, ``x * rsqrt(mean(x * x) + eps)`` or
  ``x / x.sum(-1, keepdim=True)``: each row is reduced, then rewritten, in one kernel;
* GEMMs are cuBLAS anchors and convolutions (plain or transposed) anchors; both take epilogues
  (linear's bias included) but no prologue; when a reduction, norm, softmax, pool or scan is the
  only reader, the epilogue becomes that kernel's prologue instead and the library's result is
  written once (the capture then computes such an anchor's bias as a pointwise add); an
  epilogue node of a smaller shape broadcast into the anchor's moves too when it reads nothing
  another kernel writes (attention's causal mask from a buffer);
* pointwise ops that read their operands at other positions than the output's (cat, flip,
  gather, ...: ``ops.INDEXED``) never absorb their producers, whose values must be in memory;
* LSTM and GRU layers are anchors of their own (cuBLAS GEMMs and one gate kernel a time step);
* views run on the host; ops the registry cannot emit stay in PyTorch and are named, and a node
  whose arguments the rules do not understand is unsupported rather than an exception.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from stitch_graph.artifacts import HostPlan, Hotspot, Plan, TodoItem
from stitch_graph.codegen._fusion_attention import attention_group, join_attention
from stitch_graph.codegen._fusion_passes import (
    broadcasts,
    computable_on_load,
    fold_shared_producers,
    groups_read_through,
    join_row_passes,
    joins_storing,
    stores_beside,
)
from stitch_graph.codegen._fusion_passes import read_inside as _read_inside
from stitch_graph.codegen._fusion_row_stages import (
    join_dependent_row_passes,
    staged_group,
    stages,
)
from stitch_graph.codegen._indexed_rules import indexed_ok, own_position_operands
from stitch_graph.codegen._rnn_fit import persistent_fit
from stitch_graph.codegen._scatter_rules import scatter_operands, scatter_unsupported
from stitch_graph.codegen.ir import (
    Group,
    OpNode,
    ProgramIR,
    Ref,
    gemm_loop_dim,
    matrix_layout,
    numel,
    row_layout,
)
from stitch_graph.codegen.ops import (
    GENERATED_DTYPES,
    INDEXED,
    LOADS_THROUGH_PROLOGUE,
    explain_unsupported,
    lookup,
)

__all__ = [
    "group_signature",
    "groups_from_plan",
    "node_kind",
    "plan_program",
    "pool_dims",
    "reduction_dims",
    "schedule_program",
]

_DTYPES = GENERATED_DTYPES
_INTEGERS = ("bool", "int64", "int32")  # what an int64 sum (a count) may add up
_ITEM_KIND = {
    "pointwise": "pointwise",
    "reduction": "reduction",
    "norm": "norm",
    "softmax": "norm",
    "gemm": "gemm",
    "conv": "conv",
    "pool": "reduction",
    "scan": "reduction",
    "rnn": "gemm",
    "scatter": "pointwise",
    "attention": "gemm",
}
LAUNCH_US = 4.0  # host launch cost of one kernel through the CuPy launcher, about
HBM_BYTES_PER_US = 3.0e6  # H200-class DRAM bandwidth, bytes per microsecond
_FLOPS_PER_US = 4.0e7  # FP32 throughput without tensor cores, flops per microsecond
# cuDNN runs FP32 transposed convolutions as data-gradient kernels, far below that rate: on the
# H200, KernelBench L2's 91 (a 3.4 ms estimate at the rate above) ran above 10 ms
_CONV_TRANSPOSE_FLOPS_PER_US = 1.0e7


def reduction_dims(ir: ProgramIR, node: OpNode) -> list[int]:
    """Dims a reduction node reduces (empty list: all of them)."""
    dim = node.args.get("dim")
    if dim is None:
        return []
    dims = list(dim) if isinstance(dim, list | tuple) else [dim]
    return [int(d) for d in dims]


def reduces_strided(ir: ProgramIR, group: Group) -> bool:
    """Whether a reduction group reduces a dim with elements after it (a column reduction)."""
    if group.kind != "reduction" or not group.anchor:
        return False
    node = ir.node(group.anchor)
    source = node.args.get("input")
    if not isinstance(source, Ref):
        return False
    layout = row_layout(ir.shapes[source], reduction_dims(ir, node))
    return layout is not None and layout[2] > 1


def convolves_depthwise(ir: ProgramIR, group: Group) -> bool:
    """Whether a convolution group is depthwise: groups > 1, one input channel a group."""
    if group.kind != "conv" or not group.anchor:
        return False
    node = ir.node(group.anchor)
    weight = node.args.get("weight")
    groups = int(node.args.get("groups", 1) or 1)
    if node.op.startswith("conv_transpose") or not isinstance(weight, Ref) or groups < 2:
        return False
    return ir.shapes[weight][1] == 1


def _rnn_unsupported(ir: ProgramIR, node: OpNode) -> str:
    """Why an ``lstm``/``gru`` node cannot be generated ("" when it can)."""
    x, hx, params = node.args.get("input"), node.args.get("hx"), node.args.get("params")
    hx = list(hx) if isinstance(hx, list | tuple) else [hx]
    if not isinstance(x, Ref) or len(ir.shapes[x]) != 3:
        return "needs a batched 3-d input"
    if len(hx) != (2 if node.op == "lstm" else 1) or not all(isinstance(h, Ref) for h in hx):
        return "needs the initial hidden state as tensors"
    if not isinstance(params, list | tuple) or not all(isinstance(p, Ref) for p in params):
        return "needs its weights as tensors"
    if any(ir.dtypes.get(r, "float32") != "float32" for r in [x, *hx, *params]):
        return "float32 only"
    if not all(ir.is_contiguous(r) for r in [x, *hx, *params]):
        return "needs contiguous input, state and weights"
    if node.args.get("train") and float(node.args.get("dropout") or 0) > 0:
        return "dropout between layers in training mode"
    layers = int(node.args["num_layers"]) * (2 if node.args.get("bidirectional") else 1)
    if len(params) != layers * (4 if node.args.get("has_biases") else 2):
        return "projections (proj_size) are not supported"
    return ""


# reductions that also take non-adjacent dims (a hand-written batch norm's mean over N, H, W):
# each row's elements are gathered by index
_GATHERED_REDUCE = frozenset(
    {"sum", "mean", "amax", "amin", "prod", "var", "std", "logsumexp", "norm"}
)


def _row_ok(ir: ProgramIR, node: OpNode) -> str:
    src = node.args.get("input")
    # a count of a mask, an integer sum: int64 accumulators (``SgSumI``)
    counts = node.op == "sum" and node.dtype == "int64" and ir.dtypes.get(src) in _INTEGERS
    # the first or last set position of a mask (``mask.argmax(-1)``): 0 and 1 are exact in the
    # float accumulator; of integers (``mask.int()``, token ids), an integer one (``SgArgMaxI``)
    flags = node.op in ("argmax", "argmin") and ir.dtypes.get(src) in _INTEGERS
    # the largest or smallest of integers (``SgMaxI``, ``SgMinI``): exact in int64
    extremes = node.op in ("amax", "amin", "max", "min") and node.dtype in ("int64", "int32") and (
        ir.dtypes.get(src) == node.dtype)
    if not isinstance(src, Ref) or (
        ir.dtypes.get(src) != "float32" and not counts and not flags and not extremes
    ):
        return "needs a float32 tensor input"
    shape = ir.shapes[src]
    if node.op in ("softmax", "log_softmax"):
        dims = [int(node.args["dim"])]
    elif node.op in ("layer_norm", "rms_norm"):
        normalized = node.args.get("normalized_shape")
        count = len(normalized) if isinstance(normalized, list | tuple) else 1
        dims = list(range(len(shape) - count, len(shape)))
    elif node.op in ("group_norm", "batch_norm", "instance_norm"):
        if len(shape) < 2:
            return "needs (N, C, ...) input"
        if node.op == "instance_norm" and not node.args.get("use_input_stats", True):
            return "instance norm with running statistics"
        return ""
    else:
        dims = reduction_dims(ir, node)
        if node.op in ("argmax", "argmin") and not dims:
            return ""
    if row_layout(shape, dims) is None and node.op not in _GATHERED_REDUCE:
        return "reduces non-adjacent dims"
    return ""


def pool_dims(node: OpNode) -> int:
    """Spatial dims of a pooling op (``max_pool2d``, ``max_pool2d_indices`` -> 2)."""
    return int(node.op.removesuffix("_indices").removesuffix("d")[-1])


def _pool_ok(ir: ProgramIR, node: OpNode) -> str:
    src = node.args.get("input")
    out = "int64" if node.op.endswith("_indices") else "float32"
    if not isinstance(src, Ref) or ir.dtypes.get(src) != "float32" or node.dtype != out:
        return f"needs a float32 tensor input and a {out} output"
    if node.args.get("return_indices"):
        return "with return_indices"
    nd = pool_dims(node)
    if len(ir.shapes[src]) not in (nd + 1, nd + 2) or len(node.shape) != len(ir.shapes[src]):
        return f"needs a {nd + 1}-d or {nd + 2}-d input"
    if node.op.startswith("adaptive"):
        return ""
    for key in ("kernel_size", "stride", "padding", "dilation"):
        value = node.args.get(key)
        values = list(value) if isinstance(value, list | tuple) else [value]
        if not all(v is None or isinstance(v, int) for v in values) or len(values) not in (
            0,
            1,
            nd,
        ):
            return f"{key}={value!r}"
    return ""


def node_kind(ir: ProgramIR, node: OpNode) -> tuple[str, str]:
    """Scheduling kind of a node (``pointwise``, ``reduction``, ..., ``view``, ``unsupported``).

    Returns:
        ``(kind, reason)``; ``reason`` explains an ``unsupported`` kind. Arguments the rules do
        not understand make the node ``unsupported``, never an exception.
    """
    try:
        return _node_kind(ir, node)
    except Exception as error:  # noqa: BLE001 - odd arguments: the op stays in PyTorch
        return "unsupported", f"unsupported: {node.op} ({type(error).__name__}: {error})"


def _node_kind(ir: ProgramIR, node: OpNode) -> tuple[str, str]:
    info = lookup(node.op)
    if info is None or info.kind == "unsupported":
        return "unsupported", explain_unsupported(node.op)
    if info.kind in ("view", "identity"):
        return "view", ""
    if info.kind == "rnn":
        reason = _rnn_unsupported(ir, node)
        return ("rnn", "") if not reason else ("unsupported", f"unsupported: {node.op} ({reason})")
    if info.kind == "scatter":
        reason = scatter_unsupported(ir, node)
        return ("scatter", "") if not reason else ("unsupported", f"unsupported: {node.op} ({reason})")  # noqa: E501
    dtypes = {ir.dtypes.get(r, "float32") for r in node.tensor_refs()} | {node.dtype}
    if not dtypes <= _DTYPES:
        bad = ", ".join(sorted(dtypes - _DTYPES))
        return "unsupported", f"unsupported: {node.op} on {bad} tensors"
    if info.kind == "pointwise":
        if node.op in INDEXED:
            return indexed_ok(ir, node)
        if info.expr is None:
            return "unsupported", f"unsupported: {node.op} (no expression)"
        unknown = node.attrs.get("unknown_arguments")
        if unknown:  # an argument the expression would drop (round's decimals before it had one)
            return "unsupported", f"unsupported: {node.op} with {', '.join(unknown)}"
        return "pointwise", ""
    if info.kind in ("reduction", "norm", "softmax"):
        reason = _row_ok(ir, node)
        return (
            (info.kind, "") if not reason else ("unsupported", f"unsupported: {node.op} ({reason})")
        )
    if info.kind == "gemm":
        refs = [r for r in node.tensor_refs() if r != node.args.get("bias")]
        operands = refs[-2:] if node.op == "addmm" else refs[:2]
        for ref in operands:
            shape = ir.shapes[ref]
            strides = ir.strides.get(ref)
            if len(shape) < 2 or strides is None:
                return "unsupported", f"unsupported: {node.op} with a {len(shape)}-d operand"
            if (
                node.op != "linear"
                and matrix_layout(shape, strides) is None
                and gemm_loop_dim(ir, node) is None
            ):
                return "unsupported", f"unsupported: {node.op} operand layout {strides}"
        weight = node.args.get("weight")
        if node.op == "linear" and ir.strides[weight][-1] != 1:  # rows apart are read as such
            return "unsupported", "unsupported: linear with a strided weight"
        return "gemm", ""
    if info.kind == "pool":
        reason = _pool_ok(ir, node)
        return ("pool", "") if not reason else ("unsupported", f"unsupported: {node.op} ({reason})")
    if info.kind == "scan":
        src = node.args.get("input")
        indexed = ("sort_indices", "topk_indices", "cummax_indices", "cummin_indices")
        out_dtype = "int64" if node.op in indexed else "float32"
        if node.op in ("cumsum", "cumprod") and node.dtype in ("float32", "int64"):
            out_dtype, ins = node.dtype, ("float32", "int64", "int32", "bool")  # position ids
        else:
            ins = ("float32",)
        if not isinstance(src, Ref) or ir.dtypes.get(src) not in ins or node.dtype != out_dtype:
            return "unsupported", f"unsupported: {node.op} (needs float32 input and output)"
        if not isinstance(node.args.get("dim"), int):
            return "unsupported", f"unsupported: {node.op} (dim must be an int)"
        return "scan", ""
    if info.kind == "conv":
        if isinstance(node.args.get("padding"), str) and node.args["padding"] != "valid":
            return "unsupported", f"unsupported: {node.op} with padding={node.args['padding']!r}"
        nd = int(node.op.removesuffix("d")[-1])
        x, w = node.args.get("input"), node.args.get("weight")
        if not isinstance(x, Ref) or not isinstance(w, Ref):
            return "unsupported", f"unsupported: {node.op} without tensor input and weight"
        if len(ir.shapes[x]) != nd + 2 or len(ir.shapes[w]) != nd + 2:
            return "unsupported", f"unsupported: {node.op} on an unbatched input"
        return "conv", ""
    return "unsupported", explain_unsupported(node.op)


_BROADCAST_BACK_ROWS = 512  # a warp or a block per row: four of them per SM of an H200
_BROADCAST_BACK_THREAD_ROWS = 16384  # a thread per row
_BROADCAST_BACK_SMALL = 2**17  # elements (512 KB of float32): launch-bound at any layout
_BROADCAST_BACK_SMALL_ROW = 1024  # ... where no thread walks a long row alone
_BROADCAST_BACK = {"sum", "mean", "norm", "prod", "amax", "amin", "logsumexp", "var", "std"}


def _broadcast_back(ir: ProgramIR, group: Group, node: OpNode) -> bool:
    """Whether ``node`` reads the keepdim reduction ``group`` broadcast over its input's shape."""
    anchor = ir.node(group.anchor or "")
    if group.kind != "reduction" or anchor.op not in _BROADCAST_BACK:
        return False
    src = anchor.args.get("input")
    if not isinstance(src, Ref) or node.dtype != "float32":
        return False
    in_shape = ir.shapes[src]
    reduced = reduction_dims(ir, anchor)
    if row_layout(in_shape, reduced) is None:
        return False  # rows gathered from non-adjacent dims are not rewritten in place
    dims = {d % len(in_shape) for d in reduced} if in_shape else set()
    out_shape = ir.shapes[Ref("node", group.output)]
    keepdim = len(out_shape) == len(in_shape) and all(
        out_shape[d] == (1 if d in dims else in_shape[d]) for d in range(len(in_shape))
    )
    rows = numel(out_shape)
    length = numel(in_shape) // max(rows, 1)
    inner = numel(in_shape[max(dims) + 1 :]) if dims else 1
    # one thread (strided rows), warp or block per row: too few rows would leave the GPU idle,
    # where the unfused reduction splits its rows and the pointwise kernel spreads over all;
    # an input this small is read in less time than the second launch costs either way
    enough_rows = (
        rows >= (_BROADCAST_BACK_THREAD_ROWS if inner >= 32 else _BROADCAST_BACK_ROWS)
        or (numel(in_shape) <= _BROADCAST_BACK_SMALL and length <= _BROADCAST_BACK_SMALL_ROW)
    )
    return bool(dims) and keepdim and length > 1 and enough_rows and node.shape == in_shape


# reductions whose accumulators ride together in one pass (``SgPair``, ``SgTriple``): the
# unseen smooth-max pooling's logsumexp and mean read their 128 MB input in two kernels (0.35x
# of torch.compile on the H200), TripletMarginLoss reads its anchor once a distance
_SIBLING_REDUCE = frozenset({"sum", "mean", "norm", "prod", "amax", "amin", "logsumexp", "var",
                             "std", "max", "min", "argmax", "argmin"})
_ARG_EXTREMES = frozenset({"argmax", "argmin"})  # an int64 index of a float32 row
_MOST_SIBLINGS = 3


def _rows_of(ir: ProgramIR, node: OpNode) -> tuple[Any, ...] | None:
    """What a reduction's rows are: its input's shape, the dims it reduces, its output shape."""
    src = node.args.get("input")
    if not isinstance(src, Ref):
        return None
    shape = ir.shapes[src]
    dims = sorted({d % len(shape) for d in reduction_dims(ir, node)}) if shape else []
    return tuple(shape), tuple(dims or range(len(shape))), tuple(node.shape)


def _siblings_fit(ir: ProgramIR, base: Group, other: Group) -> bool:
    """Whether ``other``'s reductions can be taken in ``base``'s pass: the same rows of inputs
    of one shape, results used row by row, and neither group reading the other's values."""
    if base.kind != "reduction" or other.kind != "reduction":
        return False
    anchors = [ir.node(a) for a in [*base.anchors, *other.anchors]]
    if len(anchors) > _MOST_SIBLINGS or any(
        a.op not in _SIBLING_REDUCE or a.dtype != ("int64" if a.op in _ARG_EXTREMES else "float32")
        or ir.dtypes.get(a.args.get("input")) != "float32"
        for a in anchors
    ):
        return False
    rows = _rows_of(ir, anchors[0])
    if rows is None or any(_rows_of(ir, a) != rows for a in anchors[1:]):
        return False
    if any(ir.node(m).shape != anchors[0].shape for m in other.epilogue):
        return False
    # an epilogue may read the other's results (``conf - acc`` of two sums of the same rows):
    # the pass has every result before its epilogue; nothing it loads may
    return not any(
        _reads_any(ir, [*g.prologue, *g.anchors], set(h.members))
        or any(r.name in h.prologue for m in g.epilogue for r in ir.node(m).tensor_refs())
        for g, h in ((base, other), (other, base))
    )


def _reads_any(ir: ProgramIR, start: list[str], targets: set[str]) -> bool:
    """Whether ``start`` reads any of ``targets``, directly or through others. Nodes come in
    program order, so the walk stops at nodes older than every target."""
    if not targets:
        return False
    oldest = min(ir.position(t) for t in targets)
    seen: set[str] = set()
    todo = list(start)
    while todo:
        for ref in ir.node(todo.pop()).tensor_refs():
            if ref.kind != "node" or ref.name in seen:
                continue
            if ref.name in targets:
                return True
            seen.add(ref.name)
            if ir.position(ref.name) > oldest:
                todo.append(ref.name)
    return False


def _concatenated_siblings(
    ir: ProgramIR, node: Any, group_of: dict[str, Group], users: dict[str, list[str]]
) -> list[Group]:
    """The reduction groups whose results ``node`` concatenates, when they can be siblings of
    one pass that stores each result into its slice (CBAM's channel mean and max, a
    concatenated average and max pooling); else ``[]``."""
    tensors = node.args.get("tensors") if node.op == "cat" else None
    if not isinstance(tensors, list | tuple) or len(tensors) < 2:
        return []
    if not isinstance(node.args.get("dim", 0), int) or node.dtype != "float32":
        return []
    groups: list[Group] = []
    for ref in tensors:
        g = group_of.get(ref.name) if isinstance(ref, Ref) and ref.kind == "node" else None
        if g is None or g in groups or g.output != ref.name or users[ref.name] != [node.name]:
            return []
        if g.kind != "reduction":
            return []
        anchor = ir.node(g.anchor or "")
        if any(ir.node(m).shape != anchor.shape for m in g.epilogue):
            return []  # a result broadcast back over its rows is no row of the concatenation
        groups.append(g)
    for g in groups[1:]:
        if not _siblings_fit(ir, groups[0], g):
            return []
    if len([a for g in groups for a in g.anchors]) > _MOST_SIBLINGS:
        return []
    return groups


def schedule_program(ir: ProgramIR) -> list[Group]:
    """Fuse the program's nodes into groups, in execution order.

    Args:
        ir: The captured program.

    Returns:
        Groups ordered by the position of their output node; nodes in no group run on the
        host (views) or in PyTorch (unsupported ops).
    """
    users = ir.users()
    order = {n.name: i for i, n in enumerate(ir.nodes)}
    group_of: dict[str, Group] = {}
    groups: list[Group] = []
    counter = 0

    def new_group(kind: str, anchor: str | None, output: str) -> Group:
        nonlocal counter
        group = Group(f"k{counter}", kind, anchor, [], [], output)  # type: ignore[arg-type]
        counter += 1
        groups.append(group)
        return group

    def absorb(into: Group, other: Group, *, as_prologue: bool = False) -> None:
        members = other.members
        if as_prologue:
            into.prologue.extend(members)
        else:
            into.epilogue.extend(members)
        for m in members:
            group_of[m] = into
        groups.remove(other)

    def join_siblings(into: Group, other: Group) -> None:
        into.siblings.extend(other.anchors)
        into.prologue.extend(other.prologue)
        into.epilogue.extend(other.epilogue)
        for m in other.members:
            group_of[m] = into
        groups.remove(other)

    for node in ir.nodes:
        kind, _ = node_kind(ir, node)
        if kind in ("view", "unsupported"):
            continue
        if kind == "pointwise":
            joined = _concatenated_siblings(ir, node, group_of, users)
            if joined:
                base = joined[0]
                for g in joined[1:]:
                    join_siblings(base, g)
                base.epilogue.append(node.name)
                base.output = node.name
                group_of[node.name] = base
                continue
            candidates: list[Group] = []
            # cat/flip/gather read their operands at other positions: those stay in memory;
            # triu/tril read theirs at their own element, as any pointwise op does (were they
            # own-position readers, ``joins_storing`` would store a cheap input beside the
            # triangle where its other readers now compute it again)
            operands = (
                own_position_operands(ir, node)
                if node.op in INDEXED - {"triu", "tril"}
                else node.tensor_refs()
            )
            for ref in operands:
                g = group_of.get(ref.name) if ref.kind == "node" else None
                if g is None or g in candidates:
                    continue
                single = users[g.output] == [node.name] and not stores_beside(g, users)
                if not single and not joins_storing(ir, g, node, users, order):
                    continue
                if g.kind == "scatter":
                    continue  # its threads write positions an index picks: no per-element epilogue
                if ref.name != g.output:
                    continue
                out_shape = ir.shapes[Ref("node", g.output)]
                if g.anchor is None and broadcasts(out_shape, node.shape):
                    candidates.append(g)
                elif g.anchor is not None and out_shape == node.shape:
                    candidates.append(g)
                elif g.anchor is not None and _broadcast_back(ir, g, node):
                    candidates.append(g)
            anchored = [g for g in candidates if g.anchor is not None]
            plain = [g for g in candidates if g.anchor is None]
            if anchored:  # an anchored kernel's epilogue stores one result
                plain = [
                    g for g in plain
                    if users[g.output] == [node.name] and not stores_beside(g, users)
                ]
            base = anchored[0] if anchored else new_group("pointwise", None, node.name)
            for g in anchored[1:]:
                if _siblings_fit(ir, base, g):
                    join_siblings(base, g)
            for g in plain + groups_read_through(ir, node, group_of, users):
                absorb(base, g)
            base.epilogue.append(node.name)
            base.output = node.name
            group_of[node.name] = base
            continue
        group = new_group(kind, node.name, node.name)
        group_of[node.name] = group
        src = node.args.get("input")
        if kind == "scatter":
            # the kernel that copies the input computes it (the zeros a scatter starts from),
            # the scattering kernel its source elements (messages gathered and weighted)
            for ref in scatter_operands(ir, node):
                g = group_of.get(ref.name)
                single = users[ref.name] == [node.name]
                if g in groups and g.anchor is None and single and not stores_beside(g, users):
                    absorb(group, g, as_prologue=True)
        elif kind in LOADS_THROUGH_PROLOGUE and isinstance(src, Ref) and src.kind == "node":
            g = group_of.get(src.name)
            if (
                g is not None
                and g.output == src.name
                and users[src.name] == [node.name]
                and not stores_beside(g, users)
                and ir.shapes[src] == ir.shapes[Ref("node", g.output)]
            ):
                if g.anchor is None:
                    absorb(group, g, as_prologue=True)
                elif g.kind in ("conv", "gemm") and g.epilogue and computable_on_load(
                    ir, g, group_of
                ):
                    # the library writes its result once; the epilogue runs on this kernel's load
                    group.prologue.extend(g.epilogue)
                    for m in g.epilogue:
                        group_of[m] = group
                    g.epilogue = []
                    g.output = g.anchor or g.output
    join_row_passes(ir, groups, group_of, users, _siblings_fit)
    join_dependent_row_passes(ir, groups, group_of, users, is_view(ir), _rows_of)
    fold_shared_producers(ir, groups, group_of, users)
    join_attention(ir, groups, group_of, users)
    for g in groups:
        g.prologue.sort(key=order.__getitem__)
        g.epilogue.sort(key=order.__getitem__)
    groups.sort(key=lambda g: order[g.output])
    for i, g in enumerate(groups):
        g.id = f"k{i}"
    return groups


def _kernel_name(ir: ProgramIR, group: Group) -> str:
    ops: list[str] = []
    for name in group.members:
        op = ir.node(name).op
        if op not in ops:
            ops.append(op)
    return f"{group.id}_" + "_".join(ops[:4])


def _stored_as(ir: ProgramIR, ref: Ref) -> Ref:
    """The tensor whose memory ``ref`` reads: through whole views (a reshape, a permutation, a
    reader's own copy of one) to the value they view."""
    while ref.kind == "node":
        node = ir.node(ref.name)
        info = lookup(node.op)
        src = node.args.get("input")
        if info is None or info.kind != "view" or not isinstance(src, Ref):
            break
        if numel(ir.shapes[src]) != numel(node.shape):
            break  # a slice: another part of it may be read beside
        ref = src
    return ref


def _bytes_and_flops(ir: ProgramIR, group: Group) -> tuple[float, float]:
    members = set(group.members)
    read: dict[Ref, int] = {}  # each tensor once: sibling reductions of one input read it once
    flops = 0.0
    for name in group.members:
        node = ir.node(name)
        info = lookup(node.op)
        for ref in node.tensor_refs():
            if ref.kind != "node" or ref.name not in members:
                read[_stored_as(ir, ref)] = numel(ir.shapes[ref])
        if info is not None and info.kind == "gemm":
            a = ir.shapes[node.tensor_refs()[0 if node.op != "addmm" else 1]]
            flops += 2.0 * numel(node.shape) * a[-1]
        elif info is not None and info.kind == "rnn":
            x = ir.shapes[node.args["input"]]
            flops += 2.0 * numel(x[:2]) * sum(numel(ir.shapes[w]) for w in node.args["params"])
        elif info is not None and info.kind == "conv":
            w = ir.shapes[node.args["weight"]]
            x = ir.shapes[node.args["input"]]
            per = numel(x) if node.op.startswith("conv_transpose") else numel(node.shape)
            flops += 2.0 * per * numel(w[1:])
        else:
            flops += (info.flops if info else 1.0) * numel(node.shape)
    out = ir.node(group.output)
    return 4.0 * (sum(read.values()) + numel(out.shape)), flops


def group_signature(ir: ProgramIR, group: Group) -> str:
    """What the group computes, its names left out: two groups with the same signature emit the
    same kernel on the same shapes (a repeated layer, an unrolled recurrent step), so the tuner
    times one of them and gives every copy its choice.

    Operands are named by their place in the group, or outside it by their kind, shape and
    strides; ops, shapes, dtypes, literal arguments and lowering attributes are kept as they are.
    """
    place = {name: i for i, name in enumerate(group.members)}

    def canonical(value: Any) -> Any:
        if isinstance(value, Ref):
            if value.kind == "node" and value.name in place:
                return f"member{place[value.name]}"
            return [value.kind, ir.shapes.get(value), ir.strides.get(value)]
        if isinstance(value, list | tuple):
            return [canonical(v) for v in value]
        if isinstance(value, dict):
            return {str(k): canonical(v) for k, v in sorted(value.items(), key=str)}
        return value if isinstance(value, int | float | str | bool) or value is None else repr(value)

    parts = [
        [node.op, node.shape, node.dtype, canonical(node.args), canonical(node.attrs)]
        for node in (ir.node(name) for name in group.members)
    ]
    out = Ref("node", group.output)
    text = json.dumps([group.kind, parts, ir.strides.get(out)], default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def epilogue_kernel_follows(ir: ProgramIR, group: Group) -> bool:
    """Whether a library call (cuBLAS, cuDNN) is followed by a kernel of its own for its bias
    and epilogue, which reads the library's result back."""
    if group.kind not in ("gemm", "conv") or group.anchor is None:
        return False
    return bool(group.epilogue) or isinstance(ir.node(group.anchor).args.get("bias"), Ref)


def library_epilogue_fits(ir: ProgramIR, group: Group) -> bool:
    """Whether the group is a linear layer with a float32 bias whose epilogue is nothing or
    a ReLU of it: what cuBLASLt's epilogue can apply as the GEMM stores its result (the
    emitter adds its own conditions: the tuning, one batch, no concatenation slice)."""
    node = ir.node(group.anchor or "")
    bias = node.args.get("bias")
    if node.op != "linear" or not isinstance(bias, Ref) or ir.dtypes.get(bias) != "float32":
        return False
    epilogue = [ir.node(m) for m in group.epilogue]
    return not epilogue or (
        len(epilogue) == 1 and epilogue[0].op == "relu"
        and epilogue[0].args.get("input") == Ref("node", node.name)
    )


def _bias_in_library(ir: ProgramIR, group: Group) -> bool:
    """Whether cuBLASLt's epilogue applies the bias (and ReLU) by default, as the plan says: a
    contiguous input is one batch (a transposed one's batches get a generated kernel)."""
    x = ir.node(group.anchor or "").args.get("input")
    return library_epilogue_fits(ir, group) and isinstance(x, Ref) and ir.is_contiguous(x)


def estimate_us(ir: ProgramIR, group: Group) -> float:
    """A roofline guess of the group's device time: its bytes at HBM speed or its FLOPs at
    the rate its kind reaches, whichever is longer."""
    nbytes, flops = _bytes_and_flops(ir, group)
    transposed = any(ir.node(m).op.startswith("conv_transpose") for m in group.members)
    rate = _CONV_TRANSPOSE_FLOPS_PER_US if transposed else _FLOPS_PER_US
    return max(nbytes / HBM_BYTES_PER_US, flops / rate)


def _constraints(ir: ProgramIR, group: Group) -> list[str]:
    out = ir.node(group.output)
    n = numel(out.shape)
    items = [f"float32; static shapes; output {list(out.shape)} written contiguous"]
    if n >= 2**31:
        items.append("64-bit indexing (numel >= 2^31)")
    if group.kind == "pointwise":
        items.append("float4 path only when numel % 4 == 0 and all full operands 16-byte aligned")
    if group.kind == "attention":
        items.append("scores in registers, online softmax; keys in tiles of 32 through shared memory")
    if group.kind == "gemm":
        items.append("cuBLAS in true FP32 (CUBLAS_DEFAULT_MATH, no TF32) on PyTorch's stream")
    if group.kind == "conv":
        items.append(
            "cuDNN in FP32 math (forward or transposed, any groups), then one bias/epilogue "
            "kernel; fallback: im2col + cuBLAS SGEMM per group (stride-1 transposed convs as "
            "the convolution with a flipped weight, other transposed ones as SGEMM + col2im) "
            "or a direct kernel"
        )
    if group.kind in ("reduction", "norm", "softmax"):
        items.append("accumulate in float32 with warp shuffles, shared memory across warps")
    if group.kind == "pool":
        items.append("one thread per output, the window read in a loop; float32 accumulation")
    if group.kind == "scan" and ir.node(group.anchor or group.output).op.startswith("sort_"):
        items.append("bitonic sort per line in shared memory, a block per line, NaN last")
    elif group.kind == "scan" and ir.node(group.anchor or group.output).op.startswith("topk_"):
        items.append("radix select of the k-th key per line, the k sorted in shared memory")
    elif group.kind == "scan":
        items.append("sequential float32 scan per line: a thread per line, or a warp per line")
    if group.kind == "scatter":
        items.append("input copied, then a thread per source element: atomicAdd or a store")
    if group.kind == "rnn":
        items.append(
            "per layer and direction: the input projection of all time steps in one cuBLAS SGEMM, "
            "then every step in one kernel where W_hh fits in a block's registers, else per step "
            "an SGEMM of the hidden state and one gate kernel (state in place)"
        )
    return items


def _fusion_text(ir: ProgramIR, group: Group) -> str:
    parts: list[str] = []
    if group.anchor:
        anchor = ir.node(group.anchor)
        parts.append(f"anchor {anchor.op} ({group.anchor})")
        if group.siblings:
            parts.append("siblings in the same pass " + ", ".join(
                f"{ir.node(m).op} ({m})" for m in group.siblings))
        if group.prologue:
            parts.append("prologue " + ", ".join(ir.node(m).op for m in group.prologue))
        if group.epilogue:
            parts.append("epilogue " + ", ".join(ir.node(m).op for m in group.epilogue))
        if group.kind == "gemm" and _bias_in_library(ir, group):
            parts.append("cuBLASLt's epilogue adds the bias" + (" and the ReLU" if group.epilogue
                         else "") + " as it stores the product (a following kernel if tuned off)")
        elif group.kind == "gemm" and epilogue_kernel_follows(ir, group):
            parts.append("cuBLAS writes the product; bias and epilogue run in one following kernel")
        elif group.kind == "gemm":
            parts.append("cuBLAS writes the result")
    else:
        parts.append(
            f"{len(group.members)} pointwise op(s) in one grid-stride kernel: "
            + ", ".join(ir.node(m).op for m in group.members)
        )
    return "; ".join(parts)


def _hotspot_score(ir: ProgramIR, group: Group, hotspots: list[Hotspot]) -> float:
    ops = {ir.node(m).op for m in group.members}
    score = 0.0
    for h in hotspots:
        name = h.op.split("::")[-1].split(".")[0].lstrip("_")
        aliases = {name, {"addmm": "linear", "mm": "matmul", "bmm": "matmul"}.get(name, name)}
        if "convolution" in name:
            aliases |= {op for op in ops if op.startswith("conv")}
        if ops & aliases:
            score += h.cuda_time_us or h.share
    return score


def plan_program(ir: ProgramIR, *, hotspots: list[Hotspot] = ()) -> Plan:  # type: ignore[assignment]
    """Schedule the program and write the Planner's ``Plan``.

    Args:
        ir: The captured program.
        hotspots: The reference timeline; when given, items are ordered most expensive first,
            else in program order.

    Returns:
        One ``TodoItem`` per group (``ops`` lists the IR node names it covers), the host plan
        and the ops left to PyTorch.
    """
    hotspots = list(hotspots)
    groups = schedule_program(ir)
    items: list[TodoItem] = []
    estimates: list[float] = []
    for group in groups:
        shapes: dict[str, list[int]] = {}
        for name in group.members:
            node = ir.node(name)
            for ref in node.tensor_refs():
                shapes.setdefault(ref.name, list(ir.shapes[ref]))
        shapes[group.output] = list(ir.node(group.output).shape)
        estimates.append(estimate_us(ir, group))
        items.append(
            TodoItem(
                id=group.id,
                kernel=_kernel_name(ir, group),
                ops=group.members,
                shapes=shapes,
                fusion=_fusion_text(ir, group),
                constraints=_constraints(ir, group),
                kind=_ITEM_KIND[group.kind],  # type: ignore[arg-type]
                stages=[s.anchors for s in stages(group)] if group.before else [],
                note=f"estimated {estimates[-1]:.1f} us",
            )
        )
    if hotspots:
        scores = {g.id: _hotspot_score(ir, g, hotspots) for g in groups}
        position = {g.id: i for i, g in enumerate(groups)}
        items.sort(key=lambda item: (-scores[item.id], position[item.id]))
    unsupported: list[str] = []
    for node in ir.nodes:
        kind, reason = node_kind(ir, node)
        if kind == "unsupported" and reason not in unsupported:
            unsupported.append(reason)
    launches = len(groups) + sum(1 for g in groups if g.kind == "gemm" and len(g.members) > 1)
    launches += sum(_rnn_launches(ir, g) for g in groups if g.kind == "rnn")
    total_us = sum(estimates)
    launch_bound = launches >= 3 and launches * LAUNCH_US > total_us
    host = HostPlan(
        buffer_reuse=_buffer_reuse(ir, groups),
        cuda_graph=launch_bound,
        notes=[
            f"{launches} launch(es), estimated {total_us:.1f} us of device work",
            "launch-bound: capture the forward in a CUDA graph"
            if launch_bound
            else "not launch-bound: plain launches on PyTorch's current stream",
            "views run on the host; outputs are fresh torch.empty buffers",
        ],
    )
    summary = f"{ir.task.name}: {len(ir.nodes)} op(s) -> {len(groups)} kernel item(s)" + (
        f", {len(unsupported)} op(s) left to PyTorch" if unsupported else ""
    )
    return Plan(
        summary=summary,
        items=items,
        host=host,
        unsupported_ops=unsupported,
        hotspots=hotspots,
        exact_order=ir.exact_order,
    )


def _rnn_launches(ir: ProgramIR, group: Group) -> int:
    """Kernel launches and GEMMs of an LSTM/GRU group, per layer and direction: the input
    projection and one kernel for every step where W_hh fits in registers, else two a step."""
    node = ir.node(group.anchor or "")
    shape = ir.shapes[node.args["input"]]
    steps, batch = (shape[1], shape[0]) if node.args.get("batch_first") else shape[:2]
    layers = int(node.args["num_layers"]) * (2 if node.args.get("bidirectional") else 1)
    gates_h, hidden = ir.shapes[node.args["params"][1]]
    if persistent_fit(gates_h // hidden, hidden, batch, 0) is not None:
        return layers * 2
    return layers * (2 * steps + 2)


def _buffer_reuse(ir: ProgramIR, groups: list[Group]) -> list[str]:
    """Intermediate buffers whose memory a later same-sized buffer can take over."""
    users = ir.users()
    position = {g.output: i for i, g in enumerate(groups)}
    last_use: dict[str, int] = {}
    member_group = {m: i for i, g in enumerate(groups) for m in g.members}
    for g in groups:
        last = max((member_group.get(u, len(groups)) for u in users[g.output]), default=0)
        last_use[g.output] = last
    notes: list[str] = []
    free: list[tuple[int, str]] = []
    for g in groups:
        i = position[g.output]
        size = numel(ir.node(g.output).shape)
        match = next((f for f in free if f[0] == size and last_use[f[1]] < i), None)
        if match and "output" not in users[g.output]:
            notes.append(f"{g.id} output can reuse the buffer of {match[1]} ({size} floats)")
            free.remove(match)
        if "output" not in users[g.output]:
            free.append((size, g.output))
    return notes


def groups_from_plan(ir: ProgramIR, plan: Plan) -> list[Group]:
    """Rebuild the groups a plan's items describe (items are the source of truth).

    Raises:
        ValueError: An item names a node the program does not have.
    """
    order = {n.name: i for i, n in enumerate(ir.nodes)}
    groups: list[Group] = []
    for item in plan.items:
        missing = [m for m in item.ops if m not in order]
        if missing:
            msg = f"plan item {item.id} names unknown nodes {missing}; re-plan from this program"
            raise ValueError(msg)
        members = sorted(item.ops, key=order.__getitem__)
        kinds = {m: node_kind(ir, ir.node(m))[0] for m in members}
        anchors = [m for m in members if kinds[m] != "pointwise"]
        attention = attention_group(ir, item.id, members) if len(anchors) > 1 else None
        if attention is not None:
            groups.append(attention)
            continue
        if not anchors:
            groups.append(Group(item.id, "pointwise", None, [], members, members[-1]))
            continue
        staged = (
            staged_group(ir, item.id, members, anchors, is_view(ir), item.stages)
            if len(anchors) > 1 and {kinds[a] for a in anchors} == {"reduction"}
            else None
        )
        if staged is not None:  # an anchor reads another's result: stages of one kernel
            groups.append(staged)
            continue
        # further reductions are siblings when no anchor reads another: the same pass
        siblings = anchors[1:] if {kinds[a] for a in anchors} == {"reduction"} else []
        before = _read_inside(ir, [anchors[0], *siblings], set(members))
        if before & {anchors[0], *siblings}:
            siblings = []
            before = _read_inside(ir, anchors[:1], set(members))
        # the prologue is what the anchors read through members; a member computed earlier
        # that only the epilogue uses (cross entropy's smoothing term from the row's lse) is
        # epilogue too
        skip = {anchors[0], *siblings}
        groups.append(
            Group(
                item.id,
                kinds[anchors[0]],  # type: ignore[arg-type]
                anchors[0],
                [m for m in members if m in before],
                [m for m in members if m not in before and m not in skip],
                members[-1],
                siblings,
            )
        )
    groups.sort(key=lambda g: order[g.output])
    return groups


def is_view(ir: ProgramIR) -> Callable[[OpNode], bool]:
    """Whether a node of ``ir`` is a view (host-side, in no kernel)."""
    return lambda node: node_kind(ir, node)[0] == "view"

