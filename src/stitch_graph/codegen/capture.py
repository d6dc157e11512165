"""Capture a KernelBench program as ``ProgramIR``: trace it, propagate shapes, normalise its ops.

The reference is executed only symbolically: the model is built on the meta device (rebuilt on the
CPU under ``torch.manual_seed(0)`` only when it holds constants whose values the host code needs),
traced with ``torch.fx.symbolic_trace`` through every submodule but the normalisations
(``torch.export`` when fx fails), and
shapes come from ``ShapeProp`` on meta tensors, so a problem with gigabytes of weights captures in
milliseconds. Every call becomes a canonical op (``F.gelu(x, approximate="tanh")`` ->
``gelu_tanh``, ``x.sum(1)`` -> ``sum``, ``nn.BatchNorm2d`` in eval -> ``batch_norm_eval``) with
its arguments bound to the op registry's signature names.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

from stitch_graph.artifacts import Task
from stitch_graph.codegen.ir import (
    OpNode,
    ParamSpec,
    ProgramIR,
    Ref,
    contiguous_strides,
    matrix_layout,
)
from stitch_graph.codegen.ops import REGISTRY, lookup

__all__ = ["CaptureError", "capture_program"]

_OPERATORS: dict[Any, str] = {
    operator.add: "add",
    operator.iadd: "add",
    operator.sub: "sub",
    operator.isub: "sub",
    operator.mul: "mul",
    operator.imul: "mul",
    operator.truediv: "div",
    operator.itruediv: "div",
    operator.floordiv: "div_floor",
    operator.pow: "pow",
    operator.neg: "neg",
    operator.mod: "remainder",
    operator.matmul: "matmul",
    operator.getitem: "getitem",
    operator.gt: "gt",
    operator.lt: "lt",
    operator.ge: "ge",
    operator.le: "le",
    operator.eq: "eq",
    operator.ne: "ne",
    operator.abs: "abs",
}
_MAX_BAKED = 1 << 16  # elements of a constant tensor we are willing to bake into host code


class CaptureError(RuntimeError):
    """The program could not be traced or its shapes could not be propagated."""


_LEAF_MODULES = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.GroupNorm,
    torch.nn.LayerNorm,
)


class _ThroughTracer(torch.fx.Tracer):
    """Trace through submodules except normalisations, whose forwards branch on sizes."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _LEAF_MODULES)


def _module_call(
    module: torch.nn.Module, path: str, x: Any
) -> tuple[str, list[Any], dict[str, Any]]:
    """The functional call a leaf module stands for, with its tensors as ``Ref``."""

    def param(name: str) -> Ref | None:
        return Ref("param", f"{path}.{name}") if getattr(module, name, None) is not None else None

    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        training = module.training or module.running_mean is None
        args = [x, param("running_mean"), param("running_var"), param("weight"), param("bias")]
        kwargs = {"training": training, "momentum": module.momentum or 0.0, "eps": module.eps}
        return "torch.nn.functional.batch_norm", args, kwargs
    if isinstance(module, torch.nn.GroupNorm):
        args = [x, module.num_groups, param("weight"), param("bias"), module.eps]
        return "torch.nn.functional.group_norm", args, {}
    if isinstance(module, torch.nn.LayerNorm):
        shape = list(module.normalized_shape)
        return (
            "torch.nn.functional.layer_norm",
            [x, shape, param("weight"), param("bias"), module.eps],
            {},
        )
    msg = f"no functional form for leaf module {type(module).__name__}"
    raise CaptureError(msg)


class _RecordingShapeProp(ShapeProp):
    """ShapeProp that also keeps non-tensor results (sizes, tuples) for constant folding."""

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        n.meta["sg_value"] = result
        return result


_QUALNAMES: dict[int, str] = {}


def _qualname(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target}"
    if not _QUALNAMES:
        import torch.nn.functional as F  # noqa: N812

        spaces = [
            ("operator", operator),
            ("torch.special", torch.special),
            ("torch.linalg", torch.linalg),
            ("torch.fft", torch.fft),
            ("torch", torch),
            ("torch.nn.functional", F),
        ]
        for prefix, space in spaces:
            for attr in dir(space):
                if attr.startswith("__"):
                    continue
                obj = getattr(space, attr, None)
                if callable(obj):
                    _QUALNAMES[id(obj)] = f"{prefix}.{attr}"
    name = _QUALNAMES.get(id(target))
    if name is None:
        msg = f"cannot name the callable {target!r} for host code"
        raise CaptureError(msg)
    return name


def _canonical_name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        name = str(target)
    elif target in _OPERATORS:
        name = _OPERATORS[target]
    elif isinstance(target, torch._ops.OpOverload):
        name = target.overloadpacket.__name__
    else:
        name = getattr(target, "__name__", str(target))
    if name.endswith("_") and not name.endswith("__"):
        name = name.rstrip("_")
    name = name.lstrip("_") if name.startswith("_") and name.lstrip("_") in REGISTRY else name
    info = lookup(name)
    return info.name if info is not None else name


def _by_schema_names(
    target: Any, args: list[Any], kwargs: dict[str, Any], info: Any
) -> tuple[list[Any], dict[str, Any]]:
    """Arguments of an ATen overload by name: its order can differ from the functional form's
    (``aten.batch_norm`` takes weight and bias before the running statistics)."""
    names = [a.name for a in target._schema.arguments]
    known = {n for n, _ in info.params}
    if not set(names[: len(args)]) <= known | {"cudnn_enabled"}:
        return args, kwargs  # a schema whose names the registry does not use: keep positions
    by_name = dict(zip(names, args, strict=False))
    by_name.update(kwargs)
    return [], {k: v for k, v in by_name.items() if k in known}


def _build_model(namespace: dict[str, Any], init_args: list[Any], device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        model = namespace["Model"](*init_args)
    return model


def _meta_inputs(task: Task, namespace: dict[str, Any]) -> tuple[list[Any], list[str | None]]:
    """Meta tensors (or plain values) for the forward arguments, and their dtypes."""
    if task.inputs:
        values: list[Any] = []
        dtypes: list[str | None] = []
        for i, spec in enumerate(task.inputs):
            if spec is None:
                value = task.input_values[i] if i < len(task.input_values) else None
                values.append(value)
                dtypes.append(None)
            else:
                dtype = getattr(torch, spec.dtype)
                values.append(torch.empty(spec.shape, dtype=dtype, device="meta"))
                dtypes.append(spec.dtype)
        return values, dtypes
    if "get_inputs" not in namespace:
        msg = "the task lists no inputs and its source has no get_inputs()"
        raise CaptureError(msg)
    torch.manual_seed(0)
    with torch.device("meta"):
        values = list(namespace["get_inputs"]())
    dtypes = [str(v.dtype).removeprefix("torch.") if torch.is_tensor(v) else None for v in values]
    return values, dtypes


def _trace(model: torch.nn.Module, args: list[Any]) -> tuple[torch.fx.GraphModule, str]:
    try:
        graph = _ThroughTracer().trace(model)
        return torch.fx.GraphModule(model, graph), "fx"
    except Exception as fx_error:  # noqa: BLE001 - any trace failure falls back to export
        try:
            program = torch.export.export(model, tuple(args))
            return program.module(), "export"
        except Exception as export_error:  # noqa: BLE001
            msg = f"fx trace failed ({fx_error}); torch.export failed too ({export_error})"
            raise CaptureError(msg) from export_error


def capture_program(task: Task) -> ProgramIR:
    """Trace the task's ``Model`` and lower it to the codegen IR.

    Args:
        task: A KernelBench task; ``task.inputs`` gives the input shapes (when empty, the source's
            ``get_inputs()`` is run on the meta device).

    Returns:
        The program: inputs, parameters/buffers by dotted name, canonical nodes, outputs.

    Raises:
        CaptureError: The source has no ``Model`` or cannot be traced.
    """
    namespace: dict[str, Any] = {"__name__": f"stitch_task_{task.digest}"}
    exec(compile(task.source, task.path or f"<task {task.name}>", "exec"), namespace)  # noqa: S102
    if "Model" not in namespace:
        msg = f"task {task.name!r} defines no class Model"
        raise CaptureError(msg)
    init_args = list(task.init_args)
    if not init_args and "get_init_inputs" in namespace and not task.inputs:
        init_args = list(namespace["get_init_inputs"]())
    model = _build_model(namespace, init_args, "meta")
    args, in_dtypes = _meta_inputs(task, namespace)
    gm, method = _trace(model, args)
    state = model.state_dict()
    needs_values = any(n.op == "get_attr" and n.target not in state for n in gm.graph.nodes) or any(
        name in m._non_persistent_buffers_set
        for _, m in model.named_modules()
        for name in m._buffers
    )
    if needs_values:
        model = _build_model(namespace, init_args, "cpu")
        gm, method = _trace(model, args)
        state = model.state_dict()
    return _lower(task, model, gm, method, args, in_dtypes, state)


def _param_specs(model: torch.nn.Module) -> list[ParamSpec]:
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


def _lower(
    task: Task,
    model: torch.nn.Module,
    gm: torch.fx.GraphModule,
    method: str,
    args: list[Any],
    in_dtypes: list[str | None],
    state: dict[str, torch.Tensor],
) -> ProgramIR:
    meta_gm = gm.to("meta") if method == "fx" else gm
    try:
        _RecordingShapeProp(meta_gm).propagate(*args)
    except Exception as error:  # noqa: BLE001
        msg = f"shape propagation on meta tensors failed: {error}"
        raise CaptureError(msg) from error
    params = _param_specs(model)
    known = {p.name for p in params}
    ir = ProgramIR(
        task=task,
        inputs=[],
        input_values={},
        params=params,
        nodes=[],
        outputs=[],
        training=model.training,
        method=method,
    )
    env: dict[str, Any] = {}  # fx node name -> Ref or constant
    ours: dict[Ref, Any] = {}  # meta tensors laid out as our buffers will be
    for spec in params:
        ref = Ref("param", spec.name)
        ir.shapes[ref] = spec.shape
        ir.strides[ref] = contiguous_strides(spec.shape)
        ir.dtypes[ref] = spec.dtype
        ours[ref] = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device="meta")
    targets: dict[str, Any] = {}
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
            else:
                ir.inputs.append((fx_node.name, None))
                ir.input_values[fx_node.name] = arg
                env[fx_node.name] = arg
            continue
        if fx_node.op == "get_attr":
            target = str(fx_node.target)
            if target not in known:
                tensor = _fetch_attr(gm, target)
                if not torch.is_tensor(tensor):
                    env[fx_node.name] = tensor
                    continue
                baked = tensor.detach().flatten().tolist() if tensor.numel() <= _MAX_BAKED else None
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
            continue
        if fx_node.op == "output":
            out = fx_node.args[0]
            ir.output_is_tuple = isinstance(out, list | tuple)
            for item in out if ir.output_is_tuple else [out]:
                ir.outputs.append(_materialise_output(ir, _subst(item, env), ours))
            continue
        if fx_node.op == "call_module" and str(fx_node.target) == "_guards_fn":
            continue
        if not torch.is_tensor(value) and not _is_tensor_seq(value):
            env[fx_node.name] = value  # sizes, shapes and other Python values fold to constants
            continue
        if _is_buffer_update(fx_node, env):
            ir.notes.append(f"{fx_node.name}: in-place update of a buffer dropped (running stats)")
            continue
        node = _lower_call(ir, fx_node, env, value, model)
        if node is None:
            continue
        targets[node.name] = fx_node.target
        ir.nodes.append(node)
        ref = Ref("node", node.name)
        env[fx_node.name] = ref
        ours[ref] = _our_layout(ir, node, fx_node, ours, value)
        if torch.is_tensor(ours[ref]):
            ir.shapes[ref] = tuple(ours[ref].shape)
            ir.strides[ref] = tuple(ours[ref].stride())
            ir.dtypes[ref] = str(ours[ref].dtype).removeprefix("torch.")
        else:
            ir.shapes[ref] = ()
            ir.dtypes[ref] = "tuple"
    _eliminate_dead(ir)
    _insert_copies(ir)
    return ir


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _is_tensor_seq(value: Any) -> bool:
    return (
        isinstance(value, list | tuple) and bool(value) and all(torch.is_tensor(v) for v in value)
    )


def _is_buffer_update(fx_node: torch.fx.Node, env: dict[str, Any]) -> bool:
    if fx_node.op != "call_method" or not str(fx_node.target).endswith("_") or fx_node.users:
        return False
    first = fx_node.args[0] if fx_node.args else None
    ref = env.get(first.name) if isinstance(first, torch.fx.Node) else None
    return isinstance(ref, Ref) and ref.kind == "param"


def _subst(value: Any, env: dict[str, Any]) -> Any:
    if isinstance(value, torch.fx.Node):
        return env[value.name]
    if isinstance(value, list | tuple):
        return type(value)(_subst(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _subst(v, env) for k, v in value.items()}
    if isinstance(value, torch.dtype | torch.device | torch.memory_format):
        return value
    return value


def _lower_call(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    env: dict[str, Any],
    value: Any,
    root: torch.nn.Module,
) -> OpNode | None:
    if fx_node.op == "call_module":
        path = str(fx_node.target)
        x = _subst(fx_node.args[0], env)
        call, call_args, call_kwargs = _module_call(root.get_submodule(path), path, x)
        op = call.rsplit(".", 1)[1]
    else:
        op = _canonical_name(fx_node)
        call_args = list(_subst(fx_node.args, env))
        call_kwargs = dict(_subst(fx_node.kwargs, env))
        call = (
            "." + str(fx_node.target) if fx_node.op == "call_method" else _qualname(fx_node.target)
        )
    info = lookup(op)
    if info is not None and isinstance(fx_node.target, torch._ops.OpOverload):
        call_args, call_kwargs = _by_schema_names(fx_node.target, call_args, call_kwargs, info)
    bound = info.bind(call_args, call_kwargs) if info is not None else {}
    if info is not None and info.kind == "view" and op in ("view", "permute", "expand"):
        rest = call_args[1:]
        bound = {"input": call_args[0], "shape": rest[0] if len(rest) == 1 else rest}
    if torch.is_tensor(value):
        shape, dtype = tuple(value.shape), str(value.dtype).removeprefix("torch.")
    else:
        shape, dtype = (), "tuple"
    op, bound, attrs = _variant(ir, op, bound, shape, call_args, env, fx_node)
    node = OpNode(fx_node.name, op, bound, shape, dtype, call, call_args, call_kwargs, attrs)
    if op == "identity_of":
        env[fx_node.name] = bound["input"]
        return None
    return node


def _variant(
    ir: ProgramIR,
    op: str,
    bound: dict[str, Any],
    shape: tuple[int, ...],
    call_args: list[Any],
    env: dict[str, Any],
    fx_node: torch.fx.Node,
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Pick the canonical variant an op's arguments select (gelu tanh, eval batch norm, ...)."""
    attrs: dict[str, Any] = {}
    info = lookup(op)
    if op == "gelu" and bound.get("approximate") == "tanh":
        return "gelu_tanh", bound, attrs
    if op == "div" and bound.get("rounding_mode") == "floor":
        return "div_floor", bound, attrs
    if op == "div" and bound.get("rounding_mode") == "trunc":
        return "div_trunc", bound, attrs
    if op in ("max", "min") and isinstance(bound.get("dim"), Ref):
        bound = {"input": bound["input"], "other": bound["dim"]}
        return ("maximum" if op == "max" else "minimum"), bound, attrs
    if op in ("max", "min") and bound.get("dim") is None:
        return ("amax" if op == "max" else "amin"), bound, attrs
    if op in ("max", "min"):
        attrs["returns_tuple"] = True
        return op, bound, attrs
    if op == "getitem" and isinstance(bound.get("input"), Ref):
        src = bound["input"]
        parent = _node_of(ir, src)
        if parent is not None and parent.op in ("max", "min") and parent.attrs.get("returns_tuple"):
            index = bound.get("index")
            if index == 0:
                new_op = "amax" if parent.op == "max" else "amin"
            else:
                new_op = "argmax" if parent.op == "max" else "argmin"
            return new_op, dict(parent.args), attrs
    if op == "batch_norm" and not bound.get("training"):
        channels = shape[1] if len(shape) > 1 else shape[0]
        per_channel = (channels,) + (1,) * max(len(shape) - 2, 0)
        attrs["bshape"] = {
            k: per_channel
            for k in ("running_mean", "running_var", "weight", "bias")
            if isinstance(bound.get(k), Ref)
        }
        return "batch_norm_eval", bound, attrs
    if op == "dropout" and bound.get("training") and bound.get("p", 0.5) > 0:
        return "dropout_train", bound, attrs
    if op == "norm" and bound.get("p") not in ("fro", 2, 2.0):
        return "norm_p", bound, attrs
    if op in ("softmax", "log_softmax") and bound.get("dim") is None:
        return f"{op}_implicit_dim", bound, attrs
    if op in ("to", "type_as", "type", "float") and isinstance(call_args[0], Ref):
        if ir.dtypes.get(call_args[0]) == str(fx_node.meta["sg_value"].dtype).removeprefix(
            "torch."
        ):
            return "identity_of", {"input": call_args[0]}, attrs
    if info is not None and info.kind == "identity":
        src = bound.get("input")
        if op == "contiguous" and isinstance(src, Ref) and not ir.is_contiguous(src):
            return "copy", {"input": src}, attrs
        if op == "dropout" and bound.get("training") and bound.get("p", 0.5) > 0:
            return "dropout_train", bound, attrs
        if isinstance(src, Ref):
            return "identity_of", {"input": src}, attrs
    return op, bound, attrs


def _node_of(ir: ProgramIR, ref: Ref) -> OpNode | None:
    if ref.kind != "node":
        return None
    return next((n for n in ir.nodes if n.name == ref.name), None)


def _to_meta(value: Any, ours: dict[Ref, Any]) -> Any:
    if isinstance(value, Ref):
        return ours[value]
    if isinstance(value, list | tuple):
        return type(value)(_to_meta(v, ours) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v, ours) for k, v in value.items()}
    return value


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
            return fx_node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - fall back to the reference's layout
            pass
    if torch.is_tensor(value):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if _is_tensor_seq(value):
        return type(value)(torch.empty(v.shape, dtype=v.dtype, device="meta") for v in value)
    return value


def _materialise_output(ir: ProgramIR, ref: Any, ours: dict[Ref, Any]) -> Ref:
    """Outputs must be fresh buffers: copy an input, a parameter or a strided view."""
    if not isinstance(ref, Ref):
        msg = f"the program returns a non-tensor value {ref!r}"
        raise CaptureError(msg)
    node = _node_of(ir, ref)
    is_view = node is not None and (info := lookup(node.op)) is not None and info.kind == "view"
    if ref.kind == "node" and not is_view:
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


_NEEDS_CONTIGUOUS = ("reduction", "norm", "softmax", "conv")
_RESHAPES = ("view", "flatten", "unflatten", "view_as")  # reshape is an alias of view


def _insert_copies(ir: ProgramIR) -> None:
    """Give anchors that read strided views a contiguous copy (a pointwise ``copy`` node)."""
    new_nodes: list[OpNode] = []
    for node in ir.nodes:
        info = lookup(node.op)
        keys: tuple[str, ...] = ()
        if info is not None and (info.kind in _NEEDS_CONTIGUOUS or node.op in _RESHAPES):
            keys = ("input",)
        elif info is not None and info.kind == "gemm" and node.op != "linear":
            keys = ("mat1", "mat2") if node.op == "addmm" else ("input", "other")
        for key in keys:
            src = node.args.get(key)
            needs = isinstance(src, Ref) and src.kind == "node" and not ir.is_contiguous(src)
            if needs and info.kind == "gemm":
                needs = matrix_layout(ir.shapes[src], ir.strides[src]) is None
            if needs:
                name = f"{node.name}_{key}"
                shape = ir.shapes[src]
                copy = OpNode(
                    name, "copy", {"input": src}, shape, ir.dtypes[src], ".contiguous", [src]
                )
                new_nodes.append(copy)
                ref = Ref("node", name)
                ir.shapes[ref] = shape
                ir.strides[ref] = contiguous_strides(shape)
                ir.dtypes[ref] = ir.dtypes[src]
                node.args = {**node.args, key: ref}
                node.call_args = [ref if a == src else a for a in node.call_args]
        new_nodes.append(node)
    ir.nodes = new_nodes


def _eliminate_dead(ir: ProgramIR) -> None:
    """Drop nodes nothing reads (e.g. the tuple-valued ``max`` once its getitems are lowered)."""
    while True:
        users = ir.users()
        dead = {n for n, u in users.items() if not u}
        if not dead:
            return
        ir.nodes = [n for n in ir.nodes if n.name not in dead]
