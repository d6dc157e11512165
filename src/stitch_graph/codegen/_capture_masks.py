"""Selections by a boolean mask that are only reduced, or only copied under the same mask,
rewritten to shapes that do not depend on the data.

``loss[mask].mean()``, ``x[x > 0].sum()``, ``torch.masked_select(x, m).sum()`` or a masked mean
over rows (``feats[keep].mean(0)``) select a number of elements known only at run time, so
shape propagation on meta tensors stops there and the whole problem failed to capture. Where
every use of the selection is a sum, mean, max or min over everything (or a sum, mean, amax or
amin over the selected dim), the selection is the same as the masked tensor with the other
elements filled (zero, or an infinity for max and min), and a mean divides by the mask's
count: ``x[m].mean()`` is ``where(m, x, 0).sum() / (m.sum() * rest)``. An empty mask gives
PyTorch's results: a zero sum, a NaN mean. ``y[m] = x[m]`` is ``y[...] = where(m, x, y)``, on
the fx path and on ``torch.export``'s (``aten.index`` then ``aten.index_put_``).

The rewrite is made where propagation stopped, with the shapes of the values before it, and
propagation runs again.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min"}
# what the unselected elements become, so that the reduction does not see them
_FILL = {"sum": 0, "mean": 0, "amax": -math.inf, "max": -math.inf, "amin": math.inf, "min": math.inf}
_DATA_DEPENDENT = {"nonzero", "argwhere", "masked_select", "index", "unique", "_unique2",
                   "unique_consecutive", "unique_dim", "bincount"}
_FUNCTIONS = {torch.sum: "sum", torch.mean: "mean", torch.amax: "amax", torch.amin: "amin",
              torch.max: "max", torch.min: "min"}


def rewrite_masked_selection(gm: torch.fx.GraphModule) -> bool:
    """Rewrite the selection where propagation stopped; whether there was one to rewrite."""
    node = next((n for n in gm.graph.nodes if "sg_value" not in n.meta), None)
    if node is None or node.op != "call_function":
        return False
    if _copied_under_mask(gm, node) or _exported_copy_under_mask(gm, node):
        return True
    selection = _selection(node)
    if selection is None:
        return False
    x, mask = selection
    if _elementwise_first(gm, node, x):
        return True
    x_value, mask_value = x.meta.get("sg_value"), mask.meta.get("sg_value")
    if not (torch.is_tensor(x_value) and torch.is_tensor(mask_value)):
        return False
    if mask_value.dtype != torch.bool or mask_value.dim() > x_value.dim():
        return False
    masked_dims = mask_value.dim()
    if tuple(x_value.shape[:masked_dims]) != tuple(mask_value.shape):
        return False  # a mask that broadcasts (masked_select's may) counts differently
    uses = [_reduced_dims(use, masked_dims, x_value.dim()) for use in node.users]
    if not node.users or any(dims is None for dims in uses):
        return False
    names = [_name(use) for use in node.users]
    extremes = {name for name in names if _FILL[name] != 0}
    if extremes and x_value.dtype != torch.float32:
        return False  # the fill of the unselected elements is an infinity
    rest = math.prod(x_value.shape[masked_dims:])
    graph = gm.graph
    kept_by_fill: dict[float, torch.fx.Node] = {}
    with graph.inserting_before(node):
        keep = mask
        if mask_value.dim() < x_value.dim():
            trailing = (1,) * (x_value.dim() - mask_value.dim())
            keep = graph.call_method("reshape", (mask, (*mask_value.shape, *trailing)))
        for fill in {_FILL[name] for name in names}:
            kept_by_fill[fill] = graph.call_function(torch.where, (keep, x, fill))
    for use, name, dims in zip(list(node.users), names, uses, strict=True):
        kept = kept_by_fill[_FILL[name]]
        with graph.inserting_before(use):
            reduction = "sum" if name == "mean" else {"max": "amax", "min": "amin"}.get(name, name)
            result = graph.call_method(reduction, (kept, dims) if dims else (kept,))
            if name == "mean":
                count = graph.call_method("sum", (mask, dims) if dims else (mask,))
                if not dims:
                    count = graph.call_function(operator.mul, (count, rest))
                result = graph.call_function(torch.div, (result, count))
        use.replace_all_uses_with(result)
        graph.erase_node(use)
    graph.erase_node(node)
    _recompiled(gm)
    return True


def _mask_after_slices(
    x: Any, items: list[Any]
) -> tuple[torch.fx.Node, int, tuple[int, ...], torch.Tensor] | None:
    """(the mask, the full slices before it, its shape, ``x``'s value) where ``x[items]`` is a
    boolean mask of ``x``'s dims after full slices, else ``None``."""
    mask, lead = items[-1], len(items) - 1
    if not isinstance(x, torch.fx.Node) or not isinstance(mask, torch.fx.Node):
        return None
    if any(item != slice(None) for item in items[:-1]):
        return None
    x_value, mask_value = x.meta.get("sg_value"), mask.meta.get("sg_value")
    if not (torch.is_tensor(x_value) and torch.is_tensor(mask_value)):
        return None
    held = tuple(mask_value.shape)
    if mask_value.dtype != torch.bool or tuple(x_value.shape[lead:lead + len(held)]) != held:
        return None
    return mask, lead, held, x_value


def _copied_under_mask(gm: torch.fx.GraphModule, selection: torch.fx.Node) -> bool:
    """``y[..., m] = x[..., m]`` (full slices, then a boolean mask; every use of the selection
    such an assignment into a ``y`` of ``x``'s shape) rewritten as ``y[...] = where(m, x, y)``:
    the same elements, at a fixed shape. Whether it was one."""
    if selection.target is not operator.getitem or not selection.users:
        return False
    x, index = selection.args
    found = _mask_after_slices(x, list(index) if isinstance(index, tuple) else [index])
    if found is None:
        return False
    mask, lead, held, x_value = found
    for use in selection.users:
        if use.op != "call_function" or use.target is not operator.setitem:
            return False
        y, assigned, value = use.args
        y_value = y.meta.get("sg_value") if isinstance(y, torch.fx.Node) else None
        if value is not selection or assigned != index or not torch.is_tensor(y_value):
            return False
        if tuple(y_value.shape) != tuple(x_value.shape) or y_value.dtype != x_value.dtype:
            return False
    graph = gm.graph
    spread = (*(1,) * lead, *held, *(1,) * (x_value.dim() - lead - len(held)))
    for use in list(selection.users):
        y = use.args[0]
        with graph.inserting_before(use):
            keep = graph.call_method("reshape", (mask, spread))
            kept = graph.call_function(torch.where, (keep, x, y))
        use.args = (y, Ellipsis, kept)
    graph.erase_node(selection)
    _recompiled(gm)
    return True


_ATEN = torch.ops.aten
_SIZE_CHECKS = (_ATEN.sym_size.int, operator.ge, operator.le, _ATEN._assert_scalar.default)


def _exported_copy_under_mask(gm: torch.fx.GraphModule, selection: torch.fx.Node) -> bool:
    """The exported ``out[m] = med[m]`` (``aten.index`` then ``aten.index_put_`` with the same
    indices; the export's checks of the selection's size aside) as ``out.copy_(where(m, med,
    out))``. Whether it was one."""
    if selection.target is not _ATEN.index.Tensor:
        return False
    x, indices = selection.args
    found = _mask_after_slices(x, [slice(None) if i is None else i for i in indices])
    if found is None:
        return False
    mask, lead, held, x_value = found
    checks, puts = _size_checks(selection), []
    if any(u not in checks for check in checks for u in check.users):
        return False  # the size is read for something else
    for use in selection.users:
        if use in checks:
            continue
        put = use.target in (_ATEN.index_put_.default, _ATEN.index_put.default)
        if not put or use.args[2] is not selection or list(use.args[1]) != list(indices):
            return False
        if len(use.args) > 3 and use.args[3]:
            return False  # accumulate
        y_value = use.args[0].meta.get("sg_value")
        if not torch.is_tensor(y_value) or tuple(y_value.shape) != tuple(x_value.shape):
            return False
        puts.append(use)
    graph = gm.graph
    spread = [*(1,) * lead, *held, *(1,) * (x_value.dim() - lead - len(held))]
    for put in puts:
        y = put.args[0]
        with graph.inserting_before(put):
            keep = graph.call_function(_ATEN.reshape.default, (mask, spread))
            kept = graph.call_function(_ATEN.where.self, (keep, x, y))
        put.target, put.args, put.kwargs = _ATEN.copy_.default, (y, kept), {}
    for check in reversed(checks):
        graph.erase_node(check)
    graph.erase_node(selection)
    _recompiled(gm)
    return True


def _size_checks(selection: torch.fx.Node) -> list[torch.fx.Node]:
    """The export's checks of a selection's size: its ``sym_size`` and the comparisons and
    assertions on it, in graph order; each read by no other node."""
    found: list[torch.fx.Node] = []
    todo = [u for u in selection.users if u.target is _ATEN.sym_size.int]
    while todo:
        node = todo.pop()
        if node.target not in _SIZE_CHECKS or node in found:
            continue
        found.append(node)
        todo.extend(node.users)
    order = {n: k for k, n in enumerate(selection.graph.nodes)}
    return sorted(found, key=order.__getitem__)


def _recompiled(gm: torch.fx.GraphModule) -> None:
    """The rewritten graph's code regenerated, and its shapes dropped for propagation again."""
    gm.recompile()
    for n in gm.graph.nodes:
        n.meta.pop("sg_value", None)


def data_dependent_hint(gm: torch.fx.GraphModule) -> str:
    """What to change where propagation stopped on an op whose size depends on the data
    (``nonzero``, a selection by a mask put to another use), or ``""``."""
    node = next((n for n in gm.graph.nodes if "sg_value" not in n.meta), None)
    if node is None:
        return ""
    name = str(getattr(node.target, "__name__", node.target)).split(".")[0]
    if name not in _DATA_DEPENDENT and _selection(node) is None:
        return ""
    return (
        f" ({node.name}: its size depends on the values of a tensor. A selection by a boolean "
        "mask is generated where it is only summed, averaged, or reduced by max or min; "
        "otherwise write it with a fixed shape, e.g. torch.where(mask, x, 0))"
    )


# ops of one tensor and numbers, applied element by element: the same on the selected elements
# as on all of them, selected after
_ELEMENTWISE = {
    operator.pow, operator.mul, operator.truediv, operator.add, operator.sub, operator.neg,
    torch.pow, torch.abs, torch.square, torch.exp, torch.log, torch.sqrt, torch.relu,
    torch.sigmoid, torch.tanh, "pow", "abs", "square", "exp", "log", "sqrt", "relu", "sigmoid",
    "tanh", "neg",
}


def _elementwise_first(gm: torch.fx.GraphModule, node: torch.fx.Node, x: torch.fx.Node) -> bool:
    """``f(x[m])`` rewritten as ``f(x)[m]`` where the selection's one use is an elementwise op
    ``f`` of it and numbers (``c[off].pow(2).sum()``), so that the selection's use is what ``f``
    fed, a reduction; whether it was."""
    if len(node.users) != 1:
        return False
    use = next(iter(node.users))
    if use.op not in ("call_function", "call_method") or use.target not in _ELEMENTWISE:
        return False
    if not use.args or use.args[0] is not node or any(
        isinstance(a, torch.fx.Node) for a in [*use.args[1:], *use.kwargs.values()]
    ):
        return False
    graph = gm.graph
    with graph.inserting_before(node):
        first = graph.create_node(use.op, use.target, (x, *use.args[1:]), dict(use.kwargs))
    node.replace_input_with(x, first)
    use.replace_all_uses_with(node)
    graph.erase_node(use)
    _recompiled(gm)
    return True


def _selection(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """``(x, mask)`` of ``x[mask]`` or ``torch.masked_select(x, mask)``."""
    if node.target is operator.getitem or node.target is torch.masked_select:
        x, mask = node.args[0], node.args[1]
        if isinstance(x, torch.fx.Node) and isinstance(mask, torch.fx.Node):
            return x, mask
    return None


def _name(use: torch.fx.Node) -> str | None:
    """The reduction a use is (``sum``, ``mean``, ``amax``, ...), or ``None``."""
    if use.op == "call_method":
        return use.target if use.target in _REDUCTIONS else None
    return _FUNCTIONS.get(use.target) if use.op == "call_function" else None


def _reduced_dims(use: torch.fx.Node, masked: int, ndim: int) -> tuple[int, ...] | None:
    """The dims of the masked tensor a use reduces: ``()`` for everything, the masked dims
    for a reduction over the selected dim 0; ``None`` for any other use."""
    if _name(use) is None:
        return None
    args, kwargs = list(use.args[1:]), dict(use.kwargs)
    if kwargs.pop("dtype", None) is not None or kwargs.pop("keepdim", False):
        return None
    dim = kwargs.pop("dim", args.pop(0) if args else None)
    if kwargs or args:
        return None
    if dim is None:
        return ()
    if _name(use) in ("max", "min"):
        return None  # with a dim, values and indices
    dims = dim if isinstance(dim, list | tuple) else (dim,)
    if list(dims) in ([0], [-1]) and masked == ndim:  # the selection is flat
        return ()
    if list(dims) == [0] and masked < ndim:  # over the selected elements, per trailing slot
        return tuple(range(masked))
    return None
