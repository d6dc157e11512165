"""The builder decompositions write with: canonical nodes appended to the program, shapes from
meta tensors, constants baked; and the reduction a loss's ``reduction`` argument asks for."""

from __future__ import annotations

from typing import Any

import torch

from stitch_graph.codegen._capture_base import (
    _MAX_BAKED,
    BAKED_PREFIX,
    CaptureError,
    _bake,
    _meta,
    _to_meta,
)
from stitch_graph.codegen._capture_names import _qualname
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import lookup


class Metas(dict):  # type: ignore[type-arg]
    """Meta tensors of a finished program's values, made on first use: what a ``_Builder``
    that rewrites the program after its capture reads its operands' layouts from."""

    def __init__(self, ir: ProgramIR) -> None:
        super().__init__()
        self.ir = ir

    def __missing__(self, ref: Ref) -> Any:
        self[ref] = _meta(self.ir, ref)
        return self[ref]


class _Builder:
    """Appends canonical nodes for a decomposed call, shapes from meta tensors."""

    def __init__(self, ir: ProgramIR, ours: dict[Ref, Any], name: str) -> None:
        self.ir, self.ours, self.name, self.count = ir, ours, name, 0

    def __call__(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Ref:
        return self.element(0, op, fn, *args, **kwargs)

    def element(self, element: int, op: str, fn: Any, *args: Any, **kwargs: Any) -> Ref:
        """A node for ``op``; where ``fn`` returns a tuple (values, indices), the node is its
        ``element`` (PyTorch's call, where the op stays there, is indexed the same)."""
        meta_args = _to_meta(list(args), self.ours)
        meta_kwargs = _to_meta(dict(kwargs), self.ours)
        if isinstance(fn, str):
            meta = getattr(meta_args[0], fn)(*meta_args[1:], **meta_kwargs)
            call = "." + fn
        else:
            meta = fn(*meta_args, **meta_kwargs)
            call = getattr(fn, "host_call", None) or _qualname(fn)
        pair = isinstance(meta, tuple)
        meta = meta[element] if pair else meta
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
        if pair:
            node.attrs["tuple_element"] = element
        self.ir.nodes.append(node)
        ref = Ref("node", name)
        layout = meta if info.kind == "view" else torch.empty(meta.shape, dtype=meta.dtype, device="meta")  # noqa: E501
        self.ours[ref] = layout
        self.ir.shapes[ref] = tuple(layout.shape)
        self.ir.strides[ref] = tuple(layout.stride())
        self.ir.dtypes[ref] = dtype
        return ref

    def constant(self, tensor: torch.Tensor) -> Ref:
        """``tensor`` baked into the program as a non-persistent buffer (small ones only)."""
        if tensor.numel() > _MAX_BAKED:
            msg = f"a constant of {tensor.numel()} elements is too large to bake"
            raise CaptureError(msg)
        self.count += 1
        return _bake(self.ir, self.ours, f"{BAKED_PREFIX}{self.name}__{self.count}", tensor)


def _all_or_nothing(ir: ProgramIR, build: Any) -> Any:
    """What ``build()`` returns; or ``None``, with every node it appended removed, when it
    returns ``None`` or raises (shapes the rule does not cover: the call stays in PyTorch)."""
    count = len(ir.nodes)
    try:
        result = build()
    except Exception:  # noqa: BLE001 - shapes the rule does not cover: keep the call
        result = None
    if result is None:
        del ir.nodes[count:]
    return result


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
