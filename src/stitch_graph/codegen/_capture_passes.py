"""Passes over the lowered IR: drop the nodes nothing reads and the reductions over dims of
one element (the value itself), give the kernels that need
contiguous operands a copy of each strided view they read (and a reshape the same, unless its
input's strides already allow it as a view), then take the bias off library convolutions and
linears whose result only feeds a row kernel.

They run once the whole graph is lowered: they need every node's users and every operand's
final layout.
"""

from __future__ import annotations

import importlib
import operator
from typing import Any

import torch

from stitch_graph.codegen._capture_base import _meta, _read_instead, _to_meta
from stitch_graph.codegen._capture_guards import GUARD_OP
from stitch_graph.codegen.ir import (
    OpNode,
    ProgramIR,
    Ref,
    contiguous_strides,
    gemm_loop_dim,
    matrix_layout,
    numel,
)
from stitch_graph.codegen.ops import INDEXED, LOADS_THROUGH_PROLOGUE, lookup


def _eliminate_dead(ir: ProgramIR) -> None:
    """Drop nodes nothing reads (e.g. the tuple-valued ``max`` once its getitems are lowered),
    but never a guard (it is read by the host's check)."""
    guards = {n.name for n in ir.nodes if n.op == GUARD_OP}
    while True:
        users = ir.users()
        dead = {n for n, u in users.items() if not u and n not in guards}
        if not dead:
            return
        ir.nodes = [n for n in ir.nodes if n.name not in dead]


_NEEDS_CONTIGUOUS = ("reduction", "norm", "softmax", "conv", "pool", "scan", "rnn")
_RESHAPES = ("view", "flatten", "unflatten", "view_as")  # reshape is an alias of view


_IDENTITY_OVER_ONE = frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "logsumexp"})


def _drop_unit_reductions(ir: ProgramIR) -> None:
    """A reduction whose dims all hold one element is its input, reshaped: a view, no kernel
    (KernelBench L2 18 takes a max, a mean and two logsumexps of (B, 1) over dim 1). One that
    is a program output stays: it is written anyway, and a program is a kernel at least."""
    outputs = {r.name for r in ir.outputs if r.kind == "node"}
    for node in ir.nodes:
        src = node.args.get("input")
        if node.op not in _IDENTITY_OVER_ONE or not isinstance(src, Ref) or node.name in outputs:
            continue
        shape, dim = ir.shapes[src], node.args.get("dim")
        if dim is None or node.args.get("dtype") is not None or ir.dtypes[src] != node.dtype:
            continue
        dims = dim if isinstance(dim, list | tuple) else [dim]
        if not shape or not all(isinstance(d, int) and shape[d % len(shape)] == 1 for d in dims):
            continue
        meta = _meta(ir, src).view(node.shape)
        node.op, node.args = "view", {"input": src, "shape": list(node.shape)}
        node.call, node.call_args, node.call_kwargs = ".view", [src, *node.shape], {}
        node.attrs.pop("tuple_element", None)
        ir.strides[Ref("node", node.name)] = tuple(meta.stride())


_RESHAPING = frozenset(
    {"view", "view_as", "flatten", "unflatten", "squeeze", "unsqueeze", "expand", "expand_as"}
)


def _drop_identity_views(ir: ProgramIR) -> None:
    """A reshape to the shape and strides its input has (``idx.view(b, -1)`` of a (b, n)
    index, ``y.view_as(x)`` of a y shaped as x) is its input: its readers read that, and a
    gather or an index read through it fuses with them as it would without it."""
    outputs = {r.name for r in ir.outputs if r.kind == "node"}
    swap: dict[Ref, Ref] = {}
    for node in ir.nodes:
        src = node.args.get("input")
        if node.op not in _RESHAPING or not isinstance(src, Ref) or node.name in outputs:
            continue
        ref = Ref("node", node.name)
        same = ir.shapes[src] == ir.shapes[ref] and ir.strides[src] == ir.strides[ref]
        if same and ir.dtypes[src] == ir.dtypes[ref]:
            swap[ref] = swap.get(src, src)
    if swap:
        _read_instead(ir, swap)


def _insert_copies(ir: ProgramIR) -> None:
    """Give anchors that read strided views a contiguous copy (a pointwise ``copy`` node), and
    reshapes of strided tensors too unless the strides allow the reshape as a view; then
    re-derive the strides of the views that now stand on a copy."""
    new_nodes: list[OpNode] = []
    for node in ir.nodes:
        info = lookup(node.op)
        keys: tuple[str, ...] = ()
        if _loops_instead(ir, node):
            new_nodes.append(node)
            continue
        if info is not None and info.kind == "conv":
            keys = ("input", "weight", "bias")  # a weight viewed (expanded, permuted) too
        elif info is not None and (info.kind in _NEEDS_CONTIGUOUS or node.op in _RESHAPES):
            keys = ("input",)
        elif info is not None and info.kind == "gemm":
            gemm_keys = {"addmm": ("mat1", "mat2"), "linear": ("input", "weight")}
            keys = gemm_keys.get(node.op, ("input", "other"))
        for key in keys:
            src = node.args.get(key)
            needs = isinstance(src, Ref) and src.kind == "node" and not ir.is_contiguous(src)
            if needs and info.kind == "gemm" and (node.op != "linear" or key == "input"):
                # cuBLAS reads a transposed or strided matrix as it is (a linear over the
                # tokens of (B, T, C) transposed: one batched GEMM, no copy first)
                needs = matrix_layout(ir.shapes[src], ir.strides[src]) is None
            elif needs and node.op == "linear":  # a weight's rows may lie apart
                needs = len(ir.shapes[src]) != 2 or ir.strides[src][1] != 1
            if needs and node.op in _RESHAPES:
                needs = not _views_in_place(ir, src, node.shape)
            shape = ir.shapes[src] if isinstance(src, Ref) else ()
            gemm = info is not None and info.kind == "gemm"
            grown = _batch_broadcast(node, shape) if gemm else None
            if needs or grown:
                shape = grown or shape
                # left to PyTorch, the copy must still have the broadcast shape
                call = f".expand({', '.join(map(str, shape))}).contiguous" if grown else ".contiguous"
                ref = _contiguous_copy(ir, f"{node.name}_{key}", src, shape, call, new_nodes)
                node.args = {**node.args, key: ref}
                node.call_args = [ref if a == src else a for a in node.call_args]
        hx = node.args.get("hx")
        if info is not None and info.kind == "rnn" and hx is not None:
            listed = isinstance(hx, list | tuple)
            states = [  # a state given transposed or sliced (an LSTM's is a pair)
                _contiguous_copy(ir, f"{node.name}_hx{k}", h, ir.shapes[h], ".contiguous", new_nodes)
                if isinstance(h, Ref) and h.kind == "node" and not ir.is_contiguous(h) else h
                for k, h in enumerate(hx if listed else [hx])
            ]
            node.args = {**node.args, "hx": states if listed else states[0]}
        new_nodes.append(node)
    ir.nodes = new_nodes
    _relayout_views(ir)


def _contiguous_copy(
    ir: ProgramIR, name: str, src: Ref, shape: tuple[int, ...], call: str, new_nodes: list[OpNode]
) -> Ref:
    """A contiguous copy of ``src`` (a pointwise ``copy`` node) appended to ``new_nodes``."""
    new_nodes.append(OpNode(name, "copy", {"input": src}, shape, ir.dtypes[src], call, [src]))
    ref = Ref("node", name)
    ir.shapes[ref] = shape
    ir.strides[ref] = contiguous_strides(shape)
    ir.dtypes[ref] = ir.dtypes[src]
    return ref


# FLOPs each call of a looped product does at least. Against copying q, k and v first (H100,
# results/h100-2026-12-06e): MinGPT's and MiniGPT's 8 heads (6.4 GFLOP a call) 1.03x and 1.01x;
# L3 50's 12 heads (2.1 GFLOP a call) 0.925x; Swin's 3 windowed heads (0.16 GFLOP) 0.75x
_LOOPED_FLOPS = 4e9


def _loops_instead(ir: ProgramIR, node: OpNode) -> bool:
    """Whether a batched product reads its strided operands as they lie, one GEMM call for
    each index of a batch dim (``ir.gemm_loop_dim``), instead of copies of them: only where
    each call is large enough (``_LOOPED_FLOPS``) that a few more launches cost nothing."""
    o = gemm_loop_dim(ir, node)
    if o is None:
        return False
    shape = node.shape
    depth = ir.shapes[node.args["input"]][-1]
    flops = 2 * numel(shape) * depth // shape[o]
    return flops >= _LOOPED_FLOPS


def _batch_broadcast(node: OpNode, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape a batched GEMM operand is copied to when its batch dims broadcast against
    the other's only in part, (2, 1, M, K) against (3, K, N), which no single batch stride of
    a strided-batched GEMM can read; ``None`` when it is read as it lies (batch dims all ones,
    or the result's)."""
    if node.op in ("linear", "addmm") or len(shape) < 2 or len(node.shape) < 2:
        return None
    batch = tuple(node.shape[:-2])
    own = (1,) * (len(batch) - len(shape[:-2])) + tuple(shape[:-2])
    if all(d == 1 for d in own) or own == batch:
        return None
    return (*batch, *shape[-2:])


def _feeds_one_row_kernel(ir: ProgramIR, node: OpNode, users: dict[str, list[str]]) -> bool:
    """Whether ``node``'s value reaches exactly one reduction, norm, softmax, pool or scan as
    its input, through same-shape pointwise ops that nothing else reads."""
    outputs = {r.name for r in ir.outputs if r.kind == "node"}
    name = node.name
    while len(users.get(name, [])) == 1 and name not in outputs:
        reader = ir.node(users[name][0])
        info = lookup(reader.op)
        if info is None:
            return False
        if info.kind == "pointwise" and reader.op not in INDEXED and reader.shape == node.shape:
            name = reader.name
            continue
        return (
            info.kind in LOADS_THROUGH_PROLOGUE
            and reader.args.get("input") == Ref("node", name)
            and ir.shapes.get(Ref("node", name)) == node.shape
        )
    return False


def _split_library_bias(ir: ProgramIR) -> None:
    """Compute the bias of a convolution or ``linear`` as a pointwise add after the library call
    when the result feeds one row kernel (``conv -> softmax``, ``linear -> group_norm``).

    The scheduler hands an anchor's pointwise epilogue to such a consumer as its prologue
    (computed on load), so the library writes its result once and nothing re-reads it to add
    the bias: one pass through memory and one launch fewer. The add takes the node's name, so
    every reader is unchanged; the library call becomes ``<name>_nobias``.
    """
    users = ir.users()
    new_nodes: list[OpNode] = []
    for node in ir.nodes:
        info = lookup(node.op)
        bias = node.args.get("bias")
        library = info is not None and (info.kind == "conv" or node.op == "linear")
        if not (library and isinstance(bias, Ref) and node.dtype == "float32"):
            new_nodes.append(node)
            continue
        if len(node.shape) < 2 or not _feeds_one_row_kernel(ir, node, users):
            new_nodes.append(node)
            continue
        raw = Ref("node", f"{node.name}_nobias")
        ir.shapes[raw] = node.shape
        ir.strides[raw] = contiguous_strides(node.shape)
        ir.dtypes[raw] = node.dtype
        new_nodes.append(
            OpNode(
                raw.name,
                node.op,
                {**node.args, "bias": None},
                node.shape,
                node.dtype,
                node.call,
                [None if a == bias else a for a in node.call_args],
                {k: None if v == bias else v for k, v in node.call_kwargs.items()},
                dict(node.attrs),
            )
        )
        addend = bias
        if info.kind == "conv":  # per channel (dim 1), as ``bias.view(C, 1, ...)`` would read it
            addend = Ref("node", f"{node.name}_bias")
            per_channel = (node.shape[1],) + (1,) * (len(node.shape) - 2)
            ir.shapes[addend] = per_channel
            ir.strides[addend] = contiguous_strides(per_channel)
            ir.dtypes[addend] = ir.dtypes.get(bias, "float32")
            new_nodes.append(
                OpNode(
                    addend.name,
                    "view",
                    {"input": bias, "shape": list(per_channel)},
                    per_channel,
                    ir.dtypes[addend],
                    ".view",
                    [bias, *per_channel],
                )
            )
        new_nodes.append(
            OpNode(
                node.name,
                "add",
                {"input": raw, "other": addend, "alpha": 1},
                node.shape,
                node.dtype,
                "operator.add",
                [raw, addend],
            )
        )
    ir.nodes = new_nodes


def _views_in_place(ir: ProgramIR, src: Ref, shape: tuple[int, ...]) -> bool:
    """Whether the strided ``src`` takes ``shape`` as a view, with no copy (attention's
    ``q.view(B, T, heads, dim)`` of a column slice does: only the last dimension splits)."""
    dtype = getattr(torch, ir.dtypes.get(src, "float32"), torch.float32)
    strided = torch.empty_strided(ir.shapes[src], ir.strides[src], dtype=dtype, device="meta")
    try:
        strided.view(shape)
    except RuntimeError:
        return False
    return True


def _relayout_views(ir: ProgramIR) -> None:
    """Replay every view on meta tensors of its operands' current layouts.

    A view of a strided tensor keeps the traced strides; once its input is a contiguous copy, the
    host applies the same view to the copy and gets other strides, which every kernel that reads
    the view (and every view of it) must use.
    """
    metas: dict[Ref, Any] = {}

    def meta(ref: Ref) -> Any:
        if ref not in metas:
            dtype = getattr(torch, ir.dtypes.get(ref, "float32"), torch.float32)
            shape = ir.shapes[ref]
            metas[ref] = torch.empty_strided(
                shape, ir.strides.get(ref, contiguous_strides(shape)), dtype=dtype, device="meta"
            )
        return metas[ref]

    for node in ir.nodes:
        info = lookup(node.op)
        if info is None or info.kind != "view":
            continue
        refs = [a for a in _flat(node.call_args) if isinstance(a, Ref) and a in ir.shapes]
        try:
            args = _to_meta(node.call_args, {r: meta(r) for r in refs})
            kwargs = _to_meta(node.call_kwargs, {r: meta(r) for r in refs})
            value = _call(node.call)(*args, **kwargs)
        except Exception:  # noqa: BLE001 - a view that cannot be replayed keeps its layout
            continue
        ref = Ref("node", node.name)
        if torch.is_tensor(value) and tuple(value.shape) == ir.shapes.get(ref):
            ir.strides[ref] = tuple(value.stride())
            metas[ref] = value
        elif isinstance(value, tuple) and all(torch.is_tensor(v) for v in value):
            metas[ref] = value  # chunk's, split's: their elements are read by getitem


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def _call(call: str) -> Any:
    """The callable a view node's ``call`` names (``.view``, ``operator.getitem``, ``torch.x``)."""
    if call.startswith("."):
        method = call[1:]
        return lambda self, *a, **k: getattr(self, method)(*a, **k)
    if call == "operator.getitem":
        return operator.getitem
    module, _, name = call.rpartition(".")
    return getattr(importlib.import_module(module), name)
