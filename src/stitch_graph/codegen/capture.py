"""Capture a KernelBench program as ``ProgramIR``: trace it, propagate shapes, normalise its ops.

The reference is executed only symbolically: the model is built on the meta device (rebuilt on the
CPU under ``torch.manual_seed(0)`` only when it holds constants whose values the host code needs),
traced with ``torch.fx.symbolic_trace`` through every submodule but the normalisations
(``torch.export`` when fx fails or its graph does not run, its ATen calls spelled with public
callables in host code), and
shapes come from ``ShapeProp`` on meta tensors, so a problem with gigabytes of weights captures in
milliseconds. Every call becomes a canonical op (``F.gelu(x, approximate="tanh")`` ->
``gelu_tanh``, ``x.sum(1)`` -> ``sum``, ``nn.BatchNorm2d`` in eval -> ``batch_norm_eval``, ``x.T``
-> ``permute``, a global average pool -> ``mean``) with its arguments bound to the op registry's
signature names; composite calls (losses, distances, attention, two-operand ``einsum``) are
decomposed into registry ops, constants built in ``forward`` are baked, and in-place ops
(``x += y`` included) rebind the tensor they write and its whole aliases; a later read of a view or
base they changed is refused. Unknown calls keep all their arguments and stay in PyTorch.
"""

from __future__ import annotations

import builtins
import math
import operator
import warnings
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
from stitch_graph.codegen.ops import REGISTRY, OpInfo, lookup, parse_signature

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
    operator.imod: "remainder",
    operator.ifloordiv: "div_floor",
    operator.ipow: "pow",
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
_INPLACE_DUNDERS: dict[Any, str] = {
    operator.iadd: "__iadd__",
    operator.isub: "__isub__",
    operator.imul: "__imul__",
    operator.itruediv: "__itruediv__",
    operator.ifloordiv: "__ifloordiv__",
    operator.imod: "__imod__",
    operator.ipow: "__ipow__",
}
_MAX_BAKED = 1 << 16  # elements of a constant tensor we are willing to bake into host code


class CaptureError(RuntimeError):
    """The program could not be traced or its shapes could not be propagated."""


class _PropagationError(CaptureError):
    """The traced graph does not run on meta tensors."""


_LEAF_MODULES = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
    torch.nn.GroupNorm,
    torch.nn.LayerNorm,
)


class _InplaceProxy(torch.fx.Proxy):
    """A proxy that records ``x += y`` as ``operator.iadd``.

    ``torch.fx.Proxy`` has no ``__iadd__``, so Python runs ``x = x + y`` instead and the trace
    loses the write: after ``b = a; a += 1`` the graph would give ``b`` the old value.
    """


def _inplace_method(op: Any) -> Any:
    def method(self: torch.fx.Proxy, other: Any) -> torch.fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    return method


for _op, _dunder in _INPLACE_DUNDERS.items():
    setattr(_InplaceProxy, _dunder, _inplace_method(_op))


class _ThroughTracer(torch.fx.Tracer):
    """Trace through submodules except normalisations, whose forwards branch on sizes."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _LEAF_MODULES)

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _InplaceProxy(node, self)


def _module_call(
    module: torch.nn.Module, path: str, x: Any, ndim: int
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
    if isinstance(module, torch.nn.modules.instancenorm._InstanceNorm):
        if ndim == module._get_no_batch_dim():
            msg = f"{path}: {type(module).__name__} on an unbatched input is not supported"
            raise CaptureError(msg)
        use_input_stats = module.training or not module.track_running_stats
        args = [x, param("running_mean"), param("running_var"), param("weight"), param("bias")]
        kwargs = {
            "use_input_stats": use_input_stats,
            "momentum": module.momentum or 0.0,
            "eps": module.eps,
        }
        return "torch.nn.functional.instance_norm", args, kwargs
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

    def call_function(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return super().call_function(target, args, _on_meta(kwargs))

    def call_method(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return super().call_method(target, args, _on_meta(kwargs))


def _on_meta(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments with any device (``.to(device=cpu)`` of an export) on meta."""
    if kwargs.get("device") not in (None, "meta", torch.device("meta")):
        return {**kwargs, "device": torch.device("meta")}
    return kwargs


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


def _meta_model(namespace: dict[str, Any], init_args: list[Any]) -> torch.nn.Module:
    try:
        return _build_model(namespace, init_args, "meta")
    except Exception:  # noqa: BLE001 - e.g. .item() on a meta tensor in __init__: build on the CPU
        return _build_model(namespace, init_args, "cpu").to("meta")


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


def _graph_to_meta(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Parameters, buffers and plain tensor attributes the graph reads, moved to meta."""
    gm = gm.to("meta")
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        *path, leaf = str(node.target).split(".")
        owner: Any = gm
        for part in path:
            owner = getattr(owner, part)
        value = getattr(owner, leaf, None)
        if torch.is_tensor(value) and value.device.type != "meta":
            if isinstance(value, torch.nn.Parameter):
                continue
            try:
                setattr(owner, leaf, value.to("meta"))
            except Exception:  # noqa: BLE001, S112 - leave an attribute that cannot be set
                continue
    return gm


def _returns_leaf(gm: torch.fx.GraphModule) -> bool:
    """Whether an exported module's forward returns one tensor (its graph returns a tuple)."""
    codegen = getattr(gm.graph, "_codegen", None)
    spec = getattr(getattr(codegen, "pytree_info", None), "out_spec", None)
    return spec is not None and getattr(spec, "type", tuple) is None


def _export(model: torch.nn.Module, args: list[Any]) -> torch.fx.GraphModule:
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for m in model.modules() for v in vars(m).values() if torch.is_tensor(v)]
    if any(t.device.type == "cpu" for t in tensors):
        # a model that lives on the CPU (its constants hold values): export it on fake CPU
        # inputs rather than on meta ones, whose device would not match
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True):
            args = [
                torch.empty(a.shape, dtype=a.dtype) if torch.is_tensor(a) else a for a in args
            ]
    try:
        with warnings.catch_warnings():
            # nn.LSTM/GRU keep their weights in a plain list as well: export says so, harmlessly
            warnings.filterwarnings("ignore", message="The tensor attributes", category=UserWarning)
            return torch.export.export(model, tuple(args)).module()
    except Exception as error:  # noqa: BLE001
        msg = f"the fx trace does not run and torch.export failed ({error})"
        raise CaptureError(msg) from error


def _trace(model: torch.nn.Module, args: list[Any]) -> tuple[torch.fx.GraphModule, str]:
    try:
        graph = _ThroughTracer().trace(model)
        return torch.fx.GraphModule(model, graph), "fx"
    except Exception as fx_error:  # noqa: BLE001 - any trace failure falls back to export
        try:
            return _export(model, args), "export"
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
    model = _meta_model(namespace, init_args)
    args, in_dtypes = _meta_inputs(task, namespace)
    gm, method = _trace(model, args)
    state = model.state_dict()
    needs_values = any(n.op == "get_attr" and n.target not in state for n in gm.graph.nodes) or any(
        name in m._non_persistent_buffers_set
        for _, m in model.named_modules()
        for name in m._buffers
    )
    on_meta = any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])

    def fresh() -> torch.nn.Module:
        if needs_values and on_meta:
            return _build_model(namespace, init_args, "cpu")
        return _meta_model(namespace, init_args)

    if needs_values and on_meta:
        model = fresh()
        gm, method = _trace(model, args)
        state = model.state_dict()
    try:
        return _lower(task, model, gm, method, args, in_dtypes, state)
    except _PropagationError:
        if method != "fx":
            raise
    # the fx graph does not run (a forward that assigns module attributes, say): export a
    # freshly built model instead (the trace may have changed the old one)
    model = fresh()
    gm = _export(model, args)
    return _lower(task, model, gm, "export", args, in_dtypes, model.state_dict())


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
    try:
        _RecordingShapeProp(meta_gm).propagate(*args)
    except Exception as error:  # noqa: BLE001
        msg = f"shape propagation on meta tensors failed: {error}"
        raise _PropagationError(msg) from error
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
            msg = f"{fx_node.name}: assignment into a tensor (x[...] = v) in forward is not supported"
            raise CaptureError(msg)
        if not torch.is_tensor(value) and not _is_tensor_seq(value):
            env[fx_node.name] = value  # sizes, shapes and other Python values fold to constants
            continue
        writes.check_reads(fx_node)
        mutated = _mutated_arg(fx_node)
        before = env.get(mutated.name) if mutated is not None else None
        _lower_node(ir, fx_node, env, ours, value, model)
        if mutated is not None:
            writes.write(ir, fx_node, mutated, before, env)
        writes.record(fx_node)
    _eliminate_dead(ir)
    _insert_copies(ir)
    return ir


def _lower_node(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    env: dict[str, Any],
    ours: dict[Ref, Any],
    value: Any,
    model: torch.nn.Module,
) -> None:
    """Lower one traced call with a tensor result: bind it in ``env``, append its node."""
    if _bake_factory(ir, fx_node, env, ours, value):
        return
    decomposed = _decompose(ir, fx_node, env, ours) if torch.is_tensor(value) else None
    if decomposed is not None:
        env[fx_node.name] = decomposed
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
    spec = ParamSpec(
        f"_const_{fx_node.name}",
        tuple(tensor.shape),
        str(tensor.dtype).removeprefix("torch."),
        buffer=True,
        persistent=False,
        value=tensor.flatten().tolist(),
    )
    ir.params.append(spec)
    ref = Ref("param", spec.name)
    ir.shapes[ref] = spec.shape
    ir.strides[ref] = contiguous_strides(spec.shape)
    ir.dtypes[ref] = spec.dtype
    ours[ref] = torch.empty(spec.shape, dtype=tensor.dtype, device="meta")
    env[fx_node.name] = ref
    return True


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    if isinstance(value, dict):
        return _flat(list(value.values()))
    return [value]


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _mutated_arg(fx_node: torch.fx.Node) -> torch.fx.Node | None:
    """The traced tensor an op writes in place (``x.relu_()``, ``F.relu(x, inplace=True)``,
    ``x += y``, ``torch.add(a, b, out=x)``), else None."""
    out = fx_node.kwargs.get("out")
    if isinstance(out, torch.fx.Node):
        return out
    target = fx_node.target
    name = (
        target.overloadpacket.__name__
        if isinstance(target, torch._ops.OpOverload)
        else str(target) if fx_node.op == "call_method" else getattr(target, "__name__", "")
    )
    inplace = (
        (name.endswith("_") and not name.endswith("__"))
        or fx_node.kwargs.get("inplace") is True
        or target in _INPLACE_DUNDERS
    )
    first = fx_node.args[0] if fx_node.args else None
    return first if inplace and isinstance(first, torch.fx.Node) else None


def _storages(value: Any) -> list[int]:
    """Identities of the storages behind a traced value (a tensor or a sequence of them)."""
    tensors = [value] if torch.is_tensor(value) else [v for v in _flat(value) if torch.is_tensor(v)]
    return [t.untyped_storage()._cdata for t in tensors]


def _same_tensor(a: Any, b: Any) -> bool:
    """Whether two traced meta tensors are one view of one storage: the same elements."""
    return (
        torch.is_tensor(a)
        and torch.is_tensor(b)
        and a.untyped_storage()._cdata == b.untyped_storage()._cdata
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


class _Writes:
    """Keeps the pure IR honest about in-place writes.

    A ``Ref`` names one value, but an in-place op changes a storage, and every traced tensor on
    that storage (the written tensor, its aliases, its views, its base) can see the change.
    Storages come from the meta tensors of shape propagation, so aliasing is PyTorch's own
    (``b.contiguous()`` of a contiguous ``b`` is ``b``; ``reshape`` of a transposed tensor is a
    copy). After a write, the tensors that are the written tensor itself (same storage, offset,
    shape and strides) are rebound to the op's result; any other tensor on the storage is out of
    date, and a later read of it is refused rather than lowered to a wrong program.
    """

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}  # storage -> in-place writes so far
        self.writer: dict[int, str] = {}  # storage -> the last op that wrote it
        self.seen: dict[str, dict[int, int]] = {}  # fx node -> versions its Ref holds
        self.nodes: list[torch.fx.Node] = []

    def record(self, fx_node: torch.fx.Node, *, initial: bool = False) -> None:
        """``fx_node``'s Ref holds its storages as they are now (as first given: ``initial``)."""
        value = fx_node.meta.get("sg_value")
        stores = _storages(value)
        if not stores:
            return
        self.seen[fx_node.name] = {s: 0 if initial else self.versions.get(s, 0) for s in stores}
        self.nodes.append(fx_node)

    def check_reads(self, fx_node: torch.fx.Node) -> None:
        """Refuse ``fx_node`` if it reads a tensor an in-place op has changed under its Ref."""
        for arg in fx_node.all_input_nodes:
            for store, version in self.seen.get(arg.name, {}).items():
                if self.versions.get(store, 0) != version:
                    msg = (
                        f"{fx_node.name}: reads {arg.name} after the in-place op "
                        f"{self.writer[store]} wrote into its storage through another alias or "
                        "view; such writes are not supported"
                    )
                    raise CaptureError(msg)

    def write(
        self,
        ir: ProgramIR,
        fx_node: torch.fx.Node,
        mutated: torch.fx.Node,
        before: Any,
        env: dict[str, Any],
    ) -> None:
        """``fx_node`` wrote ``mutated`` in place; ``before`` was its Ref until then."""
        after = env.get(fx_node.name)
        if isinstance(before, Ref) and after == before:
            return  # an identity (dropout in eval): nothing changed
        written = mutated.meta.get("sg_value")
        for store in _storages(written):
            self.versions[store] = self.versions.get(store, 0) + 1
            self.writer[store] = fx_node.name
        if isinstance(before, Ref) and before.kind == "input":
            ir.notes.append(
                f"{fx_node.name}: writes into input {before.name} in place; the generated "
                "program leaves its inputs unchanged"
            )
        if not isinstance(after, Ref) or (isinstance(before, Ref) and before.kind == "param"):
            return  # a dropped buffer update, or state that outlives the call: not rebound
        for other in self.nodes:
            ref = env.get(other.name)
            if not isinstance(ref, Ref) or ref.kind == "param":
                continue
            if _same_tensor(other.meta.get("sg_value"), written):
                env[other.name] = after
                self.seen[other.name] = {s: self.versions[s] for s in _storages(written)}
        self.seen[mutated.name] = {s: self.versions[s] for s in _storages(written)}
        env[mutated.name] = after


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


_FACTORIES = frozenset(
    {"tensor", "as_tensor", "scalar_tensor", "full", "zeros", "ones", "arange", "linspace", "eye"}
)
# ATen overloads (programs captured by torch.export) whose public callable is not torch.<name>
_ATEN_IDENTITIES = frozenset({"alias", "lift_fresh_copy", "lift_fresh", "detach", "clone"})


def _overload_call(target: Any, first: Any) -> str:
    """A public callable for an ATen overload, for host code (``torch.ops`` is not for programs).

    Tensor methods and ``torch.<name>`` take the arguments in the schema's order; the
    ``torch._C._nn`` functions are exposed as ``torch.nn.functional``, the ``linalg_``, ``special_``
    and ``fft_`` families under their namespaces.
    """
    import torch.nn.functional as F  # noqa: N812

    name = target.overloadpacket.__name__
    arguments = target._schema.arguments
    is_self = bool(arguments) and arguments[0].name == "self"  # where(condition, ...) is not
    if isinstance(first, Ref) and is_self and not name.startswith("_") and hasattr(torch.Tensor, name):  # noqa: E501
        return "." + name
    if callable(getattr(torch._C._VariableFunctions, name, None)) and hasattr(torch, name):
        return f"torch.{name}"
    if hasattr(torch._C._nn, name) and hasattr(F, name):
        return f"torch.nn.functional.{name}"
    for prefix, space in (("linalg_", "linalg"), ("special_", "special"), ("fft_", "fft")):
        rest = name.removeprefix(prefix)
        if name.startswith(prefix) and callable(getattr(getattr(torch, space), rest, None)):
            return f"torch.{space}.{rest}"
    return f"torch.ops.{target}"


def fx_node_call(fx_node: torch.fx.Node) -> str:
    """How host code spells the traced call (a method, a public function or an ATen op)."""
    if fx_node.op == "call_method":
        return "." + str(fx_node.target)
    if isinstance(fx_node.target, torch._ops.OpOverload):
        return _overload_call(fx_node.target, None)
    return _qualname(fx_node.target)


def _rewrite_call(
    ir: ProgramIR, fx_node: torch.fx.Node, call_args: list[Any], call_kwargs: dict[str, Any]
) -> tuple[str, str, list[Any], dict[str, Any]] | None:
    """``(op, call, args, kwargs)`` for calls that need another spelling in host code.

    ``x.T`` / ``x.mT`` (traced as ``getattr``) become ``permute`` / ``transpose``, ``x.data`` an
    identity; an ATen ``slice`` becomes basic indexing; other ATen overloads get their public
    callable. ``None``: keep the traced call.
    """
    target = fx_node.target
    first = call_args[0] if call_args else None
    if target is builtins.getattr and isinstance(first, Ref) and len(call_args) == 2:
        attr = call_args[1]
        if ir.dtypes.get(first) == "tuple" and attr in ("values", "indices"):
            # torch.max(x, dim).values: the named tuple's fields are its items 0 and 1
            return "getitem", "operator.getitem", [first, int(attr == "indices")], {}
        nd = len(ir.shapes[first])
        if attr in ("T", "H") or (attr in ("mT", "mH") and nd == 2):
            return "permute", ".permute", [first, list(range(nd - 1, -1, -1))], {}
        if attr in ("mT", "mH"):
            return "transpose", ".transpose", [first, -2, -1], {}
        if attr in ("data", "real"):
            return "identity", ".detach", [first], {}
        return f"getattr_{attr}", "getattr", list(call_args), {}
    if target is torch.nn.functional.unfold:  # im2col, not the Tensor.unfold view
        return "im2col", "torch.nn.functional.unfold", call_args, call_kwargs
    name = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else ""
    if (str(target) == "copy_" or name == "copy_") and len(call_args) >= 2:
        dst, src = call_args[0], call_args[1]
        if isinstance(dst, Ref) and isinstance(src, Ref) and ir.shapes[dst] == ir.shapes[src]:
            return "copy", ".clone", [src], {}  # dst.copy_(src) holds src's values
        return "copy_", fx_node_call(fx_node), call_args, call_kwargs
    if not isinstance(target, torch._ops.OpOverload):
        return None
    if name in _ATEN_IDENTITIES and isinstance(first, Ref):
        return "identity", ".detach", [first], {}
    if name == "index" and isinstance(first, Ref) and len(call_args) == 2:
        # aten.index(x, [i, None, j]) is x[i, :, j] (Tensor.index is something else)
        index = tuple(slice(None) if i is None else i for i in call_args[1])
        return "getitem", "operator.getitem", [first, index], {}
    if name == "slice" and isinstance(first, Ref):
        given = list(call_args[1:5])
        dim, start, end, step = given + [0, None, None, 1][len(given) :]
        dim = call_kwargs.get("dim", dim)
        start, end = call_kwargs.get("start", start), call_kwargs.get("end", end)
        step = call_kwargs.get("step", step)
        nd = len(ir.shapes[first])
        index = tuple(
            [slice(None)] * (int(dim) % nd)
            + [slice(start, end if end is None or end < 2**62 else None, step)]
        )
        return "getitem", "operator.getitem", [first, index], {}
    return _canonical_name(fx_node), _overload_call(target, first), call_args, call_kwargs


def _lower_call(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    env: dict[str, Any],
    value: Any,
    root: torch.nn.Module,
) -> OpNode | None:
    bind_args: list[Any] | None = None
    bind_kwargs: dict[str, Any] = {}
    if fx_node.op == "call_module":
        path = str(fx_node.target)
        x = _subst(fx_node.args[0], env)
        ndim = len(ir.shapes[x]) if isinstance(x, Ref) else 0
        call, call_args, call_kwargs = _module_call(root.get_submodule(path), path, x, ndim)
        op = call.rsplit(".", 1)[1]
    else:
        call_args = list(_subst(fx_node.args, env))
        call_kwargs = dict(_subst(fx_node.kwargs, env))
        rewritten = _rewrite_call(ir, fx_node, call_args, call_kwargs)
        if rewritten is not None:
            op, call, call_args, call_kwargs = rewritten
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
        index = bound.get("index")
        items = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, Ref) for i in _flat(list(items))):
            # advanced indexing with a tensor copies: not a view
            return "index", {"input": src, "indices": items}, attrs
    if op == "index_select" and isinstance(bound.get("dim"), int):
        dim = bound["dim"] % max(len(ir.shapes.get(bound["input"], ())), 1)
        return "index", {"input": bound["input"], "indices": (*[slice(None)] * dim, bound["index"])}, attrs  # noqa: E501
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
    if op.startswith(("adaptive_avg_pool", "adaptive_max_pool")) and isinstance(
        bound.get("input"), Ref
    ):
        nd = int(op[-2])
        if len(shape) > nd and all(d == 1 for d in shape[-nd:]) and not bound.get("return_indices"):
            # a global pooling is a reduction over the spatial dims (rows of warps or blocks)
            reduced = "mean" if "avg" in op else "amax"
            dims = list(range(-nd, 0))
            return reduced, {"input": bound["input"], "dim": dims, "keepdim": True}, attrs
    if op == "linalg_vector_norm" and bound.get("ord") in (2, 2.0):
        keep = {"input": bound["input"], "p": 2, "dim": bound.get("dim"), "keepdim": bound.get("keepdim", False)}  # noqa: E501
        return "norm", keep, attrs
    if op == "norm" and bound.get("p") not in ("fro", 2, 2.0):
        return "norm_p", bound, attrs
    if op in ("softmax", "log_softmax") and bound.get("dim") is None:
        return f"{op}_implicit_dim", bound, attrs
    if op in ("to", "type_as", "type", "float") and call_args and isinstance(call_args[0], Ref):
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


_NEEDS_CONTIGUOUS = ("reduction", "norm", "softmax", "conv", "pool", "scan")
_RESHAPES = ("view", "flatten", "unflatten", "view_as")  # reshape is an alias of view


def _insert_copies(ir: ProgramIR) -> None:
    """Give anchors that read strided views a contiguous copy (a pointwise ``copy`` node)."""
    new_nodes: list[OpNode] = []
    for node in ir.nodes:
        info = lookup(node.op)
        keys: tuple[str, ...] = ()
        if info is not None and (info.kind in _NEEDS_CONTIGUOUS or node.op in _RESHAPES):
            keys = ("input",)
        elif info is not None and info.kind == "gemm":
            gemm_keys = {"addmm": ("mat1", "mat2"), "linear": ("input", "weight")}
            keys = gemm_keys.get(node.op, ("input", "other"))
        for key in keys:
            src = node.args.get(key)
            needs = isinstance(src, Ref) and src.kind == "node" and not ir.is_contiguous(src)
            if needs and info.kind == "gemm" and node.op != "linear":
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


# ---- decompositions: composite functional calls lowered to registry ops ------------------------


class _Builder:
    """Appends canonical nodes for a decomposed call, shapes from meta tensors."""

    def __init__(self, ir: ProgramIR, ours: dict[Ref, Any], name: str) -> None:
        self.ir, self.ours, self.name, self.count = ir, ours, name, 0

    def __call__(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Ref:
        meta_args = _to_meta(list(args), self.ours)
        meta_kwargs = _to_meta(dict(kwargs), self.ours)
        if isinstance(fn, str):
            meta = getattr(meta_args[0], fn)(*meta_args[1:], **meta_kwargs)
            call = "." + fn
        else:
            meta = fn(*meta_args, **meta_kwargs)
            call = _qualname(fn)
        self.count += 1
        name = f"{self.name}__{self.count}"
        info = lookup(op)
        if info is None:
            msg = f"decomposition uses {op}, which is not in the op registry"
            raise CaptureError(msg)
        bound = info.bind(list(args), dict(kwargs))
        if info.kind == "view" and op in ("view", "permute", "expand"):
            rest = list(args[1:])
            bound = {"input": args[0], "shape": rest[0] if len(rest) == 1 else rest}
        dtype = str(meta.dtype).removeprefix("torch.")
        node = OpNode(name, op, bound, tuple(meta.shape), dtype, call, list(args), dict(kwargs))
        self.ir.nodes.append(node)
        ref = Ref("node", name)
        layout = meta if info.kind == "view" else torch.empty(meta.shape, dtype=meta.dtype, device="meta")  # noqa: E501
        self.ours[ref] = layout
        self.ir.shapes[ref] = tuple(layout.shape)
        self.ir.strides[ref] = tuple(layout.stride())
        self.ir.dtypes[ref] = dtype
        return ref


def _reduce_loss(b: _Builder, elem: Ref, reduction: Any, batch: int | None = None) -> Ref | None:
    if reduction == "none":
        return elem
    if reduction == "mean":
        return b("mean", torch.mean, elem)
    if reduction == "sum":
        return b("sum", torch.sum, elem)
    if reduction == "batchmean" and batch:
        return b("div", torch.div, b("sum", torch.sum, elem), float(batch))
    return None


_DECOMPOSE_SIGNATURES = {
    "mse_loss": "input, target, size_average=None, reduce=None, reduction='mean', weight=None",
    "l1_loss": "input, target, size_average=None, reduce=None, reduction='mean'",
    "smooth_l1_loss": "input, target, size_average=None, reduce=None, reduction='mean', beta=1.0",
    "huber_loss": "input, target, reduction='mean', delta=1.0, weight=None",
    "soft_margin_loss": "input, target, size_average=None, reduce=None, reduction='mean'",
    "kl_div": "input, target, size_average=None, reduce=None, reduction='mean', log_target=False",
    "binary_cross_entropy": "input, target, weight=None, size_average=None, reduce=None, reduction='mean'",  # noqa: E501
    "binary_cross_entropy_with_logits": "input, target, weight=None, size_average=None, reduce=None, reduction='mean', pos_weight=None",  # noqa: E501
    "cross_entropy": "input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean', label_smoothing=0.0",  # noqa: E501
    "nll_loss": "input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean'",  # noqa: E501
    "pairwise_distance": "x1, x2, p=2.0, eps=1e-06, keepdim=False",
    "cosine_similarity": "x1, x2, dim=1, eps=1e-08",
    "triplet_margin_loss": "anchor, positive, negative, margin=1.0, p=2, eps=1e-06, swap=False, size_average=None, reduce=None, reduction='mean'",  # noqa: E501
    "scaled_dot_product_attention": "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False",  # noqa: E501
}
# elementwise losses: (registry op of the 'none' reduction, extra arguments it takes)
_ELEMENTWISE_LOSSES = {
    "mse_loss": ("mse_elem", ()),
    "l1_loss": ("l1_elem", ()),
    "smooth_l1_loss": ("smooth_l1_elem", ("beta",)),
    "huber_loss": ("huber_elem", ("delta",)),
    "soft_margin_loss": ("soft_margin_elem", ()),
    "kl_div": ("kl_div_elem", ("log_target",)),
    "binary_cross_entropy": ("bce_elem", ()),
    "binary_cross_entropy_with_logits": ("bce_logits_elem", ()),
}


def _decompose(
    ir: ProgramIR, fx_node: torch.fx.Node, env: dict[str, Any], ours: dict[Ref, Any]
) -> Ref | None:
    """Lower a composite call (a loss, a distance, attention, einsum) to registry ops.

    Returns the Ref of the result, or ``None`` (nothing appended) when the call is not one of
    them or its arguments are outside what the decomposition reproduces exactly.
    """
    if fx_node.op not in ("call_function", "call_method"):
        return None
    name = _canonical_name(fx_node)
    args = list(_subst(fx_node.args, env))
    kwargs = dict(_subst(fx_node.kwargs, env))
    if name == "einsum":
        return _decompose_einsum(ir, fx_node, args, ours)
    if name == "embedding" and fx_node.op == "call_function" and len(args) >= 2:
        idx, weight = args[0], args[1]
        plain = all(v in (None, False, 2.0) for v in [*args[2:], *kwargs.values()])
        if isinstance(idx, Ref) and isinstance(weight, Ref) and plain:
            b = _Builder(ir, ours, fx_node.name)
            return b("index", operator.getitem, weight, (idx,))
    signature = _DECOMPOSE_SIGNATURES.get(name)
    if signature is None or fx_node.op != "call_function":
        return None
    info = OpInfo(name, "unsupported", signature, params=parse_signature(signature))
    a = info.bind(args, kwargs)
    refs = [v for k, v in a.items() if isinstance(v, Ref)]
    if not refs or any(ir.dtypes.get(r) not in ("float32", "int64", "bool") for r in refs):
        return None
    count = len(ir.nodes)
    b = _Builder(ir, ours, fx_node.name)
    try:
        result = _decompose_call(ir, b, name, a)
    except Exception:  # noqa: BLE001 - shapes the rule does not cover: keep the call
        result = None
    if result is None:
        del ir.nodes[count:]
    return result


def _decompose_call(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    F = torch.nn.functional  # noqa: N806
    if a.get("size_average") is not None or a.get("reduce") is not None:
        return None  # legacy reduction flags
    if name in _ELEMENTWISE_LOSSES:
        op, extra = _ELEMENTWISE_LOSSES[name]
        x, t = a["input"], a["target"]
        if not isinstance(x, Ref) or not isinstance(t, Ref) or a.get("weight") is not None:
            return None
        if a.get("pos_weight") is not None or ir.dtypes[x] != "float32":
            return None
        if ir.shapes[x] != ir.shapes[t] or ir.dtypes[t] != "float32":
            return None
        if name == "smooth_l1_loss" and float(a["beta"]) == 0.0:
            op, extra = "l1_elem", ()
        fn = getattr(F, name)
        elem = b(op, fn, x, t, reduction="none", **{k: a[k] for k in extra})
        batch = ir.shapes[x][0] if ir.shapes[x] else 1
        return _reduce_loss(b, elem, a["reduction"], batch)
    if name in ("cross_entropy", "nll_loss"):
        x, t = a["input"], a["target"]
        if a.get("weight") is not None or float(a.get("label_smoothing") or 0.0) != 0.0:
            return None
        if not isinstance(x, Ref) or not isinstance(t, Ref) or ir.dtypes[t] != "int64":
            return None
        xs, ts = ir.shapes[x], ir.shapes[t]
        if len(xs) < 2 or ts != (xs[0], *xs[2:]) or ir.dtypes[x] != "float32":
            return None
        index = b("unsqueeze", "unsqueeze", t, 1)
        picked = b("squeeze", "squeeze", b("gather", torch.gather, x, 1, index), 1)
        if name == "cross_entropy":
            loss = b("sub", torch.sub, b("logsumexp", torch.logsumexp, x, 1), picked)
        else:
            loss = b("neg", torch.neg, picked)
        valid = b("ne", torch.ne, t, int(a["ignore_index"]))
        elem = b("where", torch.where, valid, loss, 0.0)
        if a["reduction"] == "mean":
            count = b("sum", torch.sum, b("float", "float", valid))
            return b("div", torch.div, b("sum", torch.sum, elem), count)
        return _reduce_loss(b, elem, a["reduction"])
    if name == "pairwise_distance":
        return _distance(ir, b, a["x1"], a["x2"], a["p"], a["eps"], bool(a["keepdim"]))
    if name == "triplet_margin_loss":
        if a["swap"]:
            return None
        anchor, pos, neg = a["anchor"], a["positive"], a["negative"]
        d_pos = _distance(ir, b, anchor, pos, a["p"], a["eps"], False)
        d_neg = _distance(ir, b, anchor, neg, a["p"], a["eps"], False)
        if d_pos is None or d_neg is None:
            return None
        gap = b("sub", torch.sub, b("add", torch.add, d_pos, float(a["margin"])), d_neg)
        return _reduce_loss(b, b("clamp_min", torch.clamp_min, gap, 0.0), a["reduction"])
    if name == "cosine_similarity":
        x1, x2 = a["x1"], a["x2"]
        if ir.shapes[x1] != ir.shapes[x2] or ir.dtypes[x1] != "float32":
            return None
        dim, eps = int(a["dim"]), float(a["eps"])
        n1 = b("clamp_min", torch.clamp_min, b("norm", torch.norm, x1, 2, dim, True), eps)
        n2 = b("clamp_min", torch.clamp_min, b("norm", torch.norm, x2, 2, dim, True), eps)
        prod = b("mul", torch.mul, b("div", torch.div, x1, n1), b("div", torch.div, x2, n2))
        return b("sum", torch.sum, prod, dim)
    if name == "scaled_dot_product_attention":
        q, k, v = a["query"], a["key"], a["value"]
        if a["attn_mask"] is not None or float(a["dropout_p"]) != 0.0 or a["is_causal"]:
            return None
        if a["enable_gqa"] or not all(isinstance(r, Ref) for r in (q, k, v)):
            return None
        qs, ks = ir.shapes[q], ir.shapes[k]
        if len(qs) < 2 or qs[:-2] != ks[:-2] or ir.dtypes[q] != "float32":
            return None
        scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(qs[-1])
        scores = b("matmul", torch.matmul, q, b("transpose", "transpose", k, -2, -1))
        probs = b("softmax", torch.softmax, b("mul", torch.mul, scores, float(scale)), -1)
        return b("matmul", torch.matmul, probs, v)
    return None


def _distance(
    ir: ProgramIR, b: _Builder, x1: Any, x2: Any, p: Any, eps: Any, keepdim: bool
) -> Ref | None:
    """``pairwise_distance``: the p-norm of ``x1 - x2 + eps`` over the last dim (p = 2)."""
    if not isinstance(x1, Ref) or not isinstance(x2, Ref) or float(p) != 2.0:
        return None
    if ir.dtypes[x1] != "float32" or ir.dtypes[x2] != "float32" or len(ir.shapes[x1]) < 1:
        return None
    diff = b("add", torch.add, b("sub", torch.sub, x1, x2), float(eps))
    return b("norm", torch.norm, diff, 2, -1, keepdim)


def _decompose_einsum(
    ir: ProgramIR, fx_node: torch.fx.Node, args: list[Any], ours: dict[Ref, Any]
) -> Ref | None:
    """A two-operand einsum that is a (batched, broadcast) matrix product -> ``matmul``.

    Operands ``A[..., m, c]`` and ``B[..., c, n]`` (or ``B[..., n, c]``, read transposed) with
    one contracted letter ``c`` and an output ``...mn``, batch letters shared right-aligned.
    """
    if len(args) != 3 or not isinstance(args[0], str):
        return None
    eq, x, y = args[0].replace(" ", ""), args[1], args[2]
    if not isinstance(x, Ref) or not isinstance(y, Ref) or "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    if lhs.count(",") != 1:
        return None
    s1, s2 = lhs.split(",")
    if any(len(set(s)) != len(s) for s in (s1, s2, out)) or len(s1) < 2 or len(s2) < 2:
        return None
    if ir.dtypes[x] != "float32" or ir.dtypes[y] != "float32":
        return None
    c = s1[-1]
    transpose = s2[-1] == c
    n = s2[-2] if transpose else s2[-1]
    if (s2[-1] if transpose else s2[-2]) != c or c in out or n in s1:
        return None
    batch2 = s2[:-2]
    if out != s1[:-1] + n or s1[-2] in s2 or batch2 != s1[len(s1) - 2 - len(batch2) : -2]:
        return None
    count = len(ir.nodes)
    b = _Builder(ir, ours, fx_node.name)
    try:
        other = b("transpose", "transpose", y, -2, -1) if transpose else y
        return b("matmul", torch.matmul, x, other)
    except Exception:  # noqa: BLE001
        del ir.nodes[count:]
        return None
