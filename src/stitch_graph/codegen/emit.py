"""Emission: CUDA kernels and ``ModelNew`` host code for the items of a plan.

This module only emits; every decision about what to fuse was taken by the scheduler (and is in
the plan's items), every knob comes from ``Tuning``. Kernel styles: grid-stride pointwise kernels
with ``__restrict__`` pointers and a float4 twin chosen at run time when all full-size operands are
16-byte aligned; reductions with one thread, warp or block per row (or two stages when rows are few
and long); softmax/log-softmax and layer/group/batch/instance/RMS norms (fused affine) with the
row held in registers (float4 twin; one read, one write) when it fits, else a statistics pass
(online max+sum, Welford) then a write pass that reads the row again; convolutions as im2col by
chunks of images + cuBLAS SGEMM (one per group when grouped) + one bias/epilogue kernel, else
direct with the epilogue fused (1-D, 2-D and 3-D); transposed convolutions with stride 1 as the
equivalent convolution (weight transposed and flipped by a small kernel at each call), others
(groups=1) as cuBLAS SGEMM into a column buffer + a col2im gather that fuses bias and epilogue,
else a direct gather kernel; pooling (max, average, adaptive) as a pointwise kernel whose anchor
value loops over the window, or staged a window row at a time in shared memory; scans (cumsum,
cumprod, logcumsumexp) with a thread per line or a warp per line (shuffle scan plus carry);
sorts (sort, argsort, topk, kthvalue, median, quantile) as a bitonic sort a block per line;
scatters (scatter_add, index_add, scatter of a value) as a copy of the input, then atomic adds
or stores;
ops that read other positions (cat, stack, flip, gather, index, roll,
pad, triu/tril) as pointwise expressions with their own indexing; GEMMs through cuBLAS (true FP32)
followed by one epilogue kernel. Items not yet generated, or whose emission fails, run in PyTorch
inside ``forward`` and are declared in ``Candidate.declared_torch_ops``.

Layout: the kernel styles live in private modules, one concern each: ``_emit_base`` (constants,
``EmitError``, the expression and pointwise core ``_EmitterBase``), ``_emit_reduce``
(reductions), ``_emit_softmax_norm`` (softmax and normalisations), ``_emit_conv``
(convolutions), ``_emit_pool_scan`` (pooling and scans), ``_emit_sort`` (sorts),
``_emit_scatter`` (scatters) and ``_emit_gemm`` (GEMMs).
``_cat_slices`` finds the concatenations whose operands' kernels can store into them, and
``_kernel_merge`` builds kernels that differ only in their names once. This module assembles
``_Emitter`` from the mixins and renders the ``ModelNew`` host code.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from stitch_graph.artifacts import Candidate, Plan
from stitch_graph.codegen._capture_guards import GUARD_OP
from stitch_graph.codegen._cat_slices import cat_slices, copied_slices, slices_of
from stitch_graph.codegen._cuda import PRELUDE
from stitch_graph.codegen._emit_attention import _AttentionEmitter
from stitch_graph.codegen._emit_base import EmitError, _py
from stitch_graph.codegen._emit_conv import _ConvEmitter
from stitch_graph.codegen._emit_gemm import _GemmEmitter
from stitch_graph.codegen._emit_pool_scan import _PoolScanEmitter
from stitch_graph.codegen._emit_reduce import _ReduceEmitter
from stitch_graph.codegen._emit_region import _RegionEmitter, writes_in_place
from stitch_graph.codegen._emit_rnn import _RnnEmitter
from stitch_graph.codegen._emit_row_stages import _RowStagesEmitter
from stitch_graph.codegen._emit_scatter import _ScatterEmitter
from stitch_graph.codegen._emit_softmax_norm import _SoftmaxNormEmitter
from stitch_graph.codegen._fusion_attention import runs_fused
from stitch_graph.codegen._fusion_attention import split as split_attention
from stitch_graph.codegen._fusion_passes import read_through
from stitch_graph.codegen._kernel_merge import merge_identical, relaunch
from stitch_graph.codegen.ir import Group, OpNode, ProgramIR, Ref, contiguous_strides
from stitch_graph.codegen.schedule import _read_inside, groups_from_plan, node_kind
from stitch_graph.codegen.tuning import KernelTuning, Tuning

__all__ = ["EmitError", "emit_candidate"]


# Group kind -> the name of the ``_Emitter`` method that writes its kernels (looked up on the
# instance, so overrides apply); a new kind is one entry here.
_STYLES: dict[str, str] = {
    "pointwise": "pointwise_group",
    "reduction": "reduction",
    "norm": "row_op",
    "softmax": "row_op",
    "conv": "conv",
    "gemm": "gemm",
    "pool": "pool",
    "scan": "scan",
    "rnn": "rnn",
    "scatter": "scatter",
    "attention": "attention",
}


class _Emitter(
    _ReduceEmitter,
    _RowStagesEmitter,
    _SoftmaxNormEmitter,
    _ConvEmitter,
    _PoolScanEmitter,
    _GemmEmitter,
    _RnnEmitter,
    _ScatterEmitter,
    _RegionEmitter,
    _AttentionEmitter,
):
    """The emitter of a program: the expression/pointwise core plus one mixin per kernel
    style; ``emit`` dispatches a group to its style through ``_STYLES``."""

    def emit(self, part: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Kernels for one group (kept in ``self.kernels``); returns the host lines."""
        style = "staged_reduction" if part.before is not None else _STYLES.get(part.kind)
        if style is None:
            msg = f"{part.id}: no emitter for {part.kind} groups"
            raise EmitError(msg)
        return getattr(self, style)(part, kernel, tun)

    def pointwise_group(self, part: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """A fused pointwise group: its members are all in the epilogue, computed per element
        (an assignment's region alone, where it may write its input in place)."""
        out = self.ir.node(part.output)
        base = out.args.get("input")
        sliced = {out.name, getattr(base, "name", None)} & set(self.cat_slices)
        if out.op == "setitem" and not sliced and writes_in_place(self.ir, out, part.epilogue):
            return self.region_write(part, kernel, tun, out)
        return self.pointwise(part.id, kernel, part.epilogue, out, tun)


_HOST_HEADER = '''"""ModelNew generated by stitch_graph.codegen for {task!r} ({n_items} item(s)).

Kernels come from the global KERNELS (NVRTC-built from kernel_source); GEMMs call cuBLAS in true
FP32 on PyTorch's current stream. {declared}
"""

import torch
import torch.nn as nn


def _get(module, name):
    """A parameter or buffer by dotted name."""
    for part in name.split("."):
        module = getattr(module, part)
    return module


def _aligned(*tensors):
    """Whether every tensor starts on a 16-byte boundary (float4 loads and stores)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _sgemm(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch, algo=0, bias=None,
           relu=False):
    """Column-major C = op(A) op(B) through cuBLAS on PyTorch's stream, true FP32 (no TF32);
    algo N > 0: cuBLASLt's N-th ranked algorithm, chosen by timing; bias (one value a row of
    C) and relu: added and applied by cuBLASLt's epilogue as C is stored (then algo N is its
    (N+1)-th)."""
    KERNELS.sgemm(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch, algo, bias, relu)


_PARAMS = {params}


class ModelNew(nn.Module):
    """Same parameters and buffers (dotted names, shapes) as the reference Model."""

    def __init__(self, *init_args):
        super().__init__()
        for name, shape, dtype, buffer, persistent, value in _PARAMS:
            owner = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            if value is not None:
                tensor = torch.tensor(value, dtype=dtype).reshape(shape)
            else:
                tensor = torch.zeros(shape, dtype=dtype)
            if buffer:
                owner.register_buffer(leaf, tensor, persistent=persistent)
            else:
                owner.register_parameter(leaf, nn.Parameter(tensor))

    def forward(self, {inputs}):
'''


def _render(value: Any) -> str:
    if isinstance(value, Ref):
        return _py(value)
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(_render(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return f"float({str(value)!r})"
    if isinstance(value, torch.device):
        return "_dev"  # traced on meta tensors: the device is the inputs' at run time
    if isinstance(value, slice):
        return f"slice({_render(value.start)}, {_render(value.stop)}, {_render(value.step)})"
    return repr(value)


_RNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}
"""cuDNN's mode of each recurrent op PyTorch may run (``torch.backends.cudnn.rnn``)."""


def _rnn_line(ir: ProgramIR, node: OpNode) -> str:
    """A recurrent layer left to PyTorch (cuDNN), its weights laid out in one buffer first
    (``KERNELS.rnn_weights``)."""
    params = node.args["params"]
    has_biases = bool(node.args.get("has_biases"))
    per = 4 if has_biases else 2
    dirs = 2 if node.args.get("bidirectional") else 1
    layers = int(node.args["num_layers"])
    gates_h, input_size = ir.shapes[params[0]]
    hidden = ir.shapes[params[1]][1]
    proj = 0
    if node.op == "lstm" and len(params) == (per + 1) * dirs * layers:
        proj, hidden = ir.shapes[params[per]]  # weight_hr: (proj_size, hidden)
    elif len(params) != per * dirs * layers or gates_h % hidden:
        return _torch_line(node)  # another layout: PyTorch's own handling
    flat = (
        f"KERNELS.rnn_weights({_render(list(params))}, {_RNN_MODES[node.op]}, {input_size}, "
        f"{hidden}, {layers}, {bool(node.args.get('batch_first'))}, "
        f"{bool(node.args.get('bidirectional'))}, {has_biases}" + (f", {proj})" if proj else ")")
    )
    args = [_render(a) for a in node.call_args]
    args[2] = flat
    return f"{node.name} = {node.call}({', '.join(args)})"


def _index_put_line(node: OpNode) -> str:
    """``index_put`` on a copy. ``Tensor.index_put_`` refuses a ``None`` index (a full slice,
    as the exported ``y[:, :, cols] = v`` has it): basic indexing assigns that one."""
    base, indices, values, *rest = node.call_args
    accumulate = bool(rest[0] if rest else node.call_kwargs.get("accumulate", False))
    name, indices = node.name, list(indices)
    copy = f"{name} = {_render(base)}.clone(); "
    if None in indices and not accumulate:
        index = tuple(slice(None) if i is None else i for i in indices)
        return f"{copy}{name}[{_render(index)}] = {_render(values)}"
    return f"{copy}{name}.index_put_({_render(tuple(indices))}, {_render(values)}, {accumulate})"


def _torch_line(node: OpNode) -> str:
    if node.op == "setitem":  # y[index] = value on a copy: the node is a new tensor
        base, index, value = (_render(a) for a in node.call_args)
        return f"{node.name} = {base}.clone(); {node.name}[{index}] = {value}"
    if node.op == "index_put":
        return _index_put_line(node)
    args = [_render(a) for a in node.call_args]
    kwargs = [f"{k}={_render(v)}" for k, v in node.call_kwargs.items()]
    if node.call.startswith("."):
        # an in-place method left to PyTorch writes a copy: its operand may be the caller's
        # input or a value other kernels read (later reads take this node's result)
        inplace = node.call.endswith("_") and not node.call.endswith("__")
        target = f"{args[0]}{'.clone()' if inplace else ''}{node.call}"
        rest = ", ".join(args[1:] + kwargs)
    else:
        target = node.call
        rest = ", ".join(args + kwargs)
    if node.call == "operator.getitem" and len(node.call_args) == 2 and not kwargs and _basic(
        node.call_args[1]
    ):
        return f"{node.name} = {args[0]}[{_subscript(node.call_args[1])}]"
    imports = "import operator; " if node.call.startswith("operator.") else ""
    element = node.attrs.get("tuple_element")
    picked = "" if element is None else f"[{element}]"
    return f"{imports}{node.name} = {target}({rest}){picked}"


def _basic(index: Any) -> bool:
    """Whether an index is a view's (ints, slices, ``None``, ``...``): lists and tensors
    gather a copy, which PyTorch's own call spells out."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, int | slice) for p in parts)


def _subscript(index: Any) -> str:
    """A view's index as written between brackets: ``x[:, 1:, ::2]`` rather than
    ``operator.getitem(x, (slice(None, None, None), ...))``."""

    def part(value: Any) -> str:
        if not isinstance(value, slice):
            return "..." if value is Ellipsis else _render(value)
        bounds = ["" if v is None else _render(v) for v in (value.start, value.stop)]
        return ":".join(bounds) + ("" if value.step is None else f":{_render(value.step)}")

    if isinstance(index, tuple) and index:
        return ", ".join(part(v) for v in index) + ("," if len(index) == 1 else "")
    return part(index)


def _dense_element_of_torch_tuple(ir: ProgramIR, node: OpNode, covered: dict[str, str]) -> bool:
    """Whether ``node`` picks a tensor out of the tuple an op left to PyTorch returns, where
    kernels read it as dense. PyTorch's element need not be (``nn.LSTM(batch_first=True)``
    returns its output transposed); ``.contiguous()`` costs nothing when it already is."""
    if node.op != "getitem" or len(node.call_args) != 2 or not isinstance(node.call_args[1], int):
        return False  # a slice of the tuple (``parts[:1]``) is a tuple
    source = node.call_args[0]
    ref = Ref("node", node.name)
    return (
        isinstance(source, Ref)
        and source.kind == "node"
        and source.name not in covered
        and ref in ir.shapes
        and ir.shapes[ref] is not None
        and tuple(ir.strides.get(ref, ())) == contiguous_strides(tuple(ir.shapes[ref]))
    )


def _assigned(lines: list[str]) -> set[str]:
    """The names the host lines assign."""
    found: set[str] = set()
    for line in lines:
        m = _ASSIGNED.match(line)
        if m:
            found.update(name.strip() for name in m.group(1).split(","))
    return found


_ASSIGNED = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=(?!=)")


def _split_unfused(ir: ProgramIR, g: Group) -> list[Group]:
    """Un-fuse an anchored group: prologue and epilogue become pointwise kernels of their own,
    and each sibling reduction a kernel of its own (with its own prologue)."""
    if g.anchor is None:
        return [g]
    if g.kind == "attention":  # the three kernels it replaced, each fused as it was
        return split_attention(ir, g)
    parts = _split_unfused(ir, g.before) if g.before is not None else []
    for n, anchor in enumerate(g.anchors):
        part = f"{g.id}s{n}" if n else g.id
        read = _read_inside(ir, [anchor], set(g.prologue))
        chain = [m for m in g.prologue if m in read]
        if chain:
            parts.append(Group(f"{part}p", "pointwise", None, [], chain, chain[-1]))
        parts.append(Group(part, g.kind, anchor, [], [], anchor))
    if g.epilogue:
        parts.append(Group(f"{g.id}e", "pointwise", None, [], list(g.epilogue), g.output))
    return parts


def _emit_groups(
    ir: ProgramIR,
    groups: list[Group],
    wanted: set[str],
    tuning: Tuning,
    kernels_by_id: dict[str, str],
    cats: dict[str, list[str]],
) -> tuple[_Emitter, dict[str, list[str]], dict[str, str]]:
    """Kernels of the wanted groups; the host lines at each output node, and the nodes covered
    (each with the output node at whose lines it is computed).
    The concatenations of ``cats`` emit nothing: their operands' kernels store into them."""
    slices = {k: v for cat, ops in cats.items() for k, v in slices_of(ir, cat, ops).items()}
    emitter = _Emitter(ir, tuning, slices)
    emitter.through = read_through(ir, [g for g in groups if g.id in wanted])
    launch_at: dict[str, list[str]] = {}
    covered: dict[str, str] = {}  # node -> the output whose launch lines compute it
    for group in groups:
        if group.id not in wanted:
            continue
        if group.output in cats:
            copied = copied_slices(ir, group.output, cats[group.output])
            lines = [f"# {group.id}: written in place by its operands' kernels"]
            if copied:
                kernel = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in
                                 kernels_by_id[group.id])
                lines += emitter.copy_into_slices(kernel, copied, tuning.for_item(group.id))
            launch_at[group.output] = lines
            covered.update(dict.fromkeys(group.members, group.output))
            continue
        tun = tuning.for_item(group.id)
        parts = _split_unfused(ir, group) if not tun.fuse else [group]
        if group.kind == "attention" and tun.fuse and not runs_fused(
            ir, group, tun.fused_attention
        ):
            parts = split_attention(ir, group)
        n_kernels = len(emitter.kernels)
        emitted: list[tuple[Group, list[str]]] = []
        try:
            for part in parts:
                base = kernels_by_id[group.id]
                kernel = base + part.id.removeprefix(group.id) if part.id != group.id else base
                kernel = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in kernel)
                emitted.append((part, [f"# {part.id}: {kernel}", *emitter.emit(part, kernel, tun)]))
        except Exception as error:  # noqa: BLE001 - the item's ops stay in PyTorch, declared
            del emitter.kernels[n_kernels:]
            emitter.notes.append(f"{group.id} left to PyTorch: {type(error).__name__}: {error}")
            continue
        for part, lines in emitted:
            launch_at.setdefault(part.output, []).extend(lines)
            covered.update(dict.fromkeys(part.members, part.output))
    return emitter, launch_at, covered


def emit_candidate(
    ir: ProgramIR,
    plan: Plan,
    *,
    through: str | None = None,
    tuning: Tuning | None = None,
) -> Candidate:
    """Emit the candidate program for the plan's items.

    Args:
        ir: The captured program.
        plan: The plan; its items' ``ops`` say which nodes each kernel covers.
        through: Generate the items whose status is ``done`` plus this item; ``None``: all items.
        tuning: Kernel knobs (``None``: defaults).

    Returns:
        A candidate whose ``host_source`` defines ``ModelNew``; ops of items not generated run in
        PyTorch and are listed in ``declared_torch_ops``.

    Raises:
        EmitError: ``through`` names no item, or an item cannot be emitted.
    """
    tuning = tuning or Tuning()
    status = {item.id: item.status for item in plan.items}
    kernels_by_id = {item.id: item.kernel for item in plan.items}
    if through is not None and through not in status:
        msg = f"through={through!r} names no plan item (items: {', '.join(status)})"
        raise EmitError(msg)
    groups = groups_from_plan(ir, plan)
    wanted = {g.id for g in groups if through is None or status[g.id] == "done" or g.id == through}
    cats = cat_slices(ir, groups, wanted)
    emitter, launch_at, covered = _emit_groups(ir, groups, wanted, tuning, kernels_by_id, cats)
    # an operand whose kernel did not store in place (a library writing its own output) is
    # copied with the inputs; a concatenation none of whose kernels did: its own kernel
    done = emitter.written_in_place
    kept = {c: [o for o in ops if o in done] for c, ops in cats.items() if set(ops) & done}
    if kept != cats:
        emitter, launch_at, covered = _emit_groups(ir, groups, wanted, tuning, kernels_by_id, kept)
    body: list[str] = []
    declared: list[str] = []
    # PyTorch calls that read no tensor (a ``torch.randn`` of h0): run ahead of a CUDA graph
    # in their order, so a replay draws no numbers of its own and the draws stay eager's
    drawn: list[tuple[str, str]] = []
    inner_declared = False
    tensor_inputs = [name for name, shape in ir.inputs if shape is not None]
    device_line = f"_dev = {tensor_inputs[0]}.device" if tensor_inputs else "_dev = 'cuda'"
    body.append(device_line)
    for position in ir.task.varying_inputs:  # kernels hold one draw's sizes: refuse others
        name, shape = ir.inputs[position] if position < len(ir.inputs) else (None, None)
        if name is not None and shape is not None:
            body.append(f"if tuple({name}.shape) != {tuple(shape)}:")
            body.append(
                f"    raise ValueError(f'{name} has shape {{tuple({name}.shape)}}; this program "
                f"was generated for {tuple(shape)} (get_inputs() draws other shapes) and "
                "computes no other: generate one for these inputs')"
            )
    if tensor_inputs:  # kernels index inputs densely: a transposed one is copied (else free)
        dense = ", ".join(f"{name}.contiguous()" for name in tensor_inputs)
        body.append(f"{', '.join(tensor_inputs)} = {dense}")
    for cat in kept:  # allocated before the kernels that write into it
        shape = list(ir.node(cat).shape)
        body.append(f"{cat} = torch.empty({shape}, device=_dev, dtype=torch.float32)")
    guards: list[str] = []  # checked once every kernel is launched: one wait, at the end
    # a view of a value a later kernel makes (a reduction taken into a later one's pass) is
    # taken after that kernel's launch, and not at all where the kernel kept it in registers
    made_at = dict(covered)
    order = {n.name: i for i, n in enumerate(ir.nodes)}
    deferred: dict[str, list[tuple[OpNode, str]]] = {}
    for node in ir.nodes:
        if node.name in launch_at:
            body.extend(launch_at[node.name])
            pending = deferred.pop(node.name, [])
            stored = _assigned(body) if pending else set()
            for view, line in pending:
                if all(r.kind != "node" or r.name in stored for r in view.tensor_refs()):
                    body.append(line)
                    stored.add(view.name)
            continue
        if node.name in covered:
            continue
        if node.op == GUARD_OP:
            guards.append(_torch_line(node).split(" = ", 1)[1])
            continue
        kind, _ = node_kind(ir, node)
        rnn = node.op in _RNN_MODES and node.call == f"torch.{node.op}"
        line = _rnn_line(ir, node) if rnn else _torch_line(node)
        late = [made_at[r.name] for r in node.tensor_refs()
                if r.name in made_at and order[made_at[r.name]] > order[node.name]]
        if kind == "view" and late:
            made_at[node.name] = max(late, key=order.__getitem__)
            deferred.setdefault(made_at[node.name], []).append((node, line))
            continue
        if kind != "view" and node.attrs.get("strided_in_torch"):
            line += ".contiguous()"  # our layout for the result (PyTorch's may be permuted)
        elif _dense_element_of_torch_tuple(ir, node, covered):
            line += ".contiguous()"  # a batch-first RNN's output is a transposed view
        body.append(line)
        if kind != "view" and not node.tensor_refs():
            drawn.append((node.name, line))
        elif kind != "view":
            inner_declared = True
        if kind != "view":
            # the reference op and the PyTorch call that computes it (matmul may run as bmm)
            # and the copy an in-place call left to PyTorch writes (``_torch_line``)
            copies = ["clone"] if ".clone()" in line else []
            parts = node.call.split(".")  # torch.ops.aten.<op>.<overload>: the op, not "vec"
            called = parts[3] if parts[:3] == ["torch", "ops", "aten"] and len(parts) > 3 else parts[-1]
            for name in (node.op, called, *copies):
                if name not in declared:
                    declared.append(name)
    body.extend(guards)
    outs = [ref.name if ref.kind != "param" else _py(ref) for ref in ir.outputs]
    if ir.output_is_tuple:
        body.append(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    else:
        body.append(f"return {outs[0]}")
    params = (
        "["
        + ", ".join(
            f"({p.name!r}, {list(p.shape)!r}, torch.{p.dtype}, {p.buffer!r}, {p.persistent!r}, "
            f"{_render(p.value) if p.value is not None else None})"
            for p in ir.params
        )
        + "]"
    )
    inputs = ", ".join(name for name, _ in ir.inputs) or "*args"
    note = (
        f"Declared PyTorch ops (not yet generated): {', '.join(declared)}."
        if declared
        else "No PyTorch compute ops in forward."
    )
    header = _HOST_HEADER.format(
        task=ir.task.name, n_items=len(plan.items), declared=note, params=params, inputs=inputs
    )
    graphed = (tuning.cuda_graph if tuning.cuda_graph is not None else plan.host.cuda_graph) and (
        not inner_declared and not guards  # a replay could not check a guard
    )
    if graphed:  # launch-bound: the runtime captures _launch in a CUDA graph and replays it
        for _, line in drawn:
            body.remove(line)
        passed = ", ".join([*(n for n, _ in ir.inputs), *(n for n, _ in drawn)]) or "*args"
        ahead = [device_line, *(line for _, line in drawn)] if drawn else []
        header += "".join(f"        {line}\n" for line in ahead) + (
            f"        return KERNELS.graphed(self, self._launch, {passed})\n\n"
            f"    def _launch(self, {passed}):\n"
        )
    kernels, renamed = merge_identical(emitter.kernels)
    host = relaunch(header + "".join(f"        {line}\n" for line in body), renamed)
    kernel_source = PRELUDE + "\n\n" + "\n\n".join(kernels) + "\n"
    failed = {note.split(" ", 1)[0] for note in emitter.notes}
    generated = sorted(wanted - failed)
    return Candidate(
        kernel_source=kernel_source,
        host_source=host,
        form="nvrtc",
        link_libraries=["cublas"]
        if any(g.kind == "gemm" for g in groups if g.id in wanted)
        or any(
            line.lstrip().startswith("_sgemm(") for lines in launch_at.values() for line in lines
        )
        else [],
        declared_torch_ops=declared,
        item_id=through,
        author="rules",
        notes=(
            f"generated items: {', '.join(generated) or 'none'}; "
            f"tuning: {tuning.model_dump_json(exclude={'history'})}"
            + "".join(f"; {note}" for note in emitter.notes)
        ),
    )
