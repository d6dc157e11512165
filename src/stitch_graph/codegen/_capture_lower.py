"""Lowering: walk the shape-propagated graph and build the ``ProgramIR``.

Placeholders become inputs, attributes become parameters, buffers or baked constants, and every
call with a tensor result becomes an ``OpNode`` whose arguments are bound to the op registry's
signature names (or a few nodes, when the call is decomposed), with the shape and strides our
buffers will have. The in-place writes it meets go through the alias tracker; the finished IR goes
through the passes of ``_capture_passes``.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import operator
from dataclasses import replace
from typing import Any

import torch
import torch.fx

from stitch_graph.artifacts import Task
from stitch_graph.codegen._capture_aliases import _is_buffer_update, _mutated_arg, _Writes
from stitch_graph.codegen._capture_arrange import diagonal_mask
from stitch_graph.codegen._capture_base import (
    _MAX_BAKED,
    BAKED_PREFIX,
    CaptureError,
    _bake,
    _fetch_attr,
    _flat,
    _is_tensor_seq,
    _node_of,
    _PropagationError,
    _subst,
    _to_meta,
)
from stitch_graph.codegen._capture_batched_products import batch_shared_products
from stitch_graph.codegen._capture_broadcast_products import sum_broadcast_products_as_matmuls
from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen._capture_common import merge_common_subexpressions
from stitch_graph.codegen._capture_complex import lower_complex
from stitch_graph.codegen._capture_constants import fold_constants
from stitch_graph.codegen._capture_conv_pads import pads_into_convolutions
from stitch_graph.codegen._capture_decompose import _decompose
from stitch_graph.codegen._capture_fx_rewrites import (
    decompose_cov,
    index_by_one_element,
    split_returned_tuple,
)
from stitch_graph.codegen._capture_gather_through import gather_operands_first
from stitch_graph.codegen._capture_guards import GUARD_OP, guard
from stitch_graph.codegen._capture_interleave import interleave_stacks
from stitch_graph.codegen._capture_log_softmax import lower_log_softmax_rows
from stitch_graph.codegen._capture_masks import data_dependent_hint, rewrite_masked_selection
from stitch_graph.codegen._capture_names import (
    _by_schema_names,
    _canonical_name,
    _qualname,
    _rewrite_call,
    _variant,
)
from stitch_graph.codegen._capture_narrow_cat import narrows_from_operands
from stitch_graph.codegen._capture_norm_on_load import normalize_on_load
from stitch_graph.codegen._capture_norms import recognize_norms
from stitch_graph.codegen._capture_one_hot import scatters_as_comparisons
from stitch_graph.codegen._capture_passes import (
    _drop_identity_views,
    _drop_unit_reductions,
    _eliminate_dead,
    _insert_copies,
    _split_library_bias,
)
from stitch_graph.codegen._capture_recompute import recompute_cheap_producers
from stitch_graph.codegen._capture_scaled_products import scale_operands_of_products
from stitch_graph.codegen._capture_setitem import assigned_view, lower_setitem, viewed_base
from stitch_graph.codegen._capture_shared_rows import share_row_passes
from stitch_graph.codegen._capture_summed_products import sum_products_first
from stitch_graph.codegen._capture_trace import (
    _graph_to_meta,
    _module_call,
    _RecordingShapeProp,
    _returns_leaf,
)
from stitch_graph.codegen._capture_views import compute_through_views
from stitch_graph.codegen.ir import OpNode, ParamSpec, ProgramIR, Ref, contiguous_strides
from stitch_graph.codegen.ops import lookup


def _param_specs(model: torch.nn.Module) -> list[ParamSpec]:
    """The model's parameters and buffers; small non-persistent buffers keep their values."""
    specs: list[ParamSpec] = []
    for name, p in model.named_parameters():
        specs.append(ParamSpec(name, tuple(p.shape), str(p.dtype).removeprefix("torch.")))
    for mod_name, module in model.named_modules():
        for buf_name, buf in module._buffers.items():
            if buf is None:
                continue
            full = f"{mod_name}.{buf_name}" if mod_name else buf_name
            persistent = buf_name not in module._non_persistent_buffers_set
            value = None
            if not persistent and buf.device.type != "meta" and buf.numel() <= _MAX_BAKED:
                value = buf.detach().flatten().tolist()
            specs.append(
                ParamSpec(
                    full,
                    tuple(buf.shape),
                    str(buf.dtype).removeprefix("torch."),
                    buffer=True,
                    persistent=persistent,
                    value=value,
                )
            )
    return specs


def _propagate(meta_gm: torch.fx.GraphModule, args: list[Any]) -> None:
    """Shapes on meta tensors; a selection by a mask that is only reduced is rewritten where
    propagation stops on it (its size depends on the data), and propagation runs again."""
    while True:
        try:
            # ShapeProp prints a failing node's traceback itself; the error below says what
            # failed, and the caller tries torch.export next
            with contextlib.redirect_stderr(io.StringIO()):
                _RecordingShapeProp(meta_gm).propagate(*args)
            return
        except Exception as error:  # noqa: BLE001
            if (
                rewrite_masked_selection(meta_gm)
                or index_by_one_element(meta_gm)
                or decompose_cov(meta_gm)
            ):
                continue
            hint = data_dependent_hint(meta_gm)
            msg = f"shape propagation on meta tensors failed{hint}: {error}"
            raise _PropagationError(msg) from error


def _lower(
    task: Task,
    model: torch.nn.Module,
    gm: torch.fx.GraphModule,
    method: str,
    args: list[Any],
    in_dtypes: list[str | None],
    state: dict[str, torch.Tensor],
    *,
    exact_order: bool = False,
) -> ProgramIR:
    """Lower a traced model to the IR.

    Args:
        task: The task the program comes from.
        model: The model that was traced (its parameters and buffers, maybe on meta).
        gm: Its traced graph.
        method: How it was traced: ``"fx"`` or ``"export"``.
        args: The forward arguments (meta tensors or plain values).
        in_dtypes: Their dtypes (``None`` for plain values).
        state: The model's state dict.
        exact_order: Leave out the rewrites that add a sum's terms in another order
            (``_REORDERING``), so the program rounds as the reference does.

    Returns:
        The program, with dead nodes dropped and contiguous copies inserted.

    Raises:
        CaptureError: A construct the IR cannot represent (a read
            after an aliased in-place write, a non-tensor output).
        _PropagationError: The graph does not run on meta tensors, or it assigns into a tensor
            in a form this path does not lower (the caller then tries torch.export).
    """
    params = _param_specs(model)  # before the move to meta: baked buffers keep their values
    known = {p.name for p in params}
    constants: dict[str, Any] = {}
    for fx_node in gm.graph.nodes:
        if fx_node.op == "get_attr" and str(fx_node.target) not in known:
            tensor = _fetch_attr(gm, str(fx_node.target))
            if torch.is_tensor(tensor) and tensor.device.type != "meta":
                tensor = tensor.detach().clone()
            constants[str(fx_node.target)] = tensor
    meta_gm = _graph_to_meta(gm)
    _propagate(meta_gm, args)
    if split_returned_tuple(meta_gm):
        _propagate(meta_gm, args)
    ir = ProgramIR(
        task=task,
        inputs=[],
        input_values={},
        params=params,
        nodes=[],
        outputs=[],
        training=model.training,
        method=method,
        exact_order=exact_order,
    )
    env: dict[str, Any] = {}  # fx node name -> Ref or constant
    ours: dict[Ref, Any] = {}  # meta tensors laid out as our buffers will be
    for spec in params:
        ref = Ref("param", spec.name)
        ir.shapes[ref] = spec.shape
        ir.strides[ref] = contiguous_strides(spec.shape)
        ir.dtypes[ref] = spec.dtype
        ours[ref] = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device="meta")
    writes = _Writes()
    placeholder_index = 0
    for fx_node in meta_gm.graph.nodes:
        value = fx_node.meta.get("sg_value")
        if fx_node.op == "placeholder":
            arg = args[placeholder_index] if placeholder_index < len(args) else None
            dtype = in_dtypes[placeholder_index] if placeholder_index < len(in_dtypes) else None
            placeholder_index += 1
            if torch.is_tensor(arg):
                ref = Ref("input", fx_node.name)
                ir.inputs.append((fx_node.name, tuple(arg.shape)))
                ir.shapes[ref] = tuple(arg.shape)
                ir.strides[ref] = contiguous_strides(tuple(arg.shape))
                ir.dtypes[ref] = dtype or "float32"
                ours[ref] = torch.empty(arg.shape, dtype=arg.dtype, device="meta")
                env[fx_node.name] = ref
                writes.record(fx_node, initial=True)
            else:
                ir.inputs.append((fx_node.name, None))
                ir.input_values[fx_node.name] = arg
                env[fx_node.name] = arg
            continue
        if fx_node.op == "get_attr":
            target = str(fx_node.target)
            if target not in known:
                tensor = constants.get(target, _fetch_attr(gm, target))
                if not torch.is_tensor(tensor):
                    env[fx_node.name] = tensor
                    continue
                small = tensor.numel() <= _MAX_BAKED and tensor.device.type != "meta"
                baked = tensor.detach().flatten().tolist() if small else None
                if baked is None and target.startswith("_tensor_constant"):
                    # computed while tracing, from no input: the program could only read zeros
                    msg = (
                        f"forward builds a constant tensor of {tensor.numel()} elements "
                        f"(shape {tuple(tensor.shape)}) from no input, parameter or buffer, too "
                        f"large to bake into the program; create it with device=x.device (it "
                        f"is then built in the program), or build it in __init__ and register "
                        f"it with register_buffer"
                    )
                    raise CaptureError(msg)
                if baked is None:
                    ir.notes.append(f"constant {target} is too large to bake into host code")
                spec = ParamSpec(
                    target,
                    tuple(tensor.shape),
                    str(tensor.dtype).removeprefix("torch."),
                    buffer=True,
                    persistent=False,
                    value=baked,
                )
                ir.params.append(spec)
                known.add(target)
            spec = next(p for p in ir.params if p.name == target)
            ref = Ref("param", target)
            ir.shapes[ref] = spec.shape
            ir.strides[ref] = contiguous_strides(spec.shape)
            ir.dtypes[ref] = spec.dtype
            ours[ref] = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device="meta")
            env[fx_node.name] = ref
            writes.record(fx_node, initial=True)
            continue
        if fx_node.op == "output":
            writes.check_reads(fx_node)
            out = fx_node.args[0]
            ir.output_is_tuple = isinstance(out, list | tuple)
            items = out if ir.output_is_tuple else [out]
            if ir.output_is_tuple and len(out) == 1 and _returns_leaf(gm):
                ir.output_is_tuple = False  # an exported graph returns its outputs flattened
            for item in items:
                ir.outputs.append(_materialise_output(ir, _subst(item, env), ours))
            continue
        if fx_node.op == "call_module" and str(fx_node.target) == "_guards_fn":
            continue
        if fx_node.op == "call_function" and fx_node.target is operator.setitem:
            _lower_assignment(ir, fx_node, env, ours, writes)
            continue
        if not torch.is_tensor(value) and not _is_tensor_seq(value):
            env[fx_node.name] = value  # sizes, shapes and other Python values fold to constants
            continue
        writes.check_reads(fx_node)
        mutated = _mutated_arg(fx_node)
        before = env.get(mutated.name) if mutated is not None else None
        _lower_node(ir, fx_node, env, ours, value, model)
        if mutated is not None:
            writes.write(ir, fx_node, mutated, before, env)
            _write_back(ir, fx_node, mutated, env, ours, writes)
        writes.record(fx_node)
    merge_common_subexpressions(ir)
    recognize_norms(ir)
    _drop_unit_reductions(ir)
    _drop_identity_views(ir)
    _eliminate_dead(ir)
    rewrites = (
        pads_into_convolutions, narrows_from_operands, gather_operands_first,
        batch_shared_products, sum_broadcast_products_as_matmuls, interleave_stacks,
        sum_products_first,
        scale_operands_of_products, scatters_as_comparisons, compute_through_views,
    )
    for rewrite in rewrites:
        if exact_order and rewrite in _REORDERING:
            continue
        before = [n.name for n in ir.nodes]
        _optional(rewrite, ir)
        if rewrite in _REORDERING and [n.name for n in ir.nodes] != before:
            ir.reordered.append(rewrite.__name__)
    _insert_copies(ir)
    _optional(compute_through_views, ir)  # a copy's producer computed in the copy's layout
    _optional(fold_constants, ir)  # after the copies: a copy of constants is baked whole
    _split_library_bias(ir)
    share_row_passes(ir)
    recompute_cheap_producers(ir)
    _optional(normalize_on_load, ir)
    return ir


# Products split and batched, a GEMM in place of a broadcast product's sum, a summed weight in
# place of a GEMM's summed features: the same sums, their terms added in another order. L2 14's
# summed weights were 6e-3 from float64 where eager was 1.8e-2, and 2.2e-2 from eager: closer to
# the exact value, outside a 1e-4 tolerance of eager (KernelBench, H100).
_REORDERING = (batch_shared_products, sum_broadcast_products_as_matmuls, sum_products_first)


def _optional(rewrite: Any, ir: ProgramIR) -> None:
    """Run a rewrite that adopts each change whole (tried on a copy of the IR first): one that
    fails on a program it was not written for leaves the program as it stands, with a note,
    rather than failing the capture."""
    try:
        rewrite(ir)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, RuntimeError) as error:
        ir.notes.append(f"{rewrite.__name__} left out: {type(error).__name__}: {error}"[:200])


def _lower_assignment(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    env: dict[str, Any],
    ours: dict[Ref, Any],
    writes: _Writes,
) -> None:
    """``y[index] = value`` as a new tensor for ``y`` (``_capture_setitem``), rebound as an
    in-place write of ``y``; an assignment it does not reproduce sends the capture to
    ``torch.export``."""
    base = fx_node.args[0]
    view_write = assigned_view(fx_node)
    allow = (base.name, view_write.name) if view_write is not None else None
    writes.check_reads(fx_node, allow=allow)
    before = env.get(base.name) if isinstance(base, torch.fx.Node) else None
    if view_write is not None and before == Ref("node", _written_back_name(view_write, base)):
        env[fx_node.name] = before  # y[idx] op= v: the op's write-back already stored the region
        return
    _, index, value = fx_node.args
    ref = lower_setitem(ir, fx_node.name, before, index, _subst(value, env), env, ours)
    if ref is None:
        msg = (
            f"{fx_node.name}: assignment into a tensor (x[...] = v) with this index or value is "
            "not lowered from the fx graph (basic indices, or a boolean mask with a scalar, are)"
        )
        raise _PropagationError(msg)  # the exported graph may still run it, in PyTorch
    env[fx_node.name] = ref
    writes.write(ir, fx_node, base, before, env)


def _write_back(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    view: torch.fx.Node,
    env: dict[str, Any],
    ours: dict[Ref, Any],
    writes: _Writes,
) -> None:
    """After an in-place op on ``base[index]`` (``a[:, 0].mul_(2)``), ``base`` as the new
    tensor with that region replaced, so later reads of ``base`` see the write; other views of
    ``base`` stay out of date, and their reads refused."""
    found = viewed_base(view)
    if found is None:
        return
    base, index = found
    before = env.get(base.name)
    name = _written_back_name(fx_node, base)
    ref = lower_setitem(ir, name, before, index, env.get(fx_node.name), env, ours)
    if ref is not None:
        writes.write(ir, fx_node, base, before, env, after=ref)
        writes.record(view)  # the view holds the op's result: still right


def _written_back_name(op: torch.fx.Node, base: torch.fx.Node) -> str:
    """The node of ``base`` after the in-place ``op`` on one of its views wrote it back."""
    return f"{op.name}_into_{base.name}"


def _lower_node(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    env: dict[str, Any],
    ours: dict[Ref, Any],
    value: Any,
    model: torch.nn.Module,
) -> None:
    """Lower one traced call with a tensor result: bind it in ``env``, append its node."""
    if _bake_factory(ir, fx_node, env, ours, value) or _eye_compared(ir, fx_node, env, ours, value):
        return
    tensors = torch.is_tensor(value) or _is_tensor_seq(value)  # var_mean: a pair of them
    decomposed = lower_complex(ir, fx_node, env, ours, value)
    if decomposed is None and tensors:
        decomposed = lower_log_softmax_rows(ir, fx_node, env, ours)
    if decomposed is None and tensors:
        decomposed = _decompose(ir, fx_node, env, ours)
    if decomposed is not None:
        env[fx_node.name] = decomposed
        return
    if fx_node.op == "call_function" and fx_node.target is operator.getitem:
        held, index = _subst(fx_node.args, env)
        if isinstance(held, tuple) and isinstance(index, int):  # of a decomposed tuple
            env[fx_node.name] = held[index]
            return
    if fx_node.op == "call_function" and fx_node.target is builtins.getattr:
        held, attr = _subst(fx_node.args, env)
        if isinstance(held, tuple) and attr in ("values", "indices"):  # torch.topk(...).values
            env[fx_node.name] = held[0 if attr == "values" else 1]
            return
    if _is_buffer_update(fx_node, env):
        ir.notes.append(f"{fx_node.name}: in-place update of a buffer dropped (running stats)")
        return
    node = _lower_call(ir, fx_node, env, value, model)
    if node is None:
        return
    ir.nodes.append(node)
    ref = Ref("node", node.name)
    env[fx_node.name] = ref
    ours[ref] = _our_layout(ir, node, fx_node, ours, value)
    if torch.is_tensor(value) and not _torch_result_contiguous(node, fx_node, ours, value):
        node.attrs["strided_in_torch"] = True
    if node.op == "unfold" and torch.is_tensor(ours[ref]):
        # the same view spelled as_strided, which reads as a view (Tensor.unfold as compute)
        node.call = ".as_strided"
        node.call_args = [node.args["input"], list(ours[ref].shape), list(ours[ref].stride())]
        node.call_kwargs = {}
    if torch.is_tensor(ours[ref]):
        ir.shapes[ref] = tuple(ours[ref].shape)
        ir.strides[ref] = tuple(ours[ref].stride())
        ir.dtypes[ref] = str(ours[ref].dtype).removeprefix("torch.")
    else:
        ir.shapes[ref] = ()
        ir.dtypes[ref] = "tuple"


_FACTORIES = frozenset(
    {
        "tensor", "as_tensor", "scalar_tensor", "full", "zeros", "ones", "arange", "linspace",
        "eye", "tril_indices", "triu_indices", "logspace",
    }
)


_EYE_CASTS = {torch.float32: "float", torch.int64: "long"}


def _eye_compared(
    ir: ProgramIR, fx_node: torch.fx.Node, env: dict[str, Any], ours: dict[Ref, Any], value: Any
) -> bool:
    """``torch.eye`` too large to bake, as a comparison of baked row and column numbers (a
    pairwise mask ``1 - eye(n)`` over 512 particles): one pointwise kernel, not PyTorch."""
    eye = fx_node.target is torch.eye or getattr(fx_node.target, "overloadpacket", None) is (
        torch.ops.aten.eye)  # an export's
    if not eye or not torch.is_tensor(value) or value.dim() != 2:
        return False
    if value.dtype != torch.bool and value.dtype not in _EYE_CASTS:
        return False
    rows, cols = value.shape
    if max(rows, cols) > _MAX_BAKED:
        return False
    b = _Builder(ir, ours, fx_node.name)
    ref = diagonal_mask(b, rows, cols)
    if value.dtype != torch.bool:
        cast = _EYE_CASTS[value.dtype]
        ref = b(cast, cast, ref)
    env[fx_node.name] = ref
    return True


def _bake_factory(
    ir: ProgramIR, fx_node: torch.fx.Node, env: dict[str, Any], ours: dict[Ref, Any], value: Any
) -> bool:
    """A tensor built in ``forward`` from constants alone (``torch.tensor(0.5)``) becomes a
    baked, non-persistent buffer; ``False`` (nothing done) for anything else."""
    if fx_node.op != "call_function" or not torch.is_tensor(value):
        return False
    target = fx_node.target
    name = (
        target.overloadpacket.__name__
        if isinstance(target, torch._ops.OpOverload)
        else getattr(target, "__name__", "")
    )
    if name not in _FACTORIES or value.numel() > _MAX_BAKED:
        return False
    args = _subst(fx_node.args, env)
    kwargs = dict(_subst(fx_node.kwargs, env))
    if any(isinstance(r, Ref) for r in _flat(args) + _flat(list(kwargs.values()))):
        return False
    kwargs["device"] = "cpu"
    kwargs.pop("pin_memory", None)
    try:
        tensor = getattr(torch, name)(*args, **kwargs)
    except Exception:  # noqa: BLE001 - not a plain constant after all: keep the call
        return False
    if tuple(tensor.shape) != tuple(value.shape) or tensor.dtype != value.dtype:
        return False
    env[fx_node.name] = _bake(ir, ours, f"{BAKED_PREFIX}{fx_node.name}", tensor)
    return True


def _lower_call(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    env: dict[str, Any],
    value: Any,
    root: torch.nn.Module,
) -> OpNode | None:
    """The canonical node of one traced call, or ``None`` when it is an identity of its input
    (which is then bound in ``env`` instead)."""
    bind_args: list[Any] | None = None
    bind_kwargs: dict[str, Any] = {}
    if fx_node.op == "call_module":
        path = str(fx_node.target)
        x = _subst(fx_node.args[0], env)
        ndim = len(ir.shapes[x]) if isinstance(x, Ref) else 0
        rest = tuple(_subst(fx_node.args[1:], env))
        call, call_args, call_kwargs = _module_call(root.get_submodule(path), path, x, ndim, rest)
        op = call.rsplit(".", 1)[1]
    else:
        call_args = list(_subst(fx_node.args, env))
        call_kwargs = dict(_subst(fx_node.kwargs, env))
        rewritten = _rewrite_call(ir, fx_node, call_args, call_kwargs)
        if rewritten is not None:
            op, call, call_args, call_kwargs = rewritten
        elif fx_node.target is guard:  # a decision of the traced path, checked by the host
            op, call = GUARD_OP, "KERNELS.guard"
        else:
            op = _canonical_name(fx_node)
            call = (
                "." + str(fx_node.target)
                if fx_node.op == "call_method"
                else _qualname(fx_node.target)
            )
        info = lookup(op)
        short = call.removeprefix("torch.")
        if (
            info is not None
            and info.kind == "view"
            and call_args
            and isinstance(call_args[0], Ref)
            and "." not in short
            and short != call
            and hasattr(torch.Tensor, short)
        ):
            call = "." + short  # torch.flatten(x, 1) -> x.flatten(1): a view, not compute
        if info is not None and isinstance(fx_node.target, torch._ops.OpOverload):
            bind_args, bind_kwargs = _by_schema_names(fx_node.target, call_args, call_kwargs, info)
    info = lookup(op)
    if bind_args is None:
        bind_args, bind_kwargs = call_args, call_kwargs
    # an unknown op keeps every argument, so that its tensor operands still count as read
    bound = info.bind(bind_args, bind_kwargs) if info is not None else {
        "*args": list(bind_args),
        **bind_kwargs,
    }
    if info is not None and info.kind == "view" and op in ("view", "permute", "expand"):
        rest = call_args[1:]
        bound = {"input": call_args[0], "shape": rest[0] if len(rest) == 1 else rest}
    if torch.is_tensor(value):
        shape, dtype = tuple(value.shape), str(value.dtype).removeprefix("torch.")
    else:
        shape, dtype = (), "tuple"
    unknown = _unknown_arguments(info, bound)
    op, bound, attrs = _variant(ir, op, bound, shape, call_args, env, fx_node)
    if unknown:
        attrs["unknown_arguments"] = unknown
    if "torch_call" in attrs:  # an element of a tuple the op replaces (max(dim).values)
        call, call_args, call_kwargs = attrs.pop("torch_call")
    node = OpNode(fx_node.name, op, bound, shape, dtype, call, call_args, call_kwargs, attrs)
    if op == "expand_as":
        node = _plain_expand(node)
    if op == "identity_of":
        env[fx_node.name] = bound["input"]
        return None
    return node


def _unknown_arguments(info: Any, bound: dict[str, Any]) -> list[str]:
    """Keyword arguments a pointwise call passes that its signature does not name: its
    expression would drop them, so the op stays in PyTorch."""
    if info is None or info.kind != "pointwise":
        return []
    known = {name for name, _ in info.params} | _PLACEMENT
    return [k for k, v in bound.items() if k not in known and not k.startswith("*") and v is not None]


# where and how a result is stored, which the node's dtype and our buffers already say
_PLACEMENT = frozenset({"dtype", "device", "layout", "pin_memory", "requires_grad", "memory_format"})


def _plain_expand(node: OpNode) -> OpNode:
    """``x.expand_as(y)`` as the ``x.expand(y.shape)`` it is: ``y`` gives only its shape, and an
    ``expand`` is a view that ``_capture_views`` can move (a gate read as ``s.expand_as(x)`` in
    squeeze-and-excitation and ECA blocks then joins its reader's kernel)."""
    source, shape = node.args["input"], list(node.shape)
    return replace(
        node, op="expand", args={"input": source, "shape": shape}, call=".expand",
        call_args=[source, shape], call_kwargs={},
    )


def _our_layout(
    ir: ProgramIR, node: OpNode, fx_node: torch.fx.Node, ours: dict[Ref, Any], value: Any
) -> Any:
    """A meta tensor with the strides our buffer for ``node`` will have.

    Kernels write contiguous buffers; views are re-applied on those, so a view's strides follow
    our producers rather than the reference's (which may keep a permuted layout).
    """
    info = lookup(node.op)
    if info is not None and info.kind == "view":
        try:
            args = _to_meta(node.call_args, ours)
            kwargs = _to_meta(node.call_kwargs, ours)
            if node.call.startswith("."):
                return getattr(args[0], node.call[1:])(*args[1:], **kwargs)
            if node.call == "operator.getitem":
                return operator.getitem(*args)
            return fx_node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - fall back to the reference's layout
            pass
    if torch.is_tensor(value):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if _is_tensor_seq(value):
        return type(value)(torch.empty(v.shape, dtype=v.dtype, device="meta") for v in value)
    return value


def _torch_result_contiguous(
    node: OpNode, fx_node: torch.fx.Node, ours: dict[Ref, Any], value: Any
) -> bool:
    """Whether PyTorch's own result for a non-view ``node`` (run on our buffers) is contiguous.

    Our buffers for non-view nodes are contiguous; a node left to PyTorch whose result is not
    (``einsum`` returns a permuted product) is made contiguous on the host.
    """
    info = lookup(node.op)
    if info is not None and info.kind == "view":
        return True
    try:
        args = _to_meta(node.call_args, ours)
        kwargs = _to_meta(node.call_kwargs, ours)
        if node.call.startswith("."):
            result = getattr(args[0], node.call[1:])(*args[1:], **kwargs)
        else:
            result = fx_node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the reference's layout then
        result = value
    return not torch.is_tensor(result) or result.is_contiguous()


def _dense_view_of_a_result(ir: ProgramIR, ref: Ref) -> bool:
    """Whether ``ref`` is a contiguous view, through views alone, of a tensor the program
    computes (not an input, a parameter or an element of a tuple PyTorch returns)."""
    if tuple(ir.strides.get(ref, ())) != contiguous_strides(tuple(ir.shapes[ref])):
        return False
    while ref.kind == "node":
        node = ir.node(ref.name)
        info = lookup(node.op)
        if info is None or info.kind not in ("view", "identity"):  # .contiguous() is PyTorch's
            return node.dtype != "tuple"
        base = node.args.get("input")
        if not isinstance(base, Ref) or ir.dtypes.get(base) == "tuple":
            return False
        ref = base
    return False


def _materialise_output(ir: ProgramIR, ref: Any, ours: dict[Ref, Any]) -> Ref:
    """Outputs must be fresh buffers: copy an input, a parameter or a strided view. A dense
    view of the program's own result (``y.flatten(1)`` returned) is one already."""
    if not isinstance(ref, Ref):
        msg = f"the program returns a non-tensor value {ref!r}"
        raise CaptureError(msg)
    node = _node_of(ir, ref)
    is_view = node is not None and (info := lookup(node.op)) is not None and info.kind == "view"
    if ref.kind == "node" and (not is_view or _dense_view_of_a_result(ir, ref)):
        return ref
    shape = ir.shapes[ref]
    name = f"copy_out_{len(ir.nodes)}"
    copy = OpNode(name, "copy", {"input": ref}, shape, ir.dtypes[ref], ".clone", [ref], {})
    ir.nodes.append(copy)
    out = Ref("node", name)
    ir.shapes[out] = shape
    ir.strides[out] = contiguous_strides(shape)
    ir.dtypes[out] = ir.dtypes[ref]
    ours[out] = torch.empty(shape, device="meta")
    return out
