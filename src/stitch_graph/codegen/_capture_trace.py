"""Tracing: build the task's ``Model`` on the meta device and turn its ``forward`` into a graph.

``torch.fx`` traces through every submodule but the normalisations, whose forwards branch on
sizes (they become functional calls, see ``_module_call``), and records ``x += y`` as a write;
``torch.export`` takes over when fx fails, and ``torch.export.draft_export`` on real inputs when
the forward's control flow reads tensor values (``_capture_guards``). ``_RecordingShapeProp``
then runs the graph on meta tensors and keeps every node's value (tensors for shapes and
storages, Python values for constant folding), so a problem with gigabytes of weights traces in
milliseconds.
"""

from __future__ import annotations

import inspect
import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

from stitch_graph.artifacts import Task
from stitch_graph.codegen._capture_aliases import _INPLACE_DUNDERS
from stitch_graph.codegen._capture_base import CaptureError
from stitch_graph.codegen._capture_guards import data_dependent, draft_export, quiet_export
from stitch_graph.codegen.ir import Ref
from stitch_graph.shapes import is_recurrent, recurrent_outputs

RealRun = Callable[[], tuple[torch.nn.Module, list[Any]]]
"""Builds the model on the CPU with real weights, and real inputs for it."""

_LEAF_MODULES = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
    torch.nn.GroupNorm,
    torch.nn.LayerNorm,
)


class _InplaceProxy(torch.fx.Proxy):
    """A proxy that records ``x += y`` as ``operator.iadd`` and ``y[k] = v`` as ``setitem``.

    ``torch.fx.Proxy`` has no ``__iadd__``, so Python runs ``x = x + y`` instead and the trace
    loses the write: after ``b = a; a += 1`` the graph would give ``b`` the old value.
    """


def _inplace_method(op: Any) -> Any:
    """A proxy dunder (``__iadd__``, ...) that records ``op`` in the graph."""
    def method(self: torch.fx.Proxy, other: Any) -> torch.fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    return method


for _op, _dunder in _INPLACE_DUNDERS.items():
    setattr(_InplaceProxy, _dunder, _inplace_method(_op))


def _setitem(self: torch.fx.Proxy, key: Any, value: Any) -> None:
    """``y[key] = value`` recorded as ``operator.setitem`` (``_capture_setitem`` lowers it)."""
    self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


_InplaceProxy.__setitem__ = _setitem  # type: ignore[method-assign]


class _ThroughTracer(torch.fx.Tracer):
    """Trace through submodules except normalisations, whose forwards branch on sizes, and
    LSTM/GRU layers given their initial state, which become one node with flat outputs
    ``(output, h_n[, c_n])`` (as ``torch.export`` gives them, without unrolling every step)."""

    # a buffer read in forward stays the buffer (its values come with the weights); folded
    # into a constant, ``~self.causal`` of 512 x 512 was too large to bake and ran as zeros
    proxy_buffer_attributes = True

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _LEAF_MODULES)

    def call_module(
        self, m: torch.nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if _made_in_forward(self, m):
            # ``nn.KLDivLoss(reduction="batchmean")(a, b)``: a module without state built in
            # forward is its forward's calls (fx would stop: it is not a submodule)
            return forward(*args, **kwargs)
        state = args[1] if len(args) > 1 else kwargs.get("hx")
        if not is_recurrent(m) or state is None or len(args) + len(kwargs) != 2:
            return super().call_module(m, forward, args, kwargs)
        name = "lstm" if isinstance(m, torch.nn.LSTM) else "gru"  # as the traced-through call
        flat = self.create_proxy("call_module", self.path_of_module(m), (args[0], state), {},
                                 name=name)
        if isinstance(m, torch.nn.LSTM):
            return flat[0], (flat[1], flat[2])
        return flat[0], flat[1]

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _InplaceProxy(node, self)


def _made_in_forward(tracer: torch.fx.Tracer, m: torch.nn.Module) -> bool:
    """Whether ``m`` is a stateless module that is not one of the traced model's."""
    if next(m.parameters(), None) is not None or next(m.buffers(), None) is not None:
        return False
    try:
        tracer.path_of_module(m)
    except NameError:
        return True
    return False


def _module_call(
    module: torch.nn.Module, path: str, x: Any, ndim: int, rest: tuple[Any, ...] = ()
) -> tuple[str, list[Any], dict[str, Any]]:
    """The functional call a leaf module stands for, with its tensors as ``Ref``; ``rest`` are
    the call's arguments after the first."""

    def param(name: str) -> Ref | None:
        return Ref("param", f"{path}.{name}") if getattr(module, name, None) is not None else None

    if is_recurrent(module):  # the aten op's arguments: input, hx, flat weights, sizes, flags
        state = list(rest[0]) if isinstance(rest[0], tuple | list) else rest[0]
        weights = [Ref("param", f"{path}.{name}") for name in module._flat_weights_names]
        flags = [module.bias, module.num_layers, float(module.dropout), module.training]
        op = "lstm" if isinstance(module, torch.nn.LSTM) else "gru"
        return f"torch.{op}", [x, state, weights, *flags, module.bidirectional,
                               module.batch_first], {}

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
        return super().call_function(target, _args_on_meta(args), _on_meta(kwargs))

    def call_method(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return super().call_method(target, _args_on_meta(args), _on_meta(kwargs))

    def call_module(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        module = self.fetch_attr(target)
        if is_recurrent(module):
            return recurrent_outputs(module, args[0])
        return super().call_module(target, args, kwargs)


def _args_on_meta(args: Any) -> Any:
    """Positional arguments with any device on meta: an export writes ``x.to(dtype=...,
    device=...)`` of a constant as ``aten.to.device(x, cpu, float32)``, which would copy out of
    a meta tensor."""
    if not any(isinstance(a, torch.device) for a in args):
        return args
    meta = torch.device("meta")
    return tuple(meta if isinstance(a, torch.device) else a for a in args)


def _on_meta(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments with any device (``.to(device=cpu)`` of an export) on meta."""
    if kwargs.get("device") not in (None, "meta", torch.device("meta")):
        return {**kwargs, "device": torch.device("meta")}
    return kwargs


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


def _real_inputs(namespace: dict[str, Any], meta_args: list[Any]) -> list[Any]:
    """CPU inputs with values, for a trace that must see them: ``get_inputs()`` seeded, else
    random tensors shaped like ``meta_args``."""
    torch.manual_seed(0)
    if "get_inputs" in namespace:
        return list(namespace["get_inputs"]())
    return [
        torch.randn(a.shape).to(a.dtype) if torch.is_tensor(a) else a for a in meta_args
    ]


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


def _export(
    model: torch.nn.Module, args: list[Any], real: RealRun | None = None
) -> torch.fx.GraphModule:
    """``torch.export`` of ``model``; where its control flow reads tensor values and ``real``
    gives a real model and inputs, the path those take (``_capture_guards``)."""
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
            with quiet_export():
                return torch.export.export(model, tuple(args)).module()
    except Exception as error:  # noqa: BLE001
        if real is not None and data_dependent(error):
            try:
                return draft_export(*real())
            except Exception as draft_error:  # noqa: BLE001
                error = draft_error
        msg = f"the fx trace does not run and torch.export failed ({error})"
        raise CaptureError(msg) from error


def _unpassed_defaults(model: torch.nn.Module, args: list[Any]) -> dict[str, Any]:
    """Forward's parameters that the task's inputs leave at their defaults (``h0=None``): fx
    would make them inputs, so such a forward goes to ``torch.export``, which calls it."""
    params = list(inspect.signature(model.forward).parameters.values())[len(args):]
    return {p.name: p.default for p in params
            if p.default is not inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD}


def _drop_inputs_after(graph: torch.fx.Graph, count: int) -> None:
    """Remove the placeholders past the first ``count`` (parameters fx traced as constants)
    and fx's checks that they are ``None``: the program's inputs are the task's."""
    for node in list(graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "_assert_is_none":
            graph.erase_node(node)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in placeholders[count:]:
        if node.users:
            msg = f"forward's parameter {node.target!r}, left at its default, is still read"
            raise CaptureError(msg)
        graph.erase_node(node)


def _trace(
    model: torch.nn.Module, args: list[Any], real: RealRun | None = None
) -> tuple[torch.fx.GraphModule, str]:
    try:
        # parameters the inputs leave at their defaults (``h0=None``) are traced as those
        # constants, not as inputs: fx takes an LSTM's ``if h0 is None`` branch in a second,
        # where torch.export traced the layer's steps for 30 s
        defaults = _unpassed_defaults(model, args)
        graph = _ThroughTracer().trace(model, concrete_args=defaults or None)
        if defaults:
            _drop_inputs_after(graph, len(args))
        return torch.fx.GraphModule(model, graph), "fx"
    except Exception as fx_error:  # noqa: BLE001 - any trace failure falls back to export
        try:
            return _export(model, args, real), "export"
        except Exception as export_error:  # noqa: BLE001
            msg = f"fx trace failed ({fx_error}); torch.export failed too ({export_error})"
            raise CaptureError(msg) from export_error
