"""Rewrites of the traced fx graph, between shape propagation and lowering, for two forms the
lowering reads only when they are spelled another way:

- ``return torch.max(x, 1)`` (a tuple-valued call returned whole, not unpacked): its
  elements become ``getitem`` nodes of the output, as ``v, i = torch.max(x, 1)`` gives them;
- ``x[i]`` with ``i`` a 0-dim integer tensor (``x[s.argmax()]``): PyTorch turns it into
  ``select(x, 0, i.item())``, which meta tensors cannot answer; ``x[i.reshape(1)]`` with the
  indexed dim squeezed is the same gather and keeps ``i`` on the GPU;
- ``torch.cov(x)``, which has no meta kernel: the steps ATen's ``cov`` takes (each row's mean
  subtracted, the product with the transpose, divided by ``N - correction``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx


def split_returned_tuple(gm: torch.fx.GraphModule) -> bool:
    """The output's one tuple-valued node replaced by a tuple of its elements; False where the
    output is no such node."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    returned = out.args[0]
    value = returned.meta.get("sg_value") if isinstance(returned, torch.fx.Node) else None
    if not isinstance(value, tuple | list) or not value:
        return False
    if not all(torch.is_tensor(v) for v in value):
        return False
    with gm.graph.inserting_before(out):
        items = tuple(
            gm.graph.call_function(operator.getitem, (returned, k)) for k in range(len(value))
        )
    out.args = (items,)
    gm.recompile()
    return True


def index_by_one_element(gm: torch.fx.GraphModule) -> bool:
    """Every ``x[..., i, ...]`` whose one tensor index is a 0-dim integer tensor rewritten as
    ``x[..., i.reshape(1), ...].squeeze(d)``; False where there is none. Reads the values a
    propagation that stopped at such an index recorded for the nodes before it."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not operator.getitem:
            continue
        base, index = node.args
        items = index if isinstance(index, tuple) else (index,)
        tensors = [k for k, item in enumerate(items) if isinstance(item, torch.fx.Node)]
        shape = getattr(base.meta.get("sg_value") if isinstance(base, torch.fx.Node) else None,
                        "shape", None)
        if len(tensors) != 1 or shape is None or not _scalar_integer(items[tensors[0]]):
            continue
        k = tensors[0]
        dim = _dims_before(items[:k], items, len(shape))
        if dim is None:
            continue
        with gm.graph.inserting_before(node):
            one = gm.graph.call_method("reshape", (items[k], 1))
            picked_index = (*items[:k], one, *items[k + 1 :]) if isinstance(index, tuple) else one
            picked = gm.graph.call_function(operator.getitem, (base, picked_index))
            squeezed = gm.graph.call_method("squeeze", (picked, dim))
        node.replace_all_uses_with(squeezed)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()
    return changed


def _scalar_integer(node: torch.fx.Node) -> bool:
    value = node.meta.get("sg_value")
    return (
        torch.is_tensor(value)
        and value.dim() == 0
        and not value.is_floating_point()
        and not value.is_complex()
        and value.dtype != torch.bool
    )


def _dims_before(before: tuple[Any, ...], items: tuple[Any, ...], ndim: int) -> int | None:
    """The result dim the tensor index lands on: one for each slice or ``None`` before it,
    none for an int, and the dims an ``...`` stands for; ``None`` for any other item."""
    consumed = sum(1 for item in items if item is not None and item is not Ellipsis)
    dim = 0
    for item in before:
        if isinstance(item, slice) or item is None:
            dim += 1
        elif item is Ellipsis:
            dim += ndim - consumed
        elif not isinstance(item, int) or isinstance(item, bool):
            return None
    return dim


def decompose_cov(gm: torch.fx.GraphModule) -> bool:
    """Every unweighted ``torch.cov`` of a matrix with several rows rewritten as its steps, and
    every ``torch.corrcoef`` as that covariance over the outer product of its rows' standard
    deviations, clipped to [-1, 1], as PyTorch computes it (its own steps test a value on the
    host, which no trace can take); False where there is none."""
    changed = False
    for node in list(gm.graph.nodes):
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        called = node.op == "call_method" or node.target in (torch.cov, torch.corrcoef)
        if not called or name not in ("cov", "corrcoef"):
            continue
        x = node.args[0]
        kwargs = dict(node.kwargs)
        correction = 1 if name == "corrcoef" else (
            node.args[1] if len(node.args) > 1 else kwargs.pop("correction", 1))
        value = x.meta.get("sg_value") if isinstance(x, torch.fx.Node) else None
        if len(node.args) > 2 or any(kwargs.get(k) is not None for k in ("fweights", "aweights")):
            continue
        if not torch.is_tensor(value) or value.dim() != 2 or value.shape[0] < 2:
            continue
        with gm.graph.inserting_before(node):
            mean = gm.graph.call_method("mean", (x,), {"dim": 1, "keepdim": True})
            centred = gm.graph.call_function(operator.sub, (x, mean))
            product = gm.graph.call_function(
                torch.matmul, (centred, gm.graph.call_method("t", (centred,)))
            )
            cov = gm.graph.call_function(
                operator.truediv, (product, value.shape[1] - int(correction))
            )
            if name == "corrcoef":
                spread = gm.graph.call_function(torch.sqrt, (gm.graph.call_method("diagonal", (cov,)),))
                rows = gm.graph.call_method("view", (spread, -1, 1))
                cols = gm.graph.call_method("view", (spread, 1, -1))
                scaled = gm.graph.call_function(
                    operator.truediv,
                    (gm.graph.call_function(operator.truediv, (cov, rows)), cols),
                )
                cov = gm.graph.call_function(torch.clip, (scaled, -1.0, 1.0))
        node.replace_all_uses_with(cov)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()
    return changed
