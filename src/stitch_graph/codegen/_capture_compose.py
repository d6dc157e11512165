"""Calls that are compositions of registry ops: reductions by other names (``any``,
``nanmean``, ``nansum``, p-norms, ``dist``, ``matrix_norm``, ``aminmax``), products
(``baddbmm``, ``addbmm``, ``outer``, ``cross``, ``bilinear``, and ``dot``, ``mv``, ``addmv``
and ``matmul`` where an operand is a vector), views (``atleast_nd``), copies and rearrangements
(``repeat``, ``rot90``, ``channel_shuffle``, ``one_hot``, ``tensordot``, ``embedding_bag``,
``bucketize``, ``cdist``), a few functions (``weight_norm``'s weight, ``logit``, ``softmin``,
``local_response_norm``, ``lp_pool``) and losses
(hinge and cosine embedding, margin ranking, Poisson NLL, multi-label soft margin, multi-class
margin).

Found missing by a probe of common ``torch`` and ``torch.nn.functional`` calls. As in
``_capture_decompose``, each applies only where it reproduces the call; otherwise ``None`` and the
call stays in PyTorch.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from stitch_graph.codegen._capture_base import _MAX_BAKED
from stitch_graph.codegen._capture_builder import _Builder, _reduce_loss
from stitch_graph.codegen._capture_interleave import interleave
from stitch_graph.codegen.ir import ProgramIR, Ref, numel

COMPOSE_SIGNATURES = {
    "hinge_embedding_loss": "input, target, margin=1.0, size_average=None, reduce=None, reduction='mean'",  # noqa: E501
    "margin_ranking_loss": "input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction='mean'",  # noqa: E501
    "poisson_nll_loss": "input, target, log_input=True, full=False, size_average=None, eps=1e-08, reduce=None, reduction='mean'",  # noqa: E501
    "cosine_embedding_loss": "input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction='mean'",  # noqa: E501
    "linalg_norm": "input, ord=None, dim=None, keepdim=False, dtype=None",
    "take_along_dim": "input, indices, dim=None",
    "masked_scatter": "input, mask, source",
    "channel_shuffle": "input, groups",
    "trapezoid": "input, dx=None, dim=-1",  # a tensor second argument: the sample points
    "trapz": "input, dx=None, dim=-1",
    "rot90": "input, k=1, dims=None",
    "one_hot": "input, num_classes=-1",
    "cross": "input, other, dim=None",
    "linalg_cross": "input, other, dim=-1",
    "addr": "input, vec1, vec2, beta=1, alpha=1",
    "logit": "input, eps=None",
    "special_logit": "input, eps=None",
    "softmin": "input, dim=None, _stacklevel=3, dtype=None",
    "any": "input, dim=None, keepdim=False",
    "all": "input, dim=None, keepdim=False",
    "count_nonzero": "input, dim=None",
    "nanmean": "input, dim=None, keepdim=False, dtype=None",
    "nansum": "input, dim=None, keepdim=False, dtype=None",
    "dist": "input, other, p=2",
    "linalg_matrix_norm": "input, ord='fro', dim=None, keepdim=False, dtype=None",
    "atleast_1d": "input",
    "atleast_2d": "input",
    "atleast_3d": "input",
    "std_mean": "input, dim=None, unbiased=None, keepdim=False, correction=None",
    "aminmax": "input, dim=None, keepdim=False",
    "norm": "input, p='fro', dim=None, keepdim=False, dtype=None",
    "linalg_vector_norm": "input, ord=2, dim=None, keepdim=False, dtype=None",
    "baddbmm": "input, batch1, batch2, beta=1, alpha=1",
    "addbmm": "input, batch1, batch2, beta=1, alpha=1",
    "addmv": "input, mat, vec, beta=1, alpha=1",
    "dot": "input, tensor",
    "inner": "input, other",
    "mv": "input, vec",
    "matmul": "input, other",
    "outer": "input, vec2",
    "diff": "input, n=1, dim=-1, prepend=None, append=None",
    "repeat": "input, sizes",
    "tile": "input, dims",
    "repeat_interleave": "input, repeats=None, dim=None, output_size=None",
    "histc": "input, bins=100, min=0, max=0",
    "embedding_bag": "input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode='mean', sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None",  # noqa: E501
    "tensordot": "a, b, dims=2, out=None",
    "linear": "input, weight, bias=None",
    "fold": "input, output_size, kernel_size, dilation=1, padding=0, stride=1",
    "local_response_norm": "input, size, alpha=0.0001, beta=0.75, k=1.0",
    "lp_pool1d": "input, norm_type, kernel_size, stride=None, ceil_mode=False",
    "lp_pool2d": "input, norm_type, kernel_size, stride=None, ceil_mode=False",
    "bucketize": "input, boundaries, out_int32=False, right=False",
    "cdist": "x1, x2, p=2.0, compute_mode='use_mm_for_euclid_dist_if_necessary'",
    "searchsorted": "sorted_sequence, input, out_int32=False, right=False, side=None, sorter=None",  # noqa: E501
    "bilinear": "input1, input2, weight, bias=None",
    "_weight_norm": "v, g, dim=0",
    "multilabel_soft_margin_loss": "input, target, weight=None, size_average=None, reduce=None, reduction='mean'",  # noqa: E501
    "multi_margin_loss": "input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction='mean'",  # noqa: E501
}
# calls decomposed as tensor methods too (``x.norm(p=1, dim=-1)``, ``x.repeat(1, 2)``)
COMPOSE_METHODS = frozenset({
    "logit", "any", "all", "count_nonzero", "nanmean", "aminmax", "norm", "baddbmm", "outer",
    "diff", "repeat", "tile", "addbmm", "addmv", "dot", "inner", "mv", "matmul", "repeat_interleave", "take_along_dim", "rot90", "cross",
    "tensordot", "nansum", "addr", "masked_scatter", "histc",
})


def _pair_loss(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """Losses of two inputs and a ``target`` of signs, as PyTorch writes them out."""
    x1, x2, t = a["input1"], a["input2"], a["target"]
    if not all(isinstance(v, Ref) and ir.dtypes[v] == "float32" for v in (x1, x2, t)):
        return None
    margin = float(a["margin"])
    if name == "margin_ranking_loss":
        gap = b("mul", torch.mul, b("neg", torch.neg, t), b("sub", torch.sub, x1, x2))
        return _reduce_loss(b, b("clamp_min", torch.clamp_min, b("add", torch.add, gap, margin), 0.0), a["reduction"])  # noqa: E501
    if len(ir.shapes[x1]) != 2 or ir.shapes[x1] != ir.shapes[x2]:
        return None
    # cosine_embedding_loss: 1 - cos where the target is 1, max(0, cos - margin) where it is -1
    dot = b("sum", torch.sum, b("mul", torch.mul, x1, x2), 1)
    n1 = b("add", torch.add, b("sum", torch.sum, b("mul", torch.mul, x1, x1), 1), 1e-12)
    n2 = b("add", torch.add, b("sum", torch.sum, b("mul", torch.mul, x2, x2), 1), 1e-12)
    cos = b("div", torch.div, dot, b("sqrt", torch.sqrt, b("mul", torch.mul, n1, n2)))
    pos = b("where", torch.where, b("eq", torch.eq, t, 1.0), b("rsub", torch.rsub, cos, 1.0), 0.0)
    neg = b("clamp_min", torch.clamp_min, b("sub", torch.sub, cos, margin), 0.0)
    neg = b("where", torch.where, b("eq", torch.eq, t, -1.0), neg, 0.0)
    return _reduce_loss(b, b("add", torch.add, pos, neg), a["reduction"])


def _class_margin_loss(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """Losses over a row of class scores, as PyTorch defines them: the mean over the classes
    of each class's logistic loss (multi-label), or of the hinge between the target's score
    and every other class's (multi-class), then the batch's reduction."""
    x, t, weight = a["input"], a["target"], a["weight"]
    if not isinstance(x, Ref) or len(ir.shapes[x]) != 2 or ir.dtypes[x] != "float32":
        return None
    classes = ir.shapes[x][1]
    if name == "multilabel_soft_margin_loss":
        if ir.shapes.get(t) != ir.shapes[x] or ir.dtypes[t] != "float32":
            return None
        on = b("mul", torch.mul, t, b("logsigmoid", torch.nn.functional.logsigmoid, x))
        off = b("mul", torch.mul, b("rsub", torch.rsub, t, 1.0),
                b("logsigmoid", torch.nn.functional.logsigmoid, b("neg", torch.neg, x)))
        loss = b("neg", torch.neg, b("add", torch.add, on, off))
        if weight is not None:
            loss = b("mul", torch.mul, loss, weight)
    else:
        p = int(a["p"])
        if ir.dtypes.get(t) != "int64" or len(ir.shapes[t]) != 1 or p not in (1, 2):
            return None
        column = b("unsqueeze", torch.unsqueeze, t, 1)
        own = b("gather", torch.gather, x, 1, column)
        gap = b("clamp_min", torch.clamp_min,
                b("add", torch.add, b("rsub", torch.rsub, own, float(a["margin"])), x), 0.0)
        if p == 2:
            gap = b("mul", torch.mul, gap, gap)
        if weight is not None:  # the target class's weight scales its row
            gap = b("mul", torch.mul, gap, b("unsqueeze", torch.unsqueeze,
                                              b("index", operator.getitem, weight, (t,)), 1))
        other = b("ne", torch.ne, b.constant(torch.arange(classes)), column)
        loss = b("where", torch.where, other, gap, 0.0)
    per_row = b("div", torch.div, b("sum", torch.sum, loss, 1), float(classes))
    return _reduce_loss(b, per_row, a["reduction"])


def _vector_product(ir: ProgramIR, b: _Builder, x: Any, y: Any) -> Ref | None:
    """``matmul`` where an operand is a vector (``dot``, ``mv``, a matrix times a vector):
    the vector as a one-row or one-column matrix, the GEMM, and that dim dropped again; two
    vectors are a product summed. ``None`` when both are matrices (the registry's GEMM)."""
    if not isinstance(y, Ref) or ir.dtypes[y] != "float32":
        return None
    nx, ny = len(ir.shapes[x]), len(ir.shapes[y])
    if min(nx, ny) != 1:
        return None
    if nx == ny == 1:
        return b("sum", torch.sum, b("mul", torch.mul, x, y))
    if ny == 1:
        column = b("unsqueeze", torch.unsqueeze, y, -1)
        return b("squeeze", torch.squeeze, b("matmul", torch.matmul, x, column), -1)
    row = b("unsqueeze", torch.unsqueeze, x, 0)
    return b("squeeze", torch.squeeze, b("matmul", torch.matmul, row, y), -2)


def compose(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Any:
    """Reductions, products, copies and losses that are compositions of registry ops."""
    if name in ("margin_ranking_loss", "cosine_embedding_loss"):
        return _pair_loss(ir, b, name, a)
    if name == "tensordot":
        return _tensordot(ir, b, a["a"], a["b"], a["dims"]) if a["out"] is None else None
    if name == "embedding_bag":
        return _embedding_bag(ir, b, a)
    if name in ("bucketize", "searchsorted"):
        return _bucket(ir, b, name, a)
    if name == "histc":
        return _histc(ir, b, a)
    if name == "fold":
        return _fold(ir, b, a)
    if name == "cdist":
        return _cdist(ir, b, a)
    if name == "bilinear":
        return _bilinear(ir, b, a)
    if name in ("multilabel_soft_margin_loss", "multi_margin_loss"):
        return _class_margin_loss(ir, b, name, a)
    if name == "_weight_norm":  # weight_norm's weight: v scaled to g over each slice of dim
        v, dim = a["v"], int(a["dim"])
        nd = len(ir.shapes[v])
        others = [d for d in range(nd) if d != dim % nd] if dim != -1 else list(range(nd))
        squares = b("sum", torch.sum, b("mul", torch.mul, v, v), others, True)
        norm = b("sqrt", torch.sqrt, squares)
        return b("mul", torch.mul, v, b("div", torch.div, a["g"], norm))
    x = a["input"]
    if name == "one_hot" and isinstance(x, Ref) and ir.dtypes[x] == "int64":
        classes = int(a["num_classes"])
        if classes < 1:
            return None  # the count would come from the data
        ids = b.constant(torch.arange(classes))
        hit = b("eq", torch.eq, b("unsqueeze", torch.unsqueeze, x, -1), ids)
        return b("long", "long", hit)
    if name in ("repeat", "tile") and isinstance(x, Ref):  # copies, of any dtype
        reps = [int(r) for r in (a["sizes"] if name == "repeat" else a["dims"])]
        return _repeat(ir, b, x, reps, tile=name == "tile")
    if not isinstance(x, Ref) or ir.dtypes[x] not in ("float32", "bool"):
        return None
    floating = ir.dtypes[x] == "float32"
    if name == "masked_scatter" and floating:
        return _masked_scatter(ir, b, x, a["mask"], a["source"])
    if name in ("lp_pool1d", "lp_pool2d") and floating:
        return _lp_pool(b, x, name, a)
    if name == "local_response_norm" and floating:
        return _local_response_norm(ir, b, x, int(a["size"]), a["alpha"], a["beta"], a["k"])
    if name == "linalg_cross" and isinstance(a["other"], Ref):  # operands broadcast first
        wide = list(torch.broadcast_shapes(tuple(ir.shapes[x]), tuple(ir.shapes[a["other"]])))
        pair = [v if list(ir.shapes[v]) == wide else b("copy", "contiguous", b("expand", "expand", v, wide))  # noqa: E501
                for v in (x, a["other"])]
        return _rearranged(ir, b, "cross", {"input": pair[0], "other": pair[1], "dim": a["dim"]})
    if name in ("linalg_norm", "take_along_dim", "channel_shuffle", "trapezoid", "trapz", "rot90", "cross"):  # noqa: E501
        return _rearranged(ir, b, name, a) if floating else None
    if name in ("logit", "special_logit") and floating:
        z = x if a["eps"] is None else b(
            "clamp", torch.clamp, x, float(a["eps"]), 1.0 - float(a["eps"])
        )
        return b("log", torch.log, b("div", torch.div, z, b("rsub", torch.rsub, z, 1.0)))
    if name == "softmin" and floating and a["dim"] is not None and a["dtype"] is None:
        return b("softmax", torch.softmax, b("neg", torch.neg, x), int(a["dim"]))
    if name in ("any", "all", "count_nonzero"):
        nonzero = b("ne", torch.ne, x, 0) if floating else x
        if name == "count_nonzero":  # an int64 count, exact at any size
            if a["dim"] is None:
                return b("sum", torch.sum, nonzero)
            return b("sum", torch.sum, nonzero, a["dim"])
        flags = b("float", "float", nonzero)
        op, fn = ("amax", torch.amax) if name == "any" else ("amin", torch.amin)
        folded = b(op, fn, flags) if a["dim"] is None else b(
            op, fn, flags, a["dim"], bool(a["keepdim"])
        )
        return b("ne", torch.ne, folded, 0.0)
    if not floating:
        return None
    if name in ("hinge_embedding_loss", "poisson_nll_loss"):
        t = a["target"]
        if not isinstance(t, Ref) or ir.dtypes[t] != "float32" or ir.shapes[t] != ir.shapes[x]:
            return None
        if name == "hinge_embedding_loss":
            margin = float(a["margin"])
            beyond = b("clamp_min", torch.clamp_min, b("rsub", torch.rsub, x, margin), 0.0)
            elem = b("add", torch.add,
                     b("where", torch.where, b("ne", torch.ne, t, 1.0), beyond, 0.0),
                     b("where", torch.where, b("ne", torch.ne, t, -1.0), x, 0.0))
        elif a["full"]:
            return None
        elif a["log_input"]:
            elem = b("sub", torch.sub, b("exp", torch.exp, x), b("mul", torch.mul, t, x))
        else:
            logs = b("log", torch.log, b("add", torch.add, x, float(a["eps"])))
            elem = b("sub", torch.sub, x, b("mul", torch.mul, t, logs))
        return _reduce_loss(b, elem, a["reduction"])
    if name == "nanmean" and a["dtype"] is None:
        missing = b("isnan", torch.isnan, x)
        kept = b("where", torch.where, missing, 0.0, x)
        dim, keep = a["dim"], bool(a["keepdim"])
        counted = b("float", "float", b("logical_not", torch.logical_not, missing))
        if dim is None:
            return b("div", torch.div, b("sum", torch.sum, kept), b("sum", torch.sum, counted))
        total = b("sum", torch.sum, kept, dim, keep)
        return b("div", torch.div, total, b("sum", torch.sum, counted, dim, keep))
    if name == "nansum" and a["dtype"] is None and floating:
        kept = b("where", torch.where, b("isnan", torch.isnan, x), 0.0, x)
        if a["dim"] is None:
            return b("sum", torch.sum, kept)
        return b("sum", torch.sum, kept, a["dim"], bool(a["keepdim"]))
    if name == "dist" and floating and isinstance(a["other"], Ref):
        return _vector_norm(b, b("sub", torch.sub, x, a["other"]), a["p"], None, False) or b(
            "norm", torch.norm, b("sub", torch.sub, x, a["other"])
        )
    if name == "linalg_matrix_norm" and floating and a["dtype"] is None:
        dims = [-2, -1] if a["dim"] is None else list(a["dim"])
        return _matrix_norm(ir, b, x, a["ord"], dims, bool(a["keepdim"]))
    if name in ("atleast_1d", "atleast_2d", "atleast_3d"):
        shape = list(ir.shapes[x])
        rank = int(name[-2])
        if len(shape) >= rank:
            return x
        grown = {0: [1] * rank, 1: [1, *shape] + [1] * (rank - 2), 2: [1, *shape]}[len(shape)]
        return b("view", "view", x, *grown[:rank])
    if name == "std_mean":
        how = {k: a[k] for k in ("unbiased", "correction") if a[k] is not None}
        std = b("std", torch.std, x, a["dim"], keepdim=bool(a["keepdim"]), **how)
        return std, b("mean", torch.mean, x, a["dim"], bool(a["keepdim"]))
    if name == "aminmax":
        dim, keep = a["dim"], bool(a["keepdim"])
        if dim is None:
            return b("amin", torch.amin, x), b("amax", torch.amax, x)
        return b("amin", torch.amin, x, dim, keep), b("amax", torch.amax, x, dim, keep)
    if name in ("norm", "linalg_vector_norm"):
        order = a["p"] if name == "norm" else a["ord"]
        return None if a["dtype"] is not None else _vector_norm(b, x, order, a["dim"], bool(a["keepdim"]))  # noqa: E501
    if name == "addr" and floating:  # beta * input + alpha * outer(vec1, vec2)
        product = b("mul", torch.mul, b("unsqueeze", torch.unsqueeze, a["vec1"], 1),
                    b("unsqueeze", torch.unsqueeze, a["vec2"], 0))
        return _scaled_sum(b, x, product, float(a["beta"]), float(a["alpha"]))
    if name in ("baddbmm", "addbmm", "addmv"):
        if name == "addmv":
            product = _vector_product(ir, b, a["mat"], a["vec"])
        else:
            product = b("matmul", torch.bmm, a["batch1"], a["batch2"])
            if name == "addbmm":  # the batch's products summed
                product = b("sum", torch.sum, product, 0)
        return _scaled_sum(b, x, product, float(a["beta"]), float(a["alpha"]))
    if name == "linear" and floating and len(ir.shapes[x]) == 1:  # a vector: a one-row GEMM
        row = b("unsqueeze", torch.unsqueeze, x, 0)
        product = b("linear", torch.nn.functional.linear, row, a["weight"], a["bias"])
        return b("squeeze", torch.squeeze, product, 0)
    if name in ("dot", "inner", "mv", "matmul") and floating:
        other = a.get("tensor", a.get("other", a.get("vec")))
        if name == "inner" and len(ir.shapes[x]) != 1:
            return None
        return _vector_product(ir, b, x, other)
    if name == "outer":
        y = a["vec2"]
        if len(ir.shapes[x]) != 1 or not isinstance(y, Ref) or len(ir.shapes[y]) != 1:
            return None
        rows = b("unsqueeze", torch.unsqueeze, x, 1)
        return b("mul", torch.mul, rows, b("unsqueeze", torch.unsqueeze, y, 0))
    if name == "diff":
        return _diff(ir, b, x, int(a["n"]), int(a["dim"]), a["prepend"], a["append"])
    if name == "repeat_interleave":
        reps, dim = a["repeats"], a["dim"]
        if not isinstance(reps, int) or dim is None or a["output_size"] is not None:
            return None
        dim = int(dim) % len(ir.shapes[x])
        return b("interleave", interleave, [x] * reps, dim)
    return None


def _diff(
    ir: ProgramIR, b: _Builder, x: Ref, n: int, dim: int, prepend: Any, append: Any
) -> Ref | None:
    """``diff``: ``prepend`` and ``append`` (tensors) joined on, then ``n`` times the later
    elements less the earlier ones along ``dim``."""
    dim %= len(ir.shapes[x])
    edges = [prepend, append]
    if n < 1 or any(e is not None and not isinstance(e, Ref) for e in edges):
        return None
    if prepend is not None or append is not None:
        x = b("cat", torch.cat, [e for e in (prepend, x, append) if e is not None], dim)
    for _ in range(n):
        length = ir.shapes[x][dim]
        if length < 2:
            return None
        after = b("narrow", torch.narrow, x, dim, 1, length - 1)
        x = b("sub", torch.sub, after, b("narrow", torch.narrow, x, dim, 0, length - 1))
    return x


def _scaled_sum(b: _Builder, x: Ref, product: Ref, beta: float, alpha: float) -> Ref:
    """``beta * x + alpha * product``, as the ``add*`` calls give it: with ``beta`` 0 the input
    is ignored, NaN included."""
    if alpha != 1.0:
        product = b("mul", torch.mul, product, alpha)
    if beta == 0.0:
        return product
    base = x if beta == 1.0 else b("mul", torch.mul, x, beta)
    return b("add", torch.add, base, product)


def chained_product(ir: ProgramIR, b: _Builder, tensors: list[Ref]) -> Ref | None:
    """``linalg.multi_dot`` / ``chain_matmul``: the products in the cheaper order for three
    matrices, left to right otherwise; a vector first or last is a row or a column, dropped
    again at the end."""
    first, last = len(ir.shapes[tensors[0]]) == 1, len(ir.shapes[tensors[-1]]) == 1
    if len(tensors) < 2 or (first and last and len(tensors) == 2):
        return None
    ms = list(tensors)
    if first:
        ms[0] = b("unsqueeze", torch.unsqueeze, ms[0], 0)
    if last:
        ms[-1] = b("unsqueeze", torch.unsqueeze, ms[-1], 1)
    shapes = [ir.shapes[m] for m in ms]
    if any(len(sh) != 2 for sh in shapes):
        return None
    if len(ms) == 3:
        (p, q), (_, r), (_, t) = shapes
        if q * r * t + p * q * t < p * q * r + p * r * t:  # A(BC) costs less than (AB)C
            ms = [ms[0], b("matmul", torch.matmul, ms[1], ms[2])]
    out = ms[0]
    for m in ms[1:]:
        out = b("matmul", torch.matmul, out, m)
    if last:
        out = b("squeeze", torch.squeeze, out, -1)
    if first:
        out = b("squeeze", torch.squeeze, out, 0)
    return out


def block_diagonal(ir: ProgramIR, b: _Builder, tensors: list[Ref]) -> Ref | None:
    """``block_diag``: each block (a number a 1x1 block, a vector a row) padded with zeros to
    the total width at its columns, the blocks stacked down the rows."""
    blocks = []
    for t in tensors:
        rank = len(ir.shapes[t])
        if rank > 2:
            return None
        blocks.append(t if rank == 2 else b("view", "view", t, 1, -1))
    width = sum(ir.shapes[blk][1] for blk in blocks)
    rows, left = [], 0
    for blk in blocks:
        cols = ir.shapes[blk][1]
        rows.append(b("pad", torch.nn.functional.pad, blk, [left, width - left - cols]))
        left += cols
    return b("cat", torch.cat, rows, 0)


def _matrix_norm(
    ir: ProgramIR, b: _Builder, x: Ref, order: Any, dims: list[int], keep: bool
) -> Ref | None:
    """A matrix norm over ``dims`` as PyTorch computes it: Frobenius, or for orders 1 and
    infinity the largest sum of magnitudes down the columns or along the rows (the smallest
    for -1 and -infinity); ``None`` for the orders that need singular values."""
    if order == "fro":
        return b("norm", torch.norm, x, 2, dims, keep)
    if order not in (1, -1, math.inf, -math.inf):
        return None
    rank = len(ir.shapes[x])
    rows, cols = (d % rank for d in dims)
    if rows == cols:
        return None
    summed, kept = (rows, cols) if order in (1, -1) else (cols, rows)
    sums = b("sum", torch.sum, b("abs", torch.abs, x), summed, keep)
    if not keep and summed < kept:
        kept -= 1  # the summed dim is gone
    return b("amax" if order > 0 else "amin", torch.amax if order > 0 else torch.amin, sums,
             kept, keep)


def _rearranged(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """Norms by ``torch.linalg``, gathers, shuffles, rotations and products of 3-vectors."""
    x = a["input"]
    shape = list(ir.shapes[x])
    if name == "linalg_norm":
        dim, keep = a["dim"], bool(a["keepdim"])
        if a["dtype"] is None and isinstance(dim, list | tuple) and len(dim) == 2:
            return _matrix_norm(ir, b, x, "fro" if a["ord"] is None else a["ord"], list(dim), keep)
        if a["dtype"] is not None or (isinstance(dim, list | tuple) and len(dim) != 1):
            return None
        if a["ord"] is None:
            return b("norm", torch.norm, x) if dim is None else b("norm", torch.norm, x, 2, dim, keep)  # noqa: E501
        return None if dim is None else _vector_norm(b, x, a["ord"], dim, keep)
    if name == "take_along_dim":
        idx, dim = a["indices"], a["dim"]
        if dim is None or not isinstance(idx, Ref) or len(ir.shapes[idx]) != len(shape):
            return None
        d = int(dim) % len(shape)
        # the two broadcast against each other outside ``dim``, then a plain gather
        pairs = list(zip(ir.shapes[idx], shape, strict=True))
        if any(n != m and 1 not in (n, m) for j, (n, m) in enumerate(pairs) if j != d):
            return None
        x_shape = [m if j == d else max(n, m) for j, (n, m) in enumerate(pairs)]
        i_shape = [n if j == d else max(n, m) for j, (n, m) in enumerate(pairs)]
        if x_shape != list(shape):
            x = b("expand", "expand", x, *x_shape)
        if i_shape != list(ir.shapes[idx]):
            idx = b("expand", "expand", idx, *i_shape)
        return b("gather", torch.gather, x, d, idx)
    if name == "channel_shuffle":
        groups = int(a["groups"])
        if len(shape) < 3 or shape[1] % groups:
            return None
        split = b("view", "view", x, shape[0], groups, shape[1] // groups, *shape[2:])
        dense = b("copy", "contiguous", b("transpose", torch.transpose, split, 1, 2))
        return b("view", "view", dense, *shape)
    if name in ("trapezoid", "trapz"):  # PyTorch's own formula: dx * (sum - (first + last) / 2)
        d = int(a["dim"]) % len(shape)
        if isinstance(a["dx"], Ref):
            return _trapezoid_at(ir, b, x, a["dx"], d)
        if not isinstance(a["dx"], int | float | None):
            return None
        ends = b("add", torch.add, b("select", torch.select, x, d, 0), b("select", torch.select, x, d, -1))  # noqa: E501
        total = b("sub", torch.sub, b("sum", torch.sum, x, d), b("mul", torch.mul, ends, 0.5))
        return total if a["dx"] is None else b("mul", torch.mul, total, float(a["dx"]))
    if name == "rot90":
        k, (d0, d1) = int(a["k"]) % 4, [int(v) % len(shape) for v in a["dims"] or (0, 1)]
        if k == 0:
            return b("copy", "contiguous", x)
        if k == 2:
            return b("flip", torch.flip, x, [d0, d1])
        flipped = b("flip", torch.flip, x, [d1 if k == 1 else d0])
        return b("copy", "contiguous", b("transpose", torch.transpose, flipped, d0, d1))
    # cross: the product of 3-vectors along dim, one component at a time
    y, dim = a["other"], a["dim"]
    if dim is None or not isinstance(y, Ref) or ir.shapes[y] != ir.shapes[x]:
        return None
    d = int(dim) % len(shape)
    if shape[d] != 3:
        return None

    def part(v: Ref, i: int) -> Ref:
        return b("narrow", torch.narrow, v, d, i, 1)

    parts = [
        b("sub", torch.sub, b("mul", torch.mul, part(x, i), part(y, j)), b("mul", torch.mul, part(x, j), part(y, i)))  # noqa: E501
        for i, j in ((1, 2), (2, 0), (0, 1))
    ]
    return b("cat", torch.cat, parts, d)


def _trapezoid_at(ir: ProgramIR, b: _Builder, y: Ref, at: Ref, d: int) -> Ref | None:
    """The trapezoid rule over sample points ``at`` (of ``y``'s shape, or 1-d along ``d``), as
    PyTorch computes it: ``(diff(at) * (y[:-1] + y[1:])).sum(d) / 2``."""
    shape, n = ir.shapes[y], ir.shapes[y][d]
    one = len(ir.shapes[at]) == 1 and len(shape) > 1
    if ir.dtypes[at] != "float32" or (ir.shapes[at] != shape and not (one and ir.shapes[at][0] == n)):
        return None
    axis = 0 if one else d

    def part(t: Ref, start: int, dim: int) -> Ref:
        return b("narrow", torch.narrow, t, dim, start, n - 1)

    steps = b("sub", torch.sub, part(at, 1, axis), part(at, 0, axis))
    if one:
        steps = b("view", "view", steps, *[n - 1 if k == d else 1 for k in range(len(shape))])
    pairs = b("add", torch.add, part(y, 0, d), part(y, 1, d))
    return b("div", torch.div, b("sum", torch.sum, b("mul", torch.mul, steps, pairs), d), 2.0)


def _bilinear(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``F.bilinear``: ``out[n, k] = x1[n] W[k] x2[n] + bias[k]`` as one GEMM of ``x2`` by the
    weight laid out (J, K*I), then a product with ``x1`` summed over I."""
    x1, x2, weight, bias = a["input1"], a["input2"], a["weight"], a["bias"]
    if not all(isinstance(t, Ref) and ir.dtypes[t] == "float32" for t in (x1, x2, weight)):
        return None
    k, i, j = ir.shapes[weight]
    lead = list(ir.shapes[x1][:-1])
    rows = math.prod(lead)
    w = b("view", "view", b("copy", "contiguous", b("permute", "permute", weight, 2, 0, 1)), j, k * i)  # noqa: E501
    t = b("matmul", torch.matmul, b("view", "view", b("copy", "contiguous", x2), rows, j), w)
    s = b("mul", torch.mul, b("view", "view", t, rows, k, i), b("view", "view", b("copy", "contiguous", x1), rows, 1, i))  # noqa: E501
    out = b("sum", torch.sum, s, -1)
    if isinstance(bias, Ref):
        out = b("add", torch.add, out, bias)
    return b("view", "view", out, *lead, k)


def _vector_norm(b: _Builder, x: Ref, order: Any, dim: Any, keepdim: bool) -> Ref | None:
    """The p-norm over ``dim`` for orders other than 2 (which stays one ``norm`` reduction)."""
    if order in ("fro", 2, 2.0) or isinstance(order, str):
        return None
    p = float(order)

    def fold(op: str, fn: Any, value: Ref) -> Ref:
        return b(op, fn, value) if dim is None else b(op, fn, value, dim, keepdim)

    if p == 0.0:
        return fold("sum", torch.sum, b("float", "float", b("ne", torch.ne, x, 0)))
    abs_x = b("abs", torch.abs, x)
    if p == math.inf:
        return fold("amax", torch.amax, abs_x)
    if p == -math.inf:
        return fold("amin", torch.amin, abs_x)
    if p == 1.0:
        return fold("sum", torch.sum, abs_x)
    powered = fold("sum", torch.sum, b("pow", torch.pow, abs_x, p))
    return b("pow", torch.pow, powered, 1.0 / p)


def _repeat(ir: ProgramIR, b: _Builder, x: Ref, reps: list[int], *, tile: bool) -> Ref | None:
    """``repeat`` / ``tile``: each dim's copies side by side, as one expand of an interleaved
    view made contiguous, then merged back (``tile`` pads its repeats with leading ones)."""
    shape = list(ir.shapes[x])
    if tile and len(reps) < len(shape):
        reps = [1] * (len(shape) - len(reps)) + reps
    if len(reps) < len(shape):
        return None
    shape = [1] * (len(reps) - len(shape)) + shape
    pairs = [n for s_ in shape for n in (1, s_)]
    spread = b("expand", "expand", b("view", "view", x, *pairs), *[n for r, s_ in zip(reps, shape, strict=True) for n in (r, s_)])  # noqa: E501
    dense = b("copy", "contiguous", spread)
    return b("view", "view", dense, *[r * s_ for r, s_ in zip(reps, shape, strict=True)])


def _tensordot(ir: ProgramIR, b: _Builder, x: Any, y: Any, dims: Any) -> Ref | None:
    """``tensordot`` as one ``matmul`` of the operands permuted, copied and flattened to
    (free, contracted) and (contracted, free), then viewed as the free dims of both."""
    if not isinstance(x, Ref) or not isinstance(y, Ref):
        return None
    xs, ys = list(ir.shapes[x]), list(ir.shapes[y])
    if isinstance(dims, int):
        dx, dy = list(range(len(xs) - dims, len(xs))), list(range(dims))
    elif isinstance(dims, list | tuple) and len(dims) == 2:
        dx, dy = ([int(d) % n for d in (v if isinstance(v, list | tuple) else [v])]
                  for v, n in zip(dims, (len(xs), len(ys)), strict=True))
    else:
        return None
    if len(dx) != len(dy) or any(xs[i] != ys[j] for i, j in zip(dx, dy, strict=True)):
        return None
    fx = [d for d in range(len(xs)) if d not in dx]
    fy = [d for d in range(len(ys)) if d not in dy]
    k = math.prod(xs[d] for d in dx)

    def flat(v: Ref, order: list[int], rows: int) -> Ref:
        moved = b("copy", "contiguous", b("permute", "permute", v, *order))
        return b("view", "view", moved, rows, -1)

    left = flat(x, fx + dx, math.prod(xs[d] for d in fx))
    right = flat(y, dy + fy, k)
    product = b("matmul", torch.matmul, left, right)
    return b("view", "view", product, *[xs[d] for d in fx], *[ys[d] for d in fy])


def _embedding_bag(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``embedding_bag``: the rows looked up, weighted per sample (``sum`` only), then summed,
    averaged or maxed over each bag; bags of equal size (a 2-D input) reduce a dim, bags
    that ``offsets`` start in a 1-D input are summed into by ``_bags_by_offsets``."""
    idx, weight, per_sample, offsets = a["input"], a["weight"], a["per_sample_weights"], a["offsets"]
    plain = all(a[k] in (None, False, 2, 2.0) for k in ("max_norm", "norm_type",
                                                        "scale_grad_by_freq", "padding_idx"))
    if not plain or not isinstance(idx, Ref) or not isinstance(weight, Ref):
        return None
    by_offsets = offsets is not None
    if by_offsets != (len(ir.shapes[idx]) == 1) or (a["include_last_offset"] and not by_offsets):
        return None
    if a["mode"] not in ("sum", "mean", "max"):
        return None
    rows = b("index", operator.getitem, weight, (idx,))
    if per_sample is not None:
        if a["mode"] != "sum" or not isinstance(per_sample, Ref):
            return None
        rows = b("mul", torch.mul, rows, b("unsqueeze", torch.unsqueeze, per_sample, -1))
    if by_offsets:
        return _bags_by_offsets(ir, b, rows, offsets, a["mode"], bool(a["include_last_offset"]))
    op, fn = {"sum": ("sum", torch.sum), "mean": ("mean", torch.mean), "max": ("amax", torch.amax)}[a["mode"]]  # noqa: E501
    return b(op, fn, rows, 1)


def _bags_by_offsets(
    ir: ProgramIR, b: _Builder, rows: Ref, offsets: Any, mode: str, last_included: bool
) -> Ref | None:
    """Each looked-up row added into its bag (or its largest kept, ``max``): the bag of row
    ``n`` is the count of offsets at or before ``n``, less one (a cumulative sum of the
    offsets' marks, exact in float32 below 2**24 rows), and an empty bag is zero, in ``mean``
    and ``max`` too, as in PyTorch."""
    if not isinstance(offsets, Ref) or ir.dtypes.get(offsets) not in ("int64", "int32"):
        return None
    (n, width), starts = ir.shapes[rows], ir.shapes[offsets][0]
    if n >= 2**24 or len(ir.shapes[offsets]) != 1:
        return None
    bags = starts - 1 if last_included else starts
    marks = b("index_add", torch.index_add, b("zeros", torch.zeros, [n + 1]), 0, offsets,
              b("ones", torch.ones, [starts]))
    seen = b("narrow", torch.narrow, b("cumsum", torch.cumsum, marks, 0), 0, 0, n)
    bag = b("long", "long", b("sub", torch.sub, seen, 1.0))
    if mode == "max":  # each bag's largest of its rows; an empty bag stays zero, as in PyTorch
        spread = b("expand", "expand", b("unsqueeze", torch.unsqueeze, bag, -1), n, width)
        return b("scatter_reduce", torch.scatter_reduce, b("zeros", torch.zeros, [bags, width]),
                 0, spread, rows, "amax", include_self=False)
    sums = b("index_add", torch.index_add, b("zeros", torch.zeros, [bags, width]), 0, bag, rows)
    if mode == "sum":
        return sums
    counts = b("index_add", torch.index_add, b("zeros", torch.zeros, [bags]), 0, bag,
               b("ones", torch.ones, [n]))
    held = b("clamp", torch.clamp, counts, 1.0)
    return b("div", torch.div, sums, b("unsqueeze", torch.unsqueeze, held, -1))


def _local_response_norm(
    ir: ProgramIR, b: _Builder, x: Ref, size: int, alpha: Any, beta: Any, k: Any
) -> Ref | None:
    """PyTorch's own formula: ``x / (k + alpha * avg(x**2 over size channels)) ** beta``, the
    channel window an average pooling of the squares padded with zeros."""
    shape = list(ir.shapes[x])
    if len(shape) < 3:
        return None
    n, c = shape[0], shape[1]
    square = b("mul", torch.mul, x, x)
    planes = b("view", "view", square, n, 1, c, shape[2], -1)
    padded = b("pad", torch.nn.functional.pad, planes, [0, 0, 0, 0, size // 2, (size - 1) // 2])
    window = b("avg_pool3d", torch.nn.functional.avg_pool3d, padded, (size, 1, 1), 1)
    mean = b("view", "view", window, *shape)
    scale = b("pow", torch.pow, b("add", torch.add, b("mul", torch.mul, mean, float(alpha)), float(k)), float(beta))  # noqa: E501
    return b("div", torch.div, x, scale)


def _lp_pool(b: _Builder, x: Ref, name: str, a: dict[str, Any]) -> Ref:
    """PyTorch's own formula: the average of ``x**p`` over each window, its sign times its
    magnitude, times the window's size, to the power ``1/p``."""
    p = float(a["norm_type"])
    nd = 1 if name == "lp_pool1d" else 2
    ks = a["kernel_size"]
    ks = [int(v) for v in ks] if isinstance(ks, list | tuple) else [int(ks)] * nd
    pool, fn = (("avg_pool1d", torch.nn.functional.avg_pool1d) if nd == 1
                else ("avg_pool2d", torch.nn.functional.avg_pool2d))
    stride = a["stride"] if a["stride"] is not None else ks
    out = b(pool, fn, b("pow", torch.pow, x, p), ks, stride, 0, bool(a["ceil_mode"]))
    signed = b("mul", torch.mul, b("sign", torch.sign, out), b("relu", torch.relu, b("abs", torch.abs, out)))  # noqa: E501
    return b("pow", torch.pow, b("mul", torch.mul, signed, float(math.prod(ks))), 1.0 / p)


def _bucket(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """``bucketize`` / ``searchsorted`` of a 1-D sorted sequence, or a batch of them (one per
    row of the values: NeRF's samples drawn from each ray's CDF): for each value the count of
    boundaries below it (``right``: at or below it), one ``bucketize`` node (a binary search
    that its readers compute on load)."""
    x = a["input"]
    edges = a["boundaries"] if name == "bucketize" else a["sorted_sequence"]
    right = bool(a["right"]) or (name == "searchsorted" and a["side"] == "right")
    if not isinstance(x, Ref) or not isinstance(edges, Ref):
        return None
    rows = ir.shapes[edges][:-1]
    if rows and (len(ir.shapes[x]) != len(rows) + 1 or ir.shapes[x][:-1] != rows):
        return None
    if a["out_int32"] or a.get("sorter") is not None or ir.dtypes[x] != "float32":
        return None
    if ir.dtypes[edges] != "float32":
        return None
    return b("bucketize", torch.bucketize, x, edges, right=right)


def _histc(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``histc``: each element's bin computed as PyTorch's CUDA kernel does (``(x - lo) *
    bins / (hi - lo)`` in float32, truncated, ``hi`` itself in the last bin) and a one added
    there (``index_add``); elements outside ``[lo, hi]`` and NaN add nothing. ``min == max``
    takes the range from the data (widened by one each way where the data is constant), on
    the device rather than through a host read."""
    x, bins = a["input"], int(a["bins"])
    if not isinstance(x, Ref) or ir.dtypes[x] != "float32" or bins < 1 or numel(ir.shapes[x]) >= 2**24:
        return None  # counts above 2**24 are no longer exact in float32 adds
    flat = b("reshape", torch.reshape, x, [-1])
    lo, hi = float(a["min"]), float(a["max"])
    if lo == hi:
        low, high = b("amin", torch.amin, flat), b("amax", torch.amax, flat)
        same = b("eq", torch.eq, low, high)
        low = b("where", torch.where, same, b("sub", torch.sub, low, 1.0), low)
        high = b("where", torch.where, same, b("add", torch.add, high, 1.0), high)
        width: Any = b("sub", torch.sub, high, low)
    elif lo > hi:
        return None  # PyTorch raises
    else:
        low, high = lo, hi
        width = float(torch.tensor(hi, dtype=torch.float32) - torch.tensor(lo, dtype=torch.float32))
    scaled = b("div", torch.div, b("mul", torch.mul, b("sub", torch.sub, flat, low), float(bins)), width)
    pos = b("long", "long", scaled)
    pos = b("where", torch.where, b("eq", torch.eq, pos, bins), bins - 1, pos)
    inside = b("logical_and", torch.logical_and, b("ge", torch.ge, flat, low), b("le", torch.le, flat, high))
    index = b("where", torch.where, inside, pos, 0)
    ones = b("float", "float", inside)
    return b("index_add", torch.index_add, b("zeros", torch.zeros, [bins]), 0, index, ones)


def _masked_scatter(ir: ProgramIR, b: _Builder, x: Ref, mask: Any, source: Any) -> Ref | None:
    """``x.masked_scatter(mask, source)``: the k-th position the mask selects (row-major) takes
    ``source``'s k-th element, the others keep ``x`` (image features merged into a token
    sequence). A running count of the mask says which element each one takes."""
    if not isinstance(mask, Ref) or not isinstance(source, Ref):
        return None
    if ir.dtypes[mask] != "bool" or ir.dtypes[source] != "float32":
        return None
    shape = list(ir.shapes[x])
    if list(ir.shapes[mask]) != shape:
        mask = b("expand", "expand", mask, shape)
    count = b("cumsum", torch.cumsum, b("long", "long", b("reshape", "reshape", mask, -1)), 0)
    last = max(1, numel(tuple(ir.shapes[source]))) - 1
    at = b("clamp", torch.clamp, b("sub", torch.sub, count, 1), 0, last)
    taken = b("gather", torch.gather, b("reshape", "reshape", source, -1), 0, at)
    return b("where", torch.where, mask, b("view", "view", taken, *shape), x)


def _fold(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``F.fold`` (col2im) of (N, C*kh*kw, L) columns: each column's window added back into
    the image, the transposed convolution whose grouped weight is one-hot (channel
    ``c*kh*kw + i*kw + j`` to tap ``(i, j)`` of output channel ``c``)."""
    cols = a["input"]

    def pair(v: Any) -> tuple[int, int]:
        return (int(v[0]), int(v[1])) if isinstance(v, list | tuple) else (int(v), int(v))

    if not isinstance(cols, Ref) or len(ir.shapes[cols]) != 3 or ir.dtypes[cols] != "float32":
        return None
    (hh, ww), (kh, kw) = pair(a["output_size"]), pair(a["kernel_size"])
    (dh, dw), (ph, pw), (sh, sw) = pair(a["dilation"]), pair(a["padding"]), pair(a["stride"])
    n, rows, length = ir.shapes[cols]
    channels, taps = rows // (kh * kw), kh * kw
    oh = (hh + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (ww + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    extra = (hh - ((oh - 1) * sh - 2 * ph + dh * (kh - 1) + 1),
             ww - ((ow - 1) * sw - 2 * pw + dw * (kw - 1) + 1))
    if channels * taps != rows or oh * ow != length or rows * taps > _MAX_BAKED:
        return None
    if not all(0 <= e < max(s, d) for e, s, d in zip(extra, (sh, sw), (dh, dw), strict=True)):
        return None
    weight = torch.eye(taps).view(taps, 1, kh, kw).repeat(channels, 1, 1, 1)
    image = b("view", "view", cols, n, rows, oh, ow)
    return b("conv_transpose2d", torch.nn.functional.conv_transpose2d, image, b.constant(weight),
             None, (sh, sw), (ph, pw), extra, channels, (dh, dw))


def _cdist(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``cdist`` as PyTorch computes it: for p = 2 over more than 25 rows on either side, one
    matrix product of ``[-2 x1, |x1|^2, 1]`` and ``[x2, 1, |x2|^2]``, clamped and rooted;
    otherwise the pairwise differences reduced (p = 1, 2 or infinity)."""
    x1, x2, p = a["x1"], a["x2"], float(a["p"])
    if not all(isinstance(v, Ref) and ir.dtypes[v] == "float32" for v in (x1, x2)):
        return None
    s1, s2 = ir.shapes[x1], ir.shapes[x2]
    if len(s1) < 2 or len(s1) != len(s2) or s1[:-2] != s2[:-2] or s1[-1] != s2[-1]:
        return None
    mode = a["compute_mode"]
    mm = p == 2.0 and (
        mode == "use_mm_for_euclid_dist"
        or (mode == "use_mm_for_euclid_dist_if_necessary" and (s1[-2] > 25 or s2[-2] > 25))
    )
    if mm:
        n1 = b("sum", torch.sum, b("pow", torch.pow, x1, 2.0), -1, True)
        n2 = b("sum", torch.sum, b("pow", torch.pow, x2, 2.0), -1, True)
        left = b("cat", torch.cat, [b("mul", torch.mul, x1, -2.0), n1, b("ones_like", torch.ones_like, n1)], -1)  # noqa: E501
        right = b("cat", torch.cat, [x2, b("ones_like", torch.ones_like, n2), n2], -1)
        product = b("matmul", torch.matmul, left, b("transpose", torch.transpose, right, -1, -2))  # noqa: E501
        return b("sqrt", torch.sqrt, b("clamp_min", torch.clamp_min, product, 1e-30))
    diff = b("sub", torch.sub, b("unsqueeze", torch.unsqueeze, x1, -2), b("unsqueeze", torch.unsqueeze, x2, -3))  # noqa: E501
    if p == 2.0:
        return b("sqrt", torch.sqrt, b("sum", torch.sum, b("mul", torch.mul, diff, diff), -1))
    if p == 1.0:
        return b("sum", torch.sum, b("abs", torch.abs, diff), -1)
    if p == math.inf:
        return b("amax", torch.amax, b("abs", torch.abs, diff), -1)
    return None
