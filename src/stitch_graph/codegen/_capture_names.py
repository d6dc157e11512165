"""Naming a traced call: its canonical registry op, the variant its arguments select, and how
host code spells it.

fx and ``torch.export`` name one computation many ways (``operator.iadd``, ``Tensor.add_``,
``aten.add.Tensor``, ``x.T`` as ``getattr``); the scheduler and the emitter know only the op
registry's canonical names, and the generated ``ModelNew`` may call only public PyTorch callables.
This module maps between the two: ``_canonical_name`` and ``_variant`` pick the registry op,
``_qualname``, ``_overload_call`` and ``_rewrite_call`` the call that host code makes.
"""

from __future__ import annotations

import builtins
import itertools
import operator
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_aliases import _mutated_arg
from stitch_graph.codegen._capture_base import CaptureError, _flat, _node_of
from stitch_graph.codegen.ir import ProgramIR, Ref
from stitch_graph.codegen.ops import GENERATED_DTYPES, REGISTRY, lookup

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
# mask | mask as a logical op, and mask &= other (traced as iand) too
_LOGICAL = {
    f"{prefix}{op}": f"logical_{op}" for op in ("or", "and", "xor") for prefix in ("", "i")
}
# a & b, torch.bitwise_and(a, b), a <<= s ... of integers
_BITWISE = {
    f"{prefix}{op}": f"bitwise_{name}"
    for op, name in (("and", "and"), ("or", "or"), ("xor", "xor"), ("lshift", "left_shift"),
                     ("left_shift", "left_shift"), ("rshift", "right_shift"),
                     ("right_shift", "right_shift"))
    for prefix in ("", "i")
}
_QUALNAMES: dict[int, str] = {}  # id of a public callable -> its dotted name, filled on first use


def _qualname(target: Any) -> str:
    """The dotted name host code calls ``target`` by (``torch.ops.<op>`` for an ATen overload)."""
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


# dropouts: identities outside training, random draws (left to PyTorch) in it
_DROPOUTS = frozenset(
    {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}
)


def _canonical_name(node: torch.fx.Node) -> str:
    """The registry name of a traced call: operators by their op, the trailing ``_`` of an
    in-place form dropped, aliases resolved (an unknown call keeps its own name)."""
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
    if name in ("numpy_T", "mT", "mH", "adjoint") and isinstance(first, Ref):
        nd = len(ir.shapes[first])  # properties, not methods: x.mT() does not run
        if name == "numpy_T" or nd == 2:
            return "permute", ".permute", [first, list(range(nd - 1, -1, -1))], {}
        return "transpose", ".transpose", [first, -2, -1], {}
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
    if name == "einsum":
        # ATen's contraction order (opt_einsum's, where installed) is no argument of
        # torch.einsum, which finds the same order itself
        call_kwargs = {k: v for k, v in call_kwargs.items() if k != "path"}
    return _canonical_name(fx_node), _overload_call(target, first), call_args, call_kwargs


def _same_padding(ir: ProgramIR, bound: dict[str, Any], nd: int) -> Any:
    """``padding='same'`` as the per-dim padding it means where that is symmetric (odd
    dilated kernels); otherwise left as ``'same'``, and the convolution stays in PyTorch
    (PyTorch pads the extra element on the far side only)."""
    weight = bound.get("weight")
    if not isinstance(weight, Ref):
        return "same"
    dilation = bound.get("dilation", 1)
    dilation = list(dilation) if isinstance(dilation, list | tuple) else [dilation] * nd
    totals = [int(d) * (k - 1) for d, k in zip(dilation, ir.shapes[weight][2:], strict=True)]
    return [t // 2 for t in totals] if all(t % 2 == 0 for t in totals) else "same"


def _progression_as_slice(
    items: tuple[Any, ...], shape: tuple[int, ...], fx_node: torch.fx.Node
) -> tuple[Any, ...] | None:
    """``x[:, [i, i + s, ...]]`` as ``x[:, i:j:s]``: the same values as a view, where PyTorch
    copies the list to the GPU on every call (a synchronising copy no CUDA graph captures).
    Only beside plain slices (an int index would move the dim) and where nothing writes the
    result in place (it would write ``x``)."""
    lists = [k for k, item in enumerate(items) if isinstance(item, list)]
    if len(lists) != 1 or not all(isinstance(i, slice) for i in items if not isinstance(i, list)):
        return None
    pos, values = lists[0], items[lists[0]]
    if pos >= len(shape) or not values or not all(type(v) is int for v in values):
        return None
    if any(-shape[pos] > v or v >= shape[pos] for v in values) or _written_in_place(fx_node):
        return None
    v = [x % shape[pos] for x in values]
    step = v[1] - v[0] if len(v) > 1 else 1
    if step < 1 or any(b - a != step for a, b in itertools.pairwise(v)):
        return None
    return (*items[:pos], slice(v[0], v[-1] + 1, step), *items[pos + 1 :])


def _written_in_place(fx_node: torch.fx.Node) -> bool:
    """Whether a reader of ``fx_node`` writes in place (``y[...] = v``, ``y += 1``,
    ``y.mul_(3)``, an ``out=``)."""
    return any(
        user.target is operator.setitem or _mutated_arg(user) is not None
        for user in fx_node.users
    )


# factories given a tensor for dtype and device (and shape): the plain factory they make
_FILLED_LIKE = {
    "new_zeros": "zeros", "zeros_like": "zeros", "new_empty": "zeros", "empty_like": "zeros",
    "new_ones": "ones", "ones_like": "ones", "new_full": "full", "full_like": "full",
}


def _generated_dtype(value: Any, bound: dict[str, Any]) -> bool:
    """Whether a factory's result is one the kernels write (the plain factory is then never
    left to PyTorch, whose call would still name the tensor) and its fill is a number."""
    fill = bound.get("fill_value", 0)
    plain_fill = isinstance(fill, int | float) and not isinstance(fill, bool)
    dtype = str(value.dtype).removeprefix("torch.") if torch.is_tensor(value) else None
    return dtype in GENERATED_DTYPES and plain_fill


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
    if op in ("conv1d", "conv2d", "conv3d") and bound.get("padding") == "same":
        bound = {**bound, "padding": _same_padding(ir, bound, int(op[-2]))}
    first = call_args[0] if call_args else None
    value = fx_node.meta.get("sg_value")
    if op in _FILLED_LIKE and isinstance(first, Ref) and _generated_dtype(value, bound):
        # the tensor gives only dtype and device (and shape): not an operand, so the kernel
        # that computes it need not run for this (``pe = h.new_zeros(t, d)``)
        filled = _FILLED_LIKE[op]
        plain = {"size": list(shape)}
        return filled, plain | ({"fill_value": bound["fill_value"]} if filled == "full" else {}), attrs
    data = call_args[1] if op == "new_tensor" and len(call_args) == 2 else None
    if isinstance(first, Ref) and isinstance(data, int | float) and not isinstance(data, bool) and (
        _generated_dtype(value, {}) and not shape
    ):  # ``one = scores.new_tensor(1)``: a number of the tensor's dtype (or the call's)
        return "full", {"size": [], "fill_value": data}, attrs
    if op in ("bitwise_not", "invert") and isinstance(first, Ref) and ir.dtypes.get(first) == "bool":
        return "logical_not", {"input": first}, attrs  # ~mask; on integers it stays in PyTorch
    name = op.removeprefix("bitwise_").strip("_")  # and_, __and__ (ATen), __iand__
    if name in _LOGICAL and len(call_args) == 2 and all(
        isinstance(v, Ref) and ir.dtypes.get(v) == "bool" for v in call_args
    ):
        return _LOGICAL[name], {"input": call_args[0], "other": call_args[1]}, attrs  # mask | mask
    integer = torch.is_tensor(value) and value.dtype in (torch.int64, torch.int32)
    if integer and name in _BITWISE and len(call_args) == 2:
        return _BITWISE[name], {"input": call_args[0], "other": call_args[1]}, attrs
    if integer and op in ("bitwise_not", "invert") and isinstance(first, Ref):
        return "bitwise_not", {"input": first}, attrs
    if op == "div" and bound.get("rounding_mode") == "floor":
        return "div_floor", bound, attrs
    if op == "div" and bound.get("rounding_mode") == "trunc":
        return "div_trunc", bound, attrs
    if op in ("max", "min") and isinstance(bound.get("dim"), Ref):
        bound = {"input": bound["input"], "other": bound["dim"]}
        return ("maximum" if op == "max" else "minimum"), bound, attrs
    if op in ("max", "min") and bound.get("dim") is None:
        return ("amax" if op == "max" else "amin"), bound, attrs
    if op in ("max", "min", "cummax", "cummin"):
        attrs["returns_tuple"] = True  # values and indices: each a getitem of its own
        return op, bound, attrs
    if op == "getitem" and isinstance(bound.get("input"), Ref):
        src = bound["input"]
        parent = _node_of(ir, src)
        if parent is not None and bound.get("index") in (0, 1):
            # PyTorch's call, where the op that replaces this element stays there: the
            # parent's call and its element (the parent itself is then dead)
            attrs["torch_call"] = (parent.call, list(parent.call_args), dict(parent.call_kwargs))
            attrs["tuple_element"] = bound["index"]
        if parent is not None and parent.op in ("cummax", "cummin") and bound.get("index") in (0, 1):
            element = "values" if bound["index"] == 0 else "indices"
            return f"{parent.op}_{element}", dict(parent.args), attrs  # a scan each
        pooled = parent.op.removesuffix("_with_indices") if parent is not None else ""
        pool = lookup(pooled) if pooled in ("max_pool1d", "max_pool2d", "max_pool3d") else None
        if pool is not None and bound.get("index") in (0, 1):  # the values or the indices
            kwargs = {k: v for k, v in parent.call_kwargs.items() if k != "return_indices"}
            op = pooled if bound["index"] == 0 else f"{pooled}_indices"
            return op, lookup(op).bind(list(parent.call_args), kwargs), attrs
        if parent is not None and parent.op.startswith("adaptive_max_pool") and bound.get(
            "index"
        ) == 0 and ir.dtypes.get(src) == "tuple":  # an export's (values, indices): the values
            return parent.op, {k: v for k, v in parent.args.items() if k != "return_indices"}, attrs
        if parent is not None and parent.op in ("max", "min") and parent.attrs.get("returns_tuple"):
            index = bound.get("index")
            if index == 0:
                new_op = "amax" if parent.op == "max" else "amin"
            else:
                new_op = "argmax" if parent.op == "max" else "argmin"
            return new_op, dict(parent.args), attrs
        attrs.pop("torch_call", None)
        attrs.pop("tuple_element", None)
        index = bound.get("index")
        items = index if isinstance(index, tuple) else (index,)
        sliced = _progression_as_slice(items, ir.shapes.get(src, ()), fx_node)
        if sliced is not None and isinstance(call_args, list) and len(call_args) == 2:
            call_args[1] = sliced
            return "getitem", {**bound, "index": sliced}, attrs
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
    if op in _DROPOUTS and bound.get("training") and bound.get("p", 0.5) > 0:
        return "dropout_train", bound, attrs  # random: left to PyTorch, declared
    if op == "rrelu" and not bound.get("training") and isinstance(bound.get("input"), Ref):
        slope = (float(bound.get("lower", 0.125)) + float(bound.get("upper", 1 / 3))) / 2
        return "leaky_relu", {"input": bound["input"], "negative_slope": slope}, attrs
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
    if op in ("to", "type_as", "type", "float", "long", "int", "bool") and call_args and isinstance(
        call_args[0], Ref
    ):
        target = str(fx_node.meta["sg_value"].dtype).removeprefix("torch.")
        if ir.dtypes.get(call_args[0]) == target:
            return "identity_of", {"input": call_args[0]}, attrs
        cast = {"float32": "float", "int64": "long", "int32": "int", "bool": "bool"}.get(target)
        if cast is not None:  # a mask made a float (or a float an index) for arithmetic
            return cast, {"input": call_args[0]}, attrs
    if info is not None and info.kind == "identity":
        src = bound.get("input")
        if op == "contiguous" and isinstance(src, Ref) and not ir.is_contiguous(src):
            return "copy", {"input": src}, attrs
        if op in _DROPOUTS and bound.get("training") and bound.get("p", 0.5) > 0:
            return "dropout_train", bound, attrs
        if isinstance(src, Ref):
            return "identity_of", {"input": src}, attrs
    return op, bound, attrs
