"""Decompositions: composite functional calls (losses, distances, attention, ``einsum``,
``embedding``, ``normalize``, pixel shuffles, resizing, order statistics, grid sampling) lowered
to registry ops.

The registry has no kernel for ``F.cross_entropy`` or ``F.scaled_dot_product_attention``, but it
has one for each op they are made of; writing them out lets the scheduler fuse those ops like any
other. A decomposition applies only where it reproduces the call exactly (float32 operands, no
weights, no legacy reduction flags); otherwise the call stays in PyTorch.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_arrange import ARRANGE_METHODS, ARRANGE_SIGNATURES, arrange
from stitch_graph.codegen._capture_base import _subst
from stitch_graph.codegen._capture_builder import _all_or_nothing, _Builder, _reduce_loss
from stitch_graph.codegen._capture_compose import (
    COMPOSE_METHODS,
    COMPOSE_SIGNATURES,
    _vector_norm,
    block_diagonal,
    chained_product,
    compose,
)
from stitch_graph.codegen._capture_einsum import einsum_operands, expand_ellipsis, lower_einsum
from stitch_graph.codegen._capture_indexing import index_put, joint_index, sliced_index
from stitch_graph.codegen._capture_names import _canonical_name
from stitch_graph.codegen._capture_order import (
    ORDER_METHODS,
    ORDER_SIGNATURES,
    order_statistic,
    returns_pair,
    uses,
)
from stitch_graph.codegen._capture_resize import resize
from stitch_graph.codegen._capture_sample import SAMPLE_SIGNATURES, sample
from stitch_graph.codegen._capture_unpool import UNPOOL_SIGNATURES, unpool
from stitch_graph.codegen.ir import ProgramIR, Ref
from stitch_graph.codegen.ops import OpInfo, parse_signature

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
    "glu": "input, dim=-1",
    **dict.fromkeys(
        ("conv1d", "conv2d", "conv3d"),
        "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1",
    ),
    "normalize": "input, p=2.0, dim=1, eps=1e-12, out=None",
    "pixel_shuffle": "input, upscale_factor",
    "pixel_unshuffle": "input, downscale_factor",
    "interpolate": "input, size=None, scale_factor=None, mode='nearest', align_corners=None, recompute_scale_factor=None, antialias=False",  # noqa: E501
    "scaled_dot_product_attention": "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False",  # noqa: E501
    "prelu": "input, weight",
    "var_mean": "input, dim=None, unbiased=None, keepdim=False, correction=None",
    "gru_cell": "input, hx, w_ih, w_hh, b_ih=None, b_hh=None",
    "lstm_cell": "input, hx, w_ih, w_hh, b_ih=None, b_hh=None",
}
_INDEX_PUT = "input, indices, values, accumulate=False"  # Tensor.index_put_ and ATen's
# writes along one dim at an index vector: index_put with full slices before it
_INDEX_WRITES = {"index_copy": "input, dim, index, source", "index_fill": "input, dim, index, value"}
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
    if fx_node.target is operator.getitem and len(args) == 2 and isinstance(args[0], Ref):
        b = _Builder(ir, ours, fx_node.name)
        return _all_or_nothing(
            ir, lambda: joint_index(ir, b, args[0], args[1]) or sliced_index(ir, b, args[0], args[1])
        )
    if fx_node.target is torch.ops.aten.index.Tensor and len(args) == 2 and isinstance(args[0], Ref):
        # the exported x[i, j]: aten.index(x, [i, j]), None for a full slice
        index = tuple(slice(None) if i is None else i for i in args[1])
        b = _Builder(ir, ours, fx_node.name)
        return _all_or_nothing(ir, lambda: joint_index(ir, b, args[0], index))
    if name in ("cat", "stack") and args and isinstance(args[0], Ref):
        b = _Builder(ir, ours, fx_node.name)
        dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
        return _all_or_nothing(ir, lambda: _joined_unbind(ir, b, name, args[0], dim))
    if name in _INDEX_WRITES and args and isinstance(args[0], Ref):
        a = OpInfo(name, "unsupported", _INDEX_WRITES[name],
                   params=parse_signature(_INDEX_WRITES[name])).bind(args, kwargs)
        b = _Builder(ir, ours, fx_node.name)
        return _all_or_nothing(ir, lambda: _index_write(ir, b, name, a))
    if name == "index_put" and args and isinstance(args[0], Ref):
        a = OpInfo(name, "unsupported", _INDEX_PUT, params=parse_signature(_INDEX_PUT)).bind(
            args, kwargs)
        b = _Builder(ir, ours, fx_node.name)
        return _all_or_nothing(ir, lambda: index_put(
            ir, b, a["input"], a["indices"], a["values"], bool(a["accumulate"])))
    if name == "embedding" and fx_node.op == "call_function" and len(args) >= 2:
        idx, weight = args[0], args[1]
        rest = dict(zip(("padding_idx", "max_norm"), args[2:4], strict=False)) | kwargs
        if isinstance(fx_node.target, torch._ops.OpOverload):  # ATen's: (weight, indices, ...)
            weight, idx = args[0], args[1]
            rest = {}  # padding_idx, scale_grad_by_freq and sparse: the gradient's only
        # padding_idx, scale_grad_by_freq and sparse change only the gradient; max_norm
        # renormalises the weight's rows in place, and stays in PyTorch
        plain = rest.get("max_norm") is None
        if isinstance(idx, Ref) and isinstance(weight, Ref) and plain:
            b = _Builder(ir, ours, fx_node.name)
            return b("index", operator.getitem, weight, (idx,))
    if isinstance(fx_node.target, torch._ops.OpOverload) and name in _EXPORTED_CALLS:
        name, args, kwargs = _EXPORTED_CALLS[name], [], _exported_kwargs(
            fx_node.target, args, kwargs)
        functional = True
    else:  # ATen's unfold (an exported Tensor.unfold) shares F.unfold's name and is a view
        functional = name != "unfold" or fx_node.target is torch.nn.functional.unfold
    called = fx_node.op == "call_function" or name in ARRANGE_METHODS
    if name in ARRANGE_SIGNATURES and called and functional:
        return _decompose_arrange(ir, fx_node, name, args, kwargs, ours)
    if name in _JOINED_MATRICES and fx_node.op == "call_function":  # tensors: varargs or a list
        tensors = list(args[0]) if len(args) == 1 and isinstance(args[0], list | tuple) else args
        if not tensors or not all(
            isinstance(t, Ref) and ir.dtypes.get(t) == "float32" for t in tensors
        ):
            return None
        b = _Builder(ir, ours, fx_node.name)
        join = _JOINED_MATRICES[name]
        return _all_or_nothing(ir, lambda: join(ir, b, tensors))
    if isinstance(fx_node.target, torch._ops.OpOverload) and name.lstrip("_").startswith(
        "upsample_"
    ):
        resized = _exported_resize(fx_node.target, name, args, kwargs)
        b = _Builder(ir, ours, fx_node.name)
        return None if resized is None else _all_or_nothing(ir, lambda: resize(ir, b, resized))
    signature = (
        _DECOMPOSE_SIGNATURES.get(name)
        or COMPOSE_SIGNATURES.get(name)
        or ORDER_SIGNATURES.get(name)
        or SAMPLE_SIGNATURES.get(name)
        or UNPOOL_SIGNATURES.get(name)
    )
    methods = COMPOSE_METHODS | ORDER_METHODS
    if signature is None or (fx_node.op != "call_function" and name not in methods):
        return None
    info = OpInfo(name, "unsupported", signature, params=parse_signature(signature))
    if name == "repeat":  # x.repeat(2, 1) and x.repeat((2, 1))
        sizes = args[1:]
        args = [args[0], list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], list | tuple) else list(sizes)]  # noqa: E501
    a = info.bind(args, kwargs)
    refs = [v for v in _flat_values(a) if isinstance(v, Ref)]
    if not refs or any(ir.dtypes.get(r) not in ("float32", "int64", "bool") for r in refs):
        return None
    b = _Builder(ir, ours, fx_node.name)
    if name in ORDER_SIGNATURES:
        used = uses(fx_node) if returns_pair(name, a) else {0}
        if used is None:
            return None  # the pair itself is passed on: the call stays in PyTorch
        return _all_or_nothing(ir, lambda: order_statistic(ir, b, name, a, 1 in used))
    return _all_or_nothing(ir, lambda: _decompose_call(ir, b, name, a))


# ATen's calls (a program captured by torch.export) by the functional's name: their schemas
# name the input ``self``, and losses take the reduction as an enum
_EXPORTED_CALLS = {
    "cross_entropy_loss": "cross_entropy", "kl_div": "kl_div", "mse_loss": "mse_loss",
    "l1_loss": "l1_loss", "smooth_l1_loss": "smooth_l1_loss", "huber_loss": "huber_loss",
    "soft_margin_loss": "soft_margin_loss", "binary_cross_entropy": "binary_cross_entropy",
    "binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
    "im2col": "unfold", "col2im": "fold",  # F.unfold's and F.fold's
}
_REDUCTIONS = ("none", "mean", "sum")  # at::Reduction's order


def _exported_kwargs(target: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An exported call's arguments as the functional's keywords."""
    bound = dict(zip([a.name for a in target._schema.arguments], args, strict=False)) | kwargs
    bound["input"] = bound.pop("self")
    if isinstance(bound.get("reduction"), int):
        bound["reduction"] = _REDUCTIONS[bound["reduction"]]
    return bound


_JOINED_MATRICES = {
    "linalg_multi_dot": chained_product, "chain_matmul": chained_product,
    "block_diag": block_diagonal,
}

_RESIZE_MODES = {
    "nearest": "nearest", "nearest_exact": "nearest-exact", "linear": "linear",
    "bilinear": "bilinear", "trilinear": "trilinear", "bicubic": "bicubic",
}


def _exported_resize(
    target: Any, name: str, args: list[Any], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """The ``F.interpolate`` arguments of an exported ``aten.upsample_<mode><n>d`` call (its
    ``vec`` form holds the scale factors, the default one each dim's scale); ``None`` for a
    form this does not read."""
    bound = dict(zip([a.name for a in target._schema.arguments], args, strict=False)) | kwargs
    mode = _RESIZE_MODES.get(name.lstrip("_").removeprefix("upsample_")[:-2])
    x = bound.get("input", bound.get("self"))
    if mode is None or not isinstance(x, Ref):
        return None
    scales = bound.get("scale_factors")
    if "scale_factors" not in bound:
        each = [bound.get(k) for k in ("scales_d", "scales_h", "scales_w", "scales") if k in bound]
        scales = each if each and all(v is not None for v in each) else None
    size = None if scales is not None else bound.get("output_size")
    return {
        "input": x, "size": size, "scale_factor": scales, "mode": mode,
        "align_corners": bound.get("align_corners"), "recompute_scale_factor": None,
        "antialias": False,
    }


def _decompose_arrange(
    ir: ProgramIR,
    fx_node: torch.fx.Node,
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    ours: dict[Ref, Any],
) -> Any:
    """``_capture_arrange``'s calls; ``meshgrid`` and ``cartesian_prod`` take their tensors
    as positional arguments or as one list."""
    signature = ARRANGE_SIGNATURES[name]
    info = OpInfo(name, "unsupported", signature, params=parse_signature(signature))
    tensors = args
    if name in ("meshgrid", "cartesian_prod", "broadcast_tensors"):
        tensors = list(args[0]) if len(args) == 1 and isinstance(args[0], list | tuple) else args
        args = []
    b = _Builder(ir, ours, fx_node.name)
    return _all_or_nothing(ir, lambda: arrange(ir, b, name, info.bind(args, kwargs), tensors))


def _index_write(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """``index_copy`` and ``index_fill`` along ``dim`` at a vector of positions, as the
    ``x[:, :, index] = v`` they are (``_capture_indexing.index_put``)."""
    x, index = a["input"], a["index"]
    if not isinstance(index, Ref) or len(ir.shapes[index]) != 1 or not isinstance(a["dim"], int):
        return None
    dim = a["dim"] % len(ir.shapes[x])
    value = a["source"] if name == "index_copy" else a["value"]
    return index_put(ir, b, x, (*[slice(None)] * dim, index), value, False)


def _joined_unbind(ir: ProgramIR, b: _Builder, name: str, parts: Ref, dim: Any) -> Ref | None:
    """``torch.cat(x.unbind(d), c)`` (or ``stack``, or of ``chunk`` or ``split``): the tuple
    taken apart into its views, one per element, joined as any list of tensors is; ``None``
    for other tuples."""
    producer = next((n for n in ir.nodes if n.name == parts.name), None)
    if producer is None or producer.op not in _TUPLES_OF_VIEWS or not isinstance(dim, int):
        return None
    x, d = producer.args["input"], int(producer.args.get("dim", 0))
    length = ir.shapes[x][d]
    if producer.op == "unbind":
        views = [b("select", torch.select, x, d, i) for i in range(length)]
    else:
        sizes = _piece_sizes(producer, length)
        if sizes is None:
            return None
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        views = [b("narrow", torch.narrow, x, d, at, n) for at, n in zip(starts, sizes, strict=True)]
    return b(name, torch.cat if name == "cat" else torch.stack, views, dim)


_TUPLES_OF_VIEWS = ("unbind", "chunk", "split")


def _piece_sizes(producer: Any, length: int) -> list[int] | None:
    """The lengths of ``chunk``'s or ``split``'s pieces along their dim, as PyTorch cuts."""
    if producer.op == "chunk":
        count = int(producer.args["chunks"])
        step = -(-length // count)
        return [min(step, length - at) for at in range(0, length, step)]
    given = producer.args.get("split_size_or_sections")
    if isinstance(given, int) and given > 0:
        return [min(given, length - at) for at in range(0, length, given)]
    if isinstance(given, list | tuple) and all(isinstance(n, int) for n in given):
        return list(given) if sum(given) == length else None
    return None


def _padded_same_conv(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """``padding='same'`` where the padding is odd in some dim (an even kernel): the input
    padded first, the extra element on the far side as PyTorch pads it, then the convolution
    without padding. ``None`` for any other convolution (it is lowered as it is)."""
    x, weight = a["input"], a["weight"]
    if a["padding"] != "same" or not isinstance(x, Ref) or not isinstance(weight, Ref):
        return None
    nd = int(name[-2])
    dilation = a["dilation"]
    dilation = list(dilation) if isinstance(dilation, list | tuple) else [dilation] * nd
    totals = [int(d) * (k - 1) for d, k in zip(dilation, ir.shapes[weight][2:], strict=True)]
    if all(t % 2 == 0 for t in totals):
        return None  # symmetric: the convolution's own padding
    pads = [side for t in reversed(totals) for side in (t // 2, t - t // 2)]
    padded = b("pad", torch.nn.functional.pad, x, pads)
    conv = getattr(torch.nn.functional, name)
    return b(name, conv, padded, weight, a["bias"], a["stride"], 0, a["dilation"], a["groups"])


def _decompose_call(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    F = torch.nn.functional  # noqa: N806
    if name in ("conv1d", "conv2d", "conv3d"):
        return _padded_same_conv(ir, b, name, a)
    if a.get("size_average") is not None or a.get("reduce") is not None:
        return None  # legacy reduction flags
    if name in _ELEMENTWISE_LOSSES:
        op, extra = _ELEMENTWISE_LOSSES[name]
        x, t, weight = a["input"], a["target"], a.get("weight")
        if not isinstance(x, Ref) or not isinstance(t, Ref) or ir.dtypes[x] != "float32":
            return None
        if weight is not None and not name.startswith("binary_cross_entropy"):
            return None
        if ir.shapes[x] != ir.shapes[t] or ir.dtypes[t] != "float32":
            return None
        if name == "smooth_l1_loss" and float(a["beta"]) == 0.0:
            op, extra = "l1_elem", ()
        if a.get("pos_weight") is not None:
            elem = _positive_weighted_bce(b, x, t, a["pos_weight"])
        else:
            fn = getattr(F, name)
            elem = b(op, fn, x, t, reduction="none", **{k: a[k] for k in extra})
        if weight is not None:  # a rescaling of each element's loss, broadcast
            elem = b("mul", torch.mul, elem, weight)
        batch = ir.shapes[x][0] if ir.shapes[x] else 1
        return _reduce_loss(b, elem, a["reduction"], batch)
    if name in ("cross_entropy", "nll_loss"):
        return _class_loss(ir, b, a, name == "cross_entropy")
    if name == "glu":
        x, dim = a["input"], int(a["dim"])
        shape = ir.shapes[x]
        if not isinstance(x, Ref) or not shape or shape[dim] % 2 or ir.dtypes[x] != "float32":
            return None
        half = shape[dim] // 2
        first = b("narrow", torch.narrow, x, dim, 0, half)
        gate = b("narrow", torch.narrow, x, dim, half, half)
        return b("mul", torch.mul, first, b("sigmoid", torch.sigmoid, gate))
    if name == "normalize":
        x, dim = a["input"], int(a["dim"])
        if not isinstance(x, Ref) or a["out"] is not None:
            return None
        if ir.dtypes[x] != "float32" or not ir.shapes[x]:
            return None
        norm = _vector_norm(b, x, float(a["p"]), dim, True) or b("norm", torch.norm, x, 2, dim, True)
        return b("div", torch.div, x, b("clamp_min", torch.clamp_min, norm, float(a["eps"])))
    if name in ("pixel_shuffle", "pixel_unshuffle"):
        return _pixel_shuffle(ir, b, a, name == "pixel_shuffle")
    if name == "interpolate":
        return resize(ir, b, a)
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
        s1, s2 = ir.shapes[x1], ir.shapes[x2]
        if len(s1) != len(s2) or ir.dtypes[x1] != "float32" or ir.dtypes[x2] != "float32":
            return None
        if any(p != q and 1 not in (p, q) for p, q in zip(s1, s2, strict=True)):
            return None
        dim = int(a["dim"]) % max(len(s1), 1)
        if s1[dim] != s2[dim]:
            return None  # a broadcast along the reduced dim changes the norms
        # PyTorch divides each input by its norm, then sums the products; the sum of the
        # products divided by both norms is the same value, and the three reductions of the
        # same rows are one pass where the quotients were two tensors stored and read back
        eps = float(a["eps"])
        n1 = b("clamp_min", torch.clamp_min, b("norm", torch.norm, x1, 2, dim, False), eps)
        n2 = b("clamp_min", torch.clamp_min, b("norm", torch.norm, x2, 2, dim, False), eps)
        dot = b("sum", torch.sum, b("mul", torch.mul, x1, x2), dim)
        return b("div", torch.div, dot, b("mul", torch.mul, n1, n2))
    if name == "scaled_dot_product_attention":
        return _attention(ir, b, a)
    if name == "prelu":
        return _prelu(ir, b, a["input"], a["weight"])
    if name == "var_mean":
        x = a["input"]
        if ir.dtypes[x] != "float32":
            return None
        how = {k: a[k] for k in ("unbiased", "correction") if a[k] is not None}
        var = b("var", torch.var, x, a["dim"], keepdim=bool(a["keepdim"]), **how)
        return var, b("mean", torch.mean, x, a["dim"], bool(a["keepdim"]))
    if name in ("gru_cell", "lstm_cell"):
        return _rnn_cell(ir, b, name, a)
    if name in SAMPLE_SIGNATURES:
        return sample(ir, b, name, a)
    if name in UNPOOL_SIGNATURES:
        return unpool(ir, b, name, a)
    return compose(ir, b, name, a)


def _positive_weighted_bce(b: _Builder, x: Ref, t: Ref, pos_weight: Any) -> Ref:
    """``binary_cross_entropy_with_logits`` with ``pos_weight``, written out as PyTorch
    computes it: ``(1 - t) x + (1 + (w - 1) t) (log1p(exp(-|x|)) + max(-x, 0))``."""
    scale = b("add", torch.add, b("mul", torch.mul, b("sub", torch.sub, pos_weight, 1.0), t), 1.0)
    soft = b("add", torch.add,
             b("log1p", torch.log1p, b("exp", torch.exp, b("neg", torch.neg, b("abs", torch.abs, x)))),
             b("clamp_min", torch.clamp_min, b("neg", torch.neg, x), 0.0))
    return b("add", torch.add, b("mul", torch.mul, b("rsub", torch.rsub, t, 1.0), x),
             b("mul", torch.mul, scale, soft))


def _flat_values(a: dict[str, Any]) -> list[Any]:
    """The bound arguments, sequences (an LSTM cell's ``(h, c)``) opened."""
    return [x for v in a.values() for x in (v if isinstance(v, list | tuple) else [v])]


def _class_loss(ir: ProgramIR, b: _Builder, a: dict[str, Any], logits: bool) -> Ref | None:
    """``cross_entropy`` (``logits``) or ``nll_loss`` of class scores along dim 1: the target's
    score gathered, ``ignore_index`` masked, label smoothing as the uniform target's part and a
    class ``weight`` as PyTorch applies them (the mean divides by the targets' weight sum)."""
    x, t, weight = a["input"], a["target"], a.get("weight")
    smoothing = float(a.get("label_smoothing") or 0.0)
    if logits and isinstance(x, Ref) and isinstance(t, Ref) and ir.dtypes[t] == "float32":
        return _soft_target_loss(ir, b, x, t, weight, smoothing, a["reduction"])
    if not isinstance(x, Ref) or not isinstance(t, Ref) or ir.dtypes[t] != "int64":
        return None
    xs, ts = ir.shapes[x], ir.shapes[t]
    if len(xs) < 2 or ts != (xs[0], *xs[2:]) or ir.dtypes[x] != "float32":
        return None
    if weight is not None and (not isinstance(weight, Ref) or ir.shapes[weight] != (xs[1],)):
        return None
    if smoothing and not logits:
        return None
    index = b("unsqueeze", "unsqueeze", t, 1)
    picked = b("squeeze", "squeeze", b("gather", torch.gather, x, 1, index), 1)
    valid = b("ne", torch.ne, t, int(a["ignore_index"]))
    scale: Any = None  # the target's class weight (ignored targets read class 0, masked)
    if weight is not None:
        scale = b("index", operator.getitem, weight, (b("where", torch.where, valid, t, 0),))
    if logits:
        lse = b("logsumexp", torch.logsumexp, x, 1)
        loss = b("sub", torch.sub, lse, picked)
    else:
        loss = b("neg", torch.neg, picked)
    if scale is not None:
        loss = b("mul", torch.mul, loss, scale)
    if smoothing:  # the uniform target's part: -sum_c w_c log_softmax_c
        classes = xs[1]
        if weight is None:
            uniform = b("sub", torch.sub, b("mul", torch.mul, lse, float(classes)), b("sum", torch.sum, x, 1))  # noqa: E501
        else:
            spread = b("view", "view", weight, [1, classes, *([1] * (len(xs) - 2))])
            weighted = b("sum", torch.sum, b("mul", torch.mul, x, spread), 1)
            uniform = b("sub", torch.sub, b("mul", torch.mul, lse, b("sum", torch.sum, weight)), weighted)  # noqa: E501
        loss = b("add", torch.add, b("mul", torch.mul, loss, 1.0 - smoothing), b("mul", torch.mul, uniform, smoothing / classes))  # noqa: E501
    elem = b("where", torch.where, valid, loss, 0.0)
    if a["reduction"] != "mean":
        return _reduce_loss(b, elem, a["reduction"])
    counted = b("float", "float", valid) if scale is None else b("where", torch.where, valid, scale, 0.0)  # noqa: E501
    return b("div", torch.div, b("sum", torch.sum, elem), b("sum", torch.sum, counted))


def _soft_target_loss(
    ir: ProgramIR, b: _Builder, x: Ref, t: Ref, weight: Any, smoothing: float, reduction: Any
) -> Ref | None:
    """``cross_entropy`` against class probabilities (distillation, mixup): minus the
    targets' (smoothed) weighting of ``log_softmax`` over dim 1; the mean is over the rows."""
    if weight is not None or ir.shapes[t] != ir.shapes[x] or ir.dtypes[x] != "float32":
        return None
    if len(ir.shapes[x]) < 2:
        return None
    if smoothing:
        t = b("add", torch.add, b("mul", torch.mul, t, 1.0 - smoothing), smoothing / ir.shapes[x][1])
    logp = b("sub", torch.sub, x, b("logsumexp", torch.logsumexp, x, 1, True))
    elem = b("neg", torch.neg, b("sum", torch.sum, b("mul", torch.mul, t, logp), 1))
    return _reduce_loss(b, elem, reduction)


def _prelu(ir: ProgramIR, b: _Builder, x: Any, weight: Any) -> Ref | None:
    """``prelu``: ``x`` where positive, else ``weight * x``, one weight a channel (dim 1)."""
    if not isinstance(x, Ref) or not isinstance(weight, Ref) or ir.dtypes[x] != "float32":
        return None
    shape, count = ir.shapes[x], math.prod(ir.shapes[weight])
    if count != 1:
        if len(shape) < 2 or shape[1] != count:
            return None
        weight = b("view", "view", weight, [count, *([1] * (len(shape) - 2))])
    scaled = b("mul", torch.mul, x, weight)
    return b("where", torch.where, b("gt", torch.gt, x, 0.0), x, scaled)


def _rnn_cell(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Any:
    """``gru_cell`` / ``lstm_cell`` (one step of ``nn.GRUCell`` / ``nn.LSTMCell``): the input's
    and the hidden state's projections, then the gates, as PyTorch's fused cell kernels write
    them (the GRU's ``n + z * (h - n)``; the LSTM returns ``(h, c)``)."""
    F = torch.nn.functional  # noqa: N806
    x, hx = a["input"], a["hx"]
    h, c = (hx[0], hx[1]) if name == "lstm_cell" else (hx, None)
    if not isinstance(x, Ref) or not isinstance(h, Ref) or len(ir.shapes[x]) != 2:
        return None
    if name == "lstm_cell" and not isinstance(c, Ref):
        return None
    size = ir.shapes[h][-1]
    gi = b("linear", F.linear, x, a["w_ih"], a["b_ih"])
    gh = b("linear", F.linear, h, a["w_hh"], a["b_hh"])

    def gate(of: Ref, k: int) -> Ref:
        return b("narrow", torch.narrow, of, 1, k * size, size)

    if name == "gru_cell":
        r = b("sigmoid", torch.sigmoid, b("add", torch.add, gate(gi, 0), gate(gh, 0)))
        z = b("sigmoid", torch.sigmoid, b("add", torch.add, gate(gi, 1), gate(gh, 1)))
        reset = b("mul", torch.mul, r, gate(gh, 2))
        n = b("tanh", torch.tanh, b("add", torch.add, gate(gi, 2), reset))
        return b("add", torch.add, n, b("mul", torch.mul, z, b("sub", torch.sub, h, n)))
    gates = b("add", torch.add, gi, gh)
    i, f = (b("sigmoid", torch.sigmoid, gate(gates, k)) for k in (0, 1))
    g = b("tanh", torch.tanh, gate(gates, 2))
    o = b("sigmoid", torch.sigmoid, gate(gates, 3))
    cy = b("add", torch.add, b("mul", torch.mul, f, c), b("mul", torch.mul, i, g))
    return b("mul", torch.mul, o, b("tanh", torch.tanh, cy)), cy


def _attention(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``scaled_dot_product_attention`` as PyTorch's math path writes it: scaled scores, then
    the causal mask (key after query: ``-inf``) or the given mask (boolean: ``-inf`` where
    false; float: added), a softmax and the product with the values."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if float(a["dropout_p"]) != 0.0:
        return None
    if not all(isinstance(r, Ref) for r in (q, k, v)) or (a["is_causal"] and mask is not None):
        return None
    if a["enable_gqa"]:
        k, v = _shared_heads(ir, b, ir.shapes[q], k), _shared_heads(ir, b, ir.shapes[q], v)
    qs, ks = ir.shapes[q], ir.shapes[k]
    if len(qs) < 2 or qs[:-2] != ks[:-2] or ir.dtypes[q] != "float32":
        return None
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(qs[-1])
    scores = b("matmul", torch.matmul, q, b("transpose", "transpose", k, -2, -1))
    scores = b("mul", torch.mul, scores, float(scale))
    hidden: Ref | None = None  # where the scores become -inf
    if a["is_causal"]:
        rows, cols = qs[-2], ks[-2]
        query_at = b("view", "view", b.constant(torch.arange(rows)), rows, 1)
        key_at = b("view", "view", b.constant(torch.arange(cols)), 1, cols)
        hidden = b("gt", torch.gt, key_at, query_at)
    elif isinstance(mask, Ref) and ir.dtypes[mask] == "bool":
        hidden = b("logical_not", torch.logical_not, mask)
    if hidden is not None:
        scores = b("masked_fill", "masked_fill", scores, hidden, -math.inf)
    elif isinstance(mask, Ref) and ir.dtypes[mask] == "float32":
        scores = b("add", torch.add, scores, mask)
    elif mask is not None:
        return None
    probs = b("softmax", torch.softmax, scores, -1)
    return b("matmul", torch.matmul, probs, v)


def _shared_heads(ir: ProgramIR, b: _Builder, query: tuple[int, ...], kv: Ref) -> Ref:
    """Grouped-query attention's keys or values, each head repeated for the query heads that
    share it (``enable_gqa``); as they are when the head counts agree."""
    shape = ir.shapes[kv]
    heads, kv_heads = query[-3], shape[-3]
    if heads == kv_heads or kv_heads == 0 or heads % kv_heads:
        return kv
    group = heads // kv_heads
    spread = b("unsqueeze", torch.unsqueeze, kv, -3)
    spread = b("expand", "expand", spread, *shape[:-2], group, *shape[-2:])
    return b("reshape", torch.reshape, spread, (*shape[:-3], heads, *shape[-2:]))


def _pixel_shuffle(ir: ProgramIR, b: _Builder, a: dict[str, Any], up: bool) -> Ref | None:
    """``pixel_shuffle`` (or its inverse) over (N, C, H, W): a view, a permutation and one copy."""
    x = a["input"]
    r = int(a["upscale_factor" if up else "downscale_factor"])
    if not isinstance(x, Ref) or len(ir.shapes[x]) != 4 or r < 1:
        return None
    n, c, h, w = ir.shapes[x]
    if up:
        if c % (r * r):
            return None
        split = b("view", "view", x, n, c // (r * r), r, r, h, w)
        moved = b("permute", "permute", split, 0, 1, 4, 2, 5, 3)
        shape = (n, c // (r * r), h * r, w * r)
    else:
        if h % r or w % r:
            return None
        split = b("view", "view", x, n, c, h // r, r, w // r, r)
        moved = b("permute", "permute", split, 0, 1, 3, 5, 2, 4)
        shape = (n, c * r * r, h // r, w // r)
    return b("view", "view", b("contiguous", "contiguous", moved), *shape)


def _distance(
    ir: ProgramIR, b: _Builder, x1: Any, x2: Any, p: Any, eps: Any, keepdim: bool
) -> Ref | None:
    """``pairwise_distance``: the p-norm of ``x1 - x2 + eps`` over the last dim."""
    if not isinstance(x1, Ref) or not isinstance(x2, Ref) or isinstance(p, str):
        return None
    if ir.dtypes[x1] != "float32" or ir.dtypes[x2] != "float32" or len(ir.shapes[x1]) < 1:
        return None
    diff = b("add", torch.add, b("sub", torch.sub, x1, x2), float(eps))
    return _vector_norm(b, diff, float(p), -1, keepdim) or b("norm", torch.norm, diff, 2, -1, keepdim)


def _decompose_einsum(
    ir: ProgramIR, fx_node: torch.fx.Node, args: list[Any], ours: dict[Ref, Any]
) -> Ref | None:
    """An einsum as registry ops: a (batched, broadcast) matrix product as one ``matmul``,
    any other plain equation as pairwise contractions (``_capture_einsum``), an ellipsis
    spelled out in letters first."""
    parsed = einsum_operands(args)
    if parsed is not None and "." in parsed[0]:
        ranks = [len(ir.shapes[r]) if isinstance(r, Ref) else -1 for r in parsed[1]]
        eq = expand_ellipsis(parsed[0], ranks)
        if eq is None:
            return None
        args = [eq, *parsed[1]]
    ref = _einsum_as_matmul(ir, fx_node, args, ours)
    if ref is not None:
        return ref
    count = len(ir.nodes)
    try:
        return lower_einsum(ir, _Builder(ir, ours, fx_node.name), args, fx_node.kwargs.get("path"))
    except Exception:  # noqa: BLE001 - the call stays in PyTorch, declared
        del ir.nodes[count:]
        return None


def _einsum_as_matmul(
    ir: ProgramIR, fx_node: torch.fx.Node, args: list[Any], ours: dict[Ref, Any]
) -> Ref | None:
    """A two-operand einsum that is a (batched, broadcast) matrix product -> ``matmul``.

    Operands ``A[..., m, c]`` and ``B[..., c, n]`` (or ``B[..., n, c]``, read transposed) with
    one contracted letter ``c`` and an output ``...mn``, batch letters shared right-aligned.
    """
    parsed = einsum_operands(args)
    if parsed is None or len(parsed[1]) != 2:
        return None
    eq, (x, y) = parsed[0].replace(" ", ""), parsed[1]
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
