"""``F.interpolate`` lowered to gathers and blends: ``nearest`` and ``nearest-exact`` (a whole
factor as an expanded view and one copy; any other size as one gather at source indices
computed as PyTorch's CUDA kernel computes them), ``area`` (adaptive average pooling), and
``linear``, ``bilinear``, ``bicubic`` and ``trilinear`` (taps gathered at baked indices and
blended with baked weights). Other modes, antialiasing and non-float32 inputs stay in PyTorch.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from stitch_graph.codegen._capture_base import _MAX_BAKED
from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen.ir import ProgramIR, Ref

_LINEAR_MODES = ("linear", "bilinear", "bicubic", "trilinear")


def resize(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``interpolate``'s bound arguments ``a`` lowered, or ``None`` (nothing appended by a
    rule that declines)."""
    if a["mode"] in _LINEAR_MODES:
        return _linear_upsample(ir, b, a)
    if a["mode"] == "area" and not a["antialias"]:
        x = a["input"]
        nd = len(ir.shapes[x]) - 2 if isinstance(x, Ref) else 0
        target = _target(a, ir.shapes[x][2:], nd) if nd else None
        return None if target is None else _area(ir, b, x, target[0])
    return _nearest_upsample(ir, b, a) or _nearest_gather(ir, b, a)


def _target(
    a: dict[str, Any], spatial: tuple[int, ...], nd: int
) -> tuple[list[int], list[float | None]] | None:
    """The output size of each resized dim, and the scale PyTorch's kernel divides by (``None``
    where it computes input / output size instead); ``None`` without a size or a factor."""
    if a["size"] is not None:
        size = [int(n) for n in _per_dim(a["size"], nd)]
        scales: list[float | None] = [None] * nd
    elif a["scale_factor"] is not None:
        given = _per_dim(a["scale_factor"], nd)
        size = [math.floor(i * float(f)) for i, f in zip(spatial, given, strict=True)]
        scales = [None if a["recompute_scale_factor"] else float(f) for f in given]
    else:
        return None
    return (size, scales) if len(size) == nd else None


def _per_dim(value: Any, nd: int) -> list[Any]:
    """``interpolate``'s ``size`` or ``scale_factor``: one per resized dim, or one for all."""
    return list(value) if isinstance(value, list | tuple) else [value] * nd


def _nearest_operand(ir: ProgramIR, a: dict[str, Any]) -> Ref | None:
    """The input of a nearest resize of 1-3 trailing dims of a float32 tensor, else ``None``."""
    x = a["input"]
    if not isinstance(x, Ref) or a["mode"] not in ("nearest", "nearest-exact") or a["antialias"]:
        return None
    nd = len(ir.shapes[x]) - 2
    return x if nd in (1, 2, 3) and ir.dtypes[x] == "float32" else None


def _nearest_upsample(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``interpolate(mode='nearest')`` by whole powers of two, or ``'nearest-exact'`` by any
    whole factor, over the trailing 1-3 dims: each input element repeated, as an expanded view
    and one copy. A power of two keeps PyTorch's source index ``floor(i * (1 / s))`` exact in
    float32; other modes and factors stay."""
    x = _nearest_operand(ir, a)
    if x is None:
        return None
    shape = ir.shapes[x]
    nd = len(shape) - 2
    spatial = shape[2:]
    if a["size"] is not None:
        size = _per_dim(a["size"], nd)
        if len(size) != nd or any(int(o) % i for o, i in zip(size, spatial, strict=True)):
            return None
        factors = [int(o) // i for o, i in zip(size, spatial, strict=True)]
    elif a["scale_factor"] is not None:
        given = _per_dim(a["scale_factor"], nd)
        if len(given) != nd or any(float(f) != int(f) for f in given):
            return None
        factors = [int(f) for f in given]
    else:
        return None
    # nearest-exact's index floor((i + 0.5) / s) is i // s for every whole factor: the half
    # keeps it clear of the rounding that a bare i / s meets
    if any(f < 1 or (f & (f - 1) and a["mode"] == "nearest") for f in factors):
        return None
    lead = list(shape[:2])
    split = [*lead, *(d for i in spatial for d in (i, 1))]
    grown = [*lead, *(d for i, f in zip(spatial, factors, strict=True) for d in (i, f))]
    view = b("view", "view", x, *split)
    copied = b("contiguous", "contiguous", b("expand", "expand", view, *grown))
    out = [*lead, *(i * f for i, f in zip(spatial, factors, strict=True))]
    return b("view", "view", copied, *out)


def _area(ir: ProgramIR, b: _Builder, x: Any, size: Any) -> Ref | None:
    """``interpolate(mode='area')`` to a given size: PyTorch's adaptive average pooling."""
    nd = len(ir.shapes[x]) - 2 if isinstance(x, Ref) else 0
    if nd not in (1, 2, 3):
        return None
    pool = getattr(torch.nn.functional, f"adaptive_avg_pool{nd}d")
    return b(f"adaptive_avg_pool{nd}d", pool, x, _per_dim(size, nd))


def _linear_upsample(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``interpolate(mode='linear' | 'bilinear' | 'trilinear' | 'bicubic')``: per resized dim,
    two gathers of the input along it (four for bicubic) and a blend, with source indices and weights computed
    as PyTorch computes them (in float32) and baked; the last dim first, as PyTorch blends."""
    x = a["input"]
    if not isinstance(x, Ref) or a["antialias"] or ir.dtypes[x] != "float32":
        return None
    shape = ir.shapes[x]
    nd = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}[a["mode"]]
    if len(shape) != nd + 2:
        return None
    spatial = shape[2:]
    target = _target(a, spatial, nd)
    if target is None:
        return None
    size, scales = target
    tables = [
        (_cubic_tables if a["mode"] == "bicubic" else _linear_tables)(
            spatial[j], int(size[j]), scales[j], bool(a["align_corners"])
        )
        for j in range(nd)
    ]
    return _blend(ir, b, x, tables, size)


def _blend(ir: ProgramIR, b: _Builder, x: Ref, tables: list[Any], size: list[int]) -> Ref:
    """Per resized dim, its taps' (source indices, weights): gathered and blended in one
    kernel at baked joint indices, or one dim at a time where those are too many to bake."""
    shape, nd = ir.shapes[x], len(tables)
    spatial = shape[2:]
    if math.prod(int(n) for n in size) > _MAX_BAKED:
        return _separable_blend(b, x, tables, size)
    # the spatial dims flattened: each tap one gather at a baked joint index
    flat = b("reshape", torch.reshape, x, [*shape[:2], math.prod(spatial)])

    def placed(j: int, lead: int) -> list[int]:
        dims = [1] * (lead + nd)
        dims[lead + j] = int(size[j])
        return dims

    def blend(j: int, joint: torch.Tensor) -> Ref:
        """Every dim's taps gathered from the input itself, so that the blend is one kernel,
        with no pass writing the input resized along one dim only; in PyTorch's order, the
        last dim blended inside the first's."""
        if j == nd:
            return b("index", operator.getitem, flat, (slice(None), slice(None), b.constant(joint)))
        total = None
        for index, weight in tables[j]:
            picked = joint * spatial[j] + index.view(placed(j, 0))
            scale = b("view", "view", b.constant(weight), *placed(j, 2))
            term = b("mul", torch.mul, blend(j + 1, picked), scale)
            total = term if total is None else b("add", torch.add, total, term)
        return total

    return blend(0, torch.zeros([1] * nd, dtype=torch.int64))


def _separable_blend(b: _Builder, x: Ref, tables: list[Any], size: list[int]) -> Ref:
    """The blend one dim at a time, the last first, each pass's taps gathered from the one
    before: for outputs whose joint indices are too many to bake."""
    nd = len(tables)
    out = x
    for j in reversed(range(nd)):
        dim = 2 + j
        view = [1] * (nd + 2)
        view[dim] = int(size[j])
        lead = (slice(None),) * dim
        blend = None
        for index, weight in tables[j]:
            tap = b("index", operator.getitem, out, (*lead, b.constant(index)))
            term = b("mul", torch.mul, tap, b("view", "view", b.constant(weight), *view))
            blend = term if blend is None else b("add", torch.add, blend, term)
        out = blend
    return out


def _source(
    length: int, size: int, scale: float | None, align_corners: bool, *, cubic: bool
) -> torch.Tensor:
    """Each of ``size`` outputs' source coordinate, in float32 as PyTorch computes it (not
    clamped at zero for cubic)."""
    if align_corners:
        ratio = (length - 1) / (size - 1) if size > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else length / size
    ratio32 = torch.tensor(ratio, dtype=torch.float32)
    dst = torch.arange(size, dtype=torch.float32)
    if align_corners:
        return ratio32 * dst
    src = ratio32 * (dst + 0.5) - 0.5
    return src if cubic else src.clamp_min(0.0)


def _linear_tables(
    length: int, size: int, scale: float | None, align_corners: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Source indices (low, high) and their weights for each of ``size`` outputs."""
    src = _source(length, size, scale, align_corners, cubic=False)
    low = src.to(torch.int64).clamp_max(length - 1)
    high = torch.where(low < length - 1, low + 1, low)
    w_high = (src - low.to(torch.float32)).clamp(0.0, 1.0)
    return [(low, 1.0 - w_high), (high, w_high)]


def _cubic_tables(
    length: int, size: int, scale: float | None, align_corners: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The four taps' source indices (clamped into the input) and Keys cubic convolution
    weights (A = -0.75), as PyTorch's bicubic upsampling computes them."""
    a = -0.75
    src = _source(length, size, scale, align_corners, cubic=True)
    start = torch.floor(src)
    t = src - start

    def near(x: torch.Tensor) -> torch.Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: torch.Tensor) -> torch.Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    first = start.to(torch.int64) - 1
    return [((first + k).clamp(0, length - 1), w) for k, w in enumerate(weights)]


def _nearest_gather(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    """``nearest`` or ``nearest-exact`` to any size: one gather at the source index PyTorch's
    CUDA kernel takes, ``min(floor((i [+ 0.5]) * scale), n - 1)`` in float32."""
    x = _nearest_operand(ir, a)
    if x is None:
        return None
    shape = ir.shapes[x]
    nd = len(shape) - 2
    target = _target(a, shape[2:], nd)
    if target is None:
        return None
    size, scales = target
    half = 0.5 if a["mode"] == "nearest-exact" else 0.0
    tables = []
    for length, n, scale in zip(shape[2:], size, scales, strict=True):
        ratio = (1.0 / scale) if scale is not None and scale > 0 else None
        ratio32 = torch.tensor(ratio if ratio is not None else length, dtype=torch.float32)
        if ratio is None:
            ratio32 = ratio32 / torch.tensor(float(n), dtype=torch.float32)
        src = torch.floor((torch.arange(n, dtype=torch.float32) + half) * ratio32)
        index = src.to(torch.int64).clamp_max(length - 1)
        tables.append([(index, torch.ones(n))])
    return _blend(ir, b, x, tables, size)
