"""Assignment into a tensor in ``forward`` (``y[:, 0] = 0``, ``y[..., :8] = x``, ``y[m] = 0``,
``y[idx] += v``, and in-place ops on a view, ``y[:, 0].mul_(2)``) as a pure op: a new tensor
equal to ``y`` outside the assigned region.

Basic indexing (ints, slices with steps, ``...``) becomes one ``setitem`` node, an indexed
pointwise op that reads the value where the output coordinate is in the region and ``y``
elsewhere; a boolean mask of ``y``'s shape (or of its leading dims) with a scalar becomes a
``where``. The capture then
treats the assignment as an in-place write of ``y`` (``_capture_aliases``): later reads of ``y``
see the new tensor. Float32, int64 and bool tensors take values of their own kind. Advanced
indices by integer tensors on adjacent dims become a scatter (``_capture_indexing``); other
advanced indices, ``None`` and assignment into parameters stay refused.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_base import _subst, module_state
from stitch_graph.codegen._capture_builder import _all_or_nothing, _Builder
from stitch_graph.codegen._capture_indexing import index_put
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref, contiguous_strides

# the tensors assigned into, and the Python values each takes (a mask's ``m[:, :1] = True``)
_VALUES: dict[str, tuple[type, ...]] = {"float32": (int, float), "int64": (int,), "bool": (bool,)}


def _bound(value: Any, env: dict[str, Any]) -> Any:
    """A slice bound or an int with traced sizes folded to their values."""
    value = _subst(value, env)
    return value if value is None or isinstance(value, int) else None


def region(index: Any, shape: tuple[int, ...], env: dict[str, Any]) -> list[Any] | None:
    """Per dim of ``shape``: ``("all",)``, ``("slice", start, stop, step)`` or ``("int", k)``,
    normalised as Python normalises them; ``None`` for an index that is not basic."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(item is Ellipsis for item in items) > 1:
        return None
    if Ellipsis in items:
        at = items.index(Ellipsis)
        fill = len(shape) - (len(items) - 1)
        items = items[:at] + [slice(None)] * fill + items[at + 1 :]
    if len(items) > len(shape):
        return None
    items += [slice(None)] * (len(shape) - len(items))
    dims: list[Any] = []
    for item, size in zip(items, shape, strict=True):
        if isinstance(item, slice):
            raw = (item.start, item.stop, item.step)
            bounds = [_bound(v, env) for v in raw]
            if any(b is None and v is not None for b, v in zip(bounds, raw, strict=True)):
                return None  # a bound that is not a plain int
            start, stop, step = slice(*bounds).indices(size)
            if step <= 0:
                return None
            whole = start == 0 and stop == size and step == 1
            dims.append(("all",) if whole else ("slice", start, max(stop, start), step))
        else:
            k = _subst(item, env)
            if not isinstance(k, int) or isinstance(k, bool) or not -size <= k < size:
                return None
            dims.append(("int", k % size))
    return dims


def region_shape(dims: list[Any], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``y[index]``: int dims dropped, slices their lengths."""
    out = []
    for spec, size in zip(dims, shape, strict=True):
        if spec[0] == "all":
            out.append(size)
        elif spec[0] == "slice":
            _, start, stop, step = spec
            out.append(max(0, (stop - start + step - 1) // step))
    return tuple(out)


def lower_setitem(
    ir: ProgramIR,
    name: str,
    base: Any,
    index: Any,
    value: Any,
    env: dict[str, Any],
    ours: dict[Ref, Any],
) -> Ref | None:
    """``base`` with ``base[index] = value`` applied, as a new node ``name`` appended to
    ``ir``; ``None`` when the assignment is outside what this reproduces. ``base`` and
    ``value`` are lowered values (``Ref`` or a number), ``index`` the traced index."""
    dtype = ir.dtypes.get(base) if isinstance(base, Ref) else None
    if not isinstance(base, Ref) or dtype not in _VALUES:
        return None
    if module_state(base):
        return None  # a parameter or buffer of the module; a forward's own constant is new

    shape = tuple(ir.shapes[base])
    if isinstance(value, Ref):
        if ir.dtypes.get(value) != dtype:
            return None
    elif not isinstance(value, _VALUES[dtype]) or (dtype != "bool" and isinstance(value, bool)):
        return None
    mask = _subst(index, env)
    items = mask if isinstance(mask, tuple) else (mask,)
    lead = len(items) - 1  # y[:, m] = c: full slices before the mask
    masked = isinstance(items[-1], Ref) and ir.dtypes.get(items[-1]) == "bool"
    if masked and all(item == slice(None) for item in items[:-1]):
        mask = items[-1]
        held = tuple(ir.shapes[mask])
        if held != shape[lead : lead + len(held)]:
            return None
        if isinstance(value, Ref) and ir.shapes[value] != ():
            return None  # y[m] = v takes v's elements in mask order
        if held != shape:  # a mask of some dims (padded tokens of (B, T, D)): spread over y's
            if not ir.is_contiguous(mask):
                return None
            spread = [*[1] * lead, *held, *[1] * (len(shape) - lead - len(held))]
            mask = _append(ir, ours, OpNode(
                f"{name}_mask", "view", {"input": mask, "shape": spread}, tuple(spread),
                "bool", ".view", [mask, *spread], {},
            ))
        node = OpNode(
            name, "where", {"condition": mask, "input": value, "other": base}, shape,
            dtype, "torch.where", [mask, value, base], {},
        )
        return _append(ir, ours, node)
    if any(isinstance(item, Ref) for item in items):  # y[rows, cols] = v: a scatter
        b = _Builder(ir, ours, name)
        return _all_or_nothing(ir, lambda: index_put(ir, b, base, items, value, False))
    dims = region(index, shape, env)
    if dims is None:
        return None
    target = region_shape(dims, shape)
    if isinstance(value, Ref):
        vshape = tuple(ir.shapes[value])
        if len(vshape) > len(target) or any(
            v not in (1, t) for v, t in zip(reversed(vshape), reversed(target), strict=False)
        ):
            return None
    call_index = tuple(
        slice(None) if spec[0] == "all" else spec[1] if spec[0] == "int" else slice(*spec[1:])
        for spec in dims
    )
    node = OpNode(
        name, "setitem", {"input": base, "index": dims, "value": value}, shape,
        dtype, "setitem", [base, call_index, value], {},
    )
    return _append(ir, ours, node)


def viewed_base(view: torch.fx.Node) -> tuple[torch.fx.Node, Any] | None:
    """(base, index) when ``view`` is ``base[index]`` with a basic index, else ``None``: an
    in-place op on it writes that region of ``base``."""
    if view.op == "call_function" and view.target in _ATEN_VIEWS:
        return _exported_view(view)
    if view.op != "call_function" or view.target is not operator.getitem:
        return None
    base, index = view.args
    items = index if isinstance(index, tuple) else (index,)
    basic = all(
        isinstance(i, slice | int) or i is Ellipsis for i in items
    ) and not any(isinstance(i, bool) for i in items)
    return (base, index) if isinstance(base, torch.fx.Node) and basic else None


_ATEN_VIEWS = (torch.ops.aten.slice.Tensor, torch.ops.aten.select.int)


def _exported_view(view: torch.fx.Node) -> tuple[torch.fx.Node, Any] | None:
    """The exported ``u[1:-1, 1:-1]``, a chain of ``aten.slice`` and ``aten.select`` views, as
    (the tensor they view, one basic index into it)."""
    chain = []
    root = view
    while root.op == "call_function" and root.target in _ATEN_VIEWS:
        chain.append(root)
        root = root.args[0]
        if not isinstance(root, torch.fx.Node):
            return None
    value = root.meta.get("sg_value")
    if not torch.is_tensor(value):
        return None
    # per dim of the root: ("slice", start, step, length) or ("int", position)
    spec: list[list[Any]] = [["slice", 0, 1, n] for n in value.shape]
    live = list(range(value.dim()))
    for op in reversed(chain):
        args = list(op.args) + [None] * 5
        dim = int(args[1] if args[1] is not None else 0)
        if not live or not all(isinstance(a, int | type(None)) for a in args[1:5]):
            return None
        at = live[dim % len(live)]
        _, start, step, length = spec[at]
        if op.target is torch.ops.aten.select.int:
            spec[at] = ["int", start + (int(args[2]) % length) * step]
            live.remove(at)
            continue
        first, stop, stride = slice(args[2], args[3], args[4] or 1).indices(length)
        spec[at] = ["slice", start + first * step, step * stride, len(range(first, stop, stride))]
    index = tuple(
        d[1] if d[0] == "int" else slice(d[1], d[1] + (d[3] - 1) * d[2] + 1, d[2]) if d[3] else
        slice(d[1], d[1])
        for d in spec
    )
    return root, index


def _append(ir: ProgramIR, ours: dict[Ref, Any], node: OpNode) -> Ref:
    ir.nodes.append(node)
    ref = Ref("node", node.name)
    ours[ref] = torch.empty(node.shape, dtype=getattr(torch, node.dtype), device="meta")
    ir.shapes[ref] = tuple(node.shape)
    ir.strides[ref] = contiguous_strides(tuple(node.shape))
    ir.dtypes[ref] = node.dtype
    return ref


def assigned_view(fx_node: torch.fx.Node) -> torch.fx.Node | None:
    """For ``y[idx] += v`` (``tmp = y[idx]; tmp += v; y[idx] = tmp``): the in-place op that
    wrote ``y`` through the very view this assignment overwrites, else ``None``. Its write
    changed only the region the assignment replaces, so ``y``'s older value is still right
    everywhere else."""
    base, index, value = fx_node.args
    if not isinstance(value, torch.fx.Node) or not value.args:
        return None
    view = value.args[0]
    if (
        isinstance(view, torch.fx.Node)
        and view.op == "call_function"
        and view.target is operator.getitem
        and view.args[0] is base
        and view.args[1] == index
    ):
        return value
    return None
