"""Sampling at computed coordinates: ``F.affine_grid`` and bilinear ``F.grid_sample`` (a spatial
transformer's two steps) written out in registry ops.

``affine_grid`` is PyTorch's own formula: a baked base grid of (x, y, 1) rows times each
``theta`` transposed, one batched GEMM. ``grid_sample`` unnormalises the grid's coordinates,
gathers the four neighbours of each from the input flattened over (H, W), and blends them with
the weights and in the order PyTorch's kernel uses; neighbours outside the input count as zero
(``padding_mode='zeros'``), or the coordinates are clipped first (``'border'``) or reflected
at the edges and then clipped (``'reflection'``), as PyTorch's kernel does. Bicubic sampling
stays in PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch

from stitch_graph.codegen._capture_base import _MAX_BAKED
from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen.ir import ProgramIR, Ref

SAMPLE_SIGNATURES = {
    "affine_grid": "theta, size, align_corners=None",
    "grid_sample": "input, grid, mode='bilinear', padding_mode='zeros', align_corners=None",
    # the ATen calls a forward exported by torch.export holds (modes as PyTorch's enums)
    "affine_grid_generator": "theta, size, align_corners",
    "grid_sampler": "input, grid, interpolation_mode, padding_mode, align_corners",
}
_MODES = ("bilinear", "nearest", "bicubic")
_PADDINGS = ("zeros", "border", "reflection")


def sample(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """The call in registry ops; ``None`` where it is outside what this reproduces."""
    if name in ("affine_grid", "affine_grid_generator"):
        return _affine_grid(ir, b, a["theta"], a["size"], bool(a["align_corners"]))
    if name == "grid_sampler":
        mode, padding = a.pop("interpolation_mode"), a["padding_mode"]
        if mode not in range(len(_MODES)) or padding not in range(len(_PADDINGS)):
            return None
        a = {**a, "mode": _MODES[mode], "padding_mode": _PADDINGS[padding]}
    return _grid_sample(ir, b, a)


def _linspace(n: int, align_corners: bool) -> torch.Tensor:
    """The normalised coordinates of ``n`` pixels: their centres, or the corners' for
    ``align_corners``."""
    if n <= 1:
        return torch.zeros(max(n, 0))
    line = torch.linspace(-1.0, 1.0, n)
    return line if align_corners else line * (n - 1) / n


def _affine_grid(
    ir: ProgramIR, b: _Builder, theta: Any, size: Any, align_corners: bool
) -> Ref | None:
    if not isinstance(theta, Ref) or ir.dtypes[theta] != "float32" or len(size) != 4:
        return None
    n, _c, h, w = (int(v) for v in size)
    if tuple(ir.shapes[theta]) != (n, 2, 3) or h * w * 3 > _MAX_BAKED:
        return None
    base = torch.ones(h, w, 3)
    base[..., 0] = _linspace(w, align_corners)
    base[..., 1] = _linspace(h, align_corners).unsqueeze(-1)
    rows = b("expand", "expand", b.constant(base.view(1, h * w, 3)), n, h * w, 3)
    grid = b("matmul", torch.bmm, rows, b("transpose", torch.transpose, theta, 1, 2))
    return b("view", "view", grid, n, h, w, 2)


def _grid_sample(ir: ProgramIR, b: _Builder, a: dict[str, Any]) -> Ref | None:
    x, grid = a["input"], a["grid"]
    if a["mode"] not in ("bilinear", "nearest") or a["padding_mode"] not in _PADDINGS:
        return None
    if not isinstance(x, Ref) or not isinstance(grid, Ref) or len(ir.shapes[x]) != 4:
        return None
    if ir.dtypes[x] != "float32" or ir.dtypes[grid] != "float32":
        return None
    n, c, h, w = ir.shapes[x]
    gn, ho, wo, two = ir.shapes[grid]
    if gn != n or two != 2:
        return None
    align = bool(a["align_corners"])
    if a["padding_mode"] == "reflection" and align and min(h, w) == 1:
        return None  # PyTorch's reflection of a single aligned pixel: a constant 0

    def coordinate(k: int, size: int) -> Ref:
        g = b("select", torch.select, grid, 3, k)  # (N, Ho, Wo)
        if align:
            pixel = b("mul", torch.mul, b("add", torch.add, g, 1.0), (size - 1) / 2)
        else:
            pixel = b("div", torch.div, b("sub", torch.sub, b("mul", torch.mul, b("add", torch.add, g, 1.0), float(size)), 1.0), 2.0)  # noqa: E501
        if a["padding_mode"] == "reflection":
            low, high = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
            pixel = _reflected(b, pixel, low, high)
        if a["padding_mode"] != "zeros":
            pixel = b("clamp", torch.clamp, pixel, 0.0, float(size - 1))
        return pixel

    ix, iy = coordinate(0, w), coordinate(1, h)
    x0, y0 = b("floor", torch.floor, ix), b("floor", torch.floor, iy)
    x1, y1 = b("add", torch.add, x0, 1.0), b("add", torch.add, y0, 1.0)
    flat = b("view", "view", x, n, c, h * w)

    def corner(cx: Ref, cy: Ref, weight: Ref | None) -> Ref:
        inside = b(
            "logical_and",
            torch.logical_and,
            b("logical_and", torch.logical_and, b("ge", torch.ge, cx, 0.0), b("le", torch.le, cx, float(w - 1))),  # noqa: E501
            b("logical_and", torch.logical_and, b("ge", torch.ge, cy, 0.0), b("le", torch.le, cy, float(h - 1))),  # noqa: E501
        )
        at = b("add", torch.add, b("mul", torch.mul, cy, float(w)), cx)
        index = b("long", "long", b("clamp", torch.clamp, at, 0.0, float(h * w - 1)))
        index = b("expand", "expand", b("view", "view", index, n, 1, ho * wo), n, c, ho * wo)
        value = b("gather", torch.gather, flat, 2, index)
        kept = b("where", torch.where, b("view", "view", inside, n, 1, ho * wo), value, 0.0)
        if weight is None:
            return kept
        return b("mul", torch.mul, kept, b("view", "view", weight, n, 1, ho * wo))

    if a["mode"] == "nearest":  # the pixel nearest, halves to even as PyTorch's nearbyint
        nearest = corner(b("round", torch.round, ix), b("round", torch.round, iy), None)
        return b("view", "view", nearest, n, c, ho, wo)

    dx1, dx0 = b("sub", torch.sub, x1, ix), b("sub", torch.sub, ix, x0)
    dy1, dy0 = b("sub", torch.sub, y1, iy), b("sub", torch.sub, iy, y0)
    nw = corner(x0, y0, b("mul", torch.mul, dx1, dy1))
    ne = corner(x1, y0, b("mul", torch.mul, dx0, dy1))
    sw = corner(x0, y1, b("mul", torch.mul, dx1, dy0))
    se = corner(x1, y1, b("mul", torch.mul, dx0, dy0))
    total = b("add", torch.add, b("add", torch.add, b("add", torch.add, nw, ne), sw), se)
    return b("view", "view", total, n, c, ho, wo)


def _reflected(b: _Builder, pixel: Ref, twice_low: int, twice_high: int) -> Ref:
    """A coordinate reflected into ``[low, high]`` (given doubled) as PyTorch's grid sampler
    reflects it: by the distance past ``low``, folded back on every other span."""
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = b("abs", torch.abs, b("sub", torch.sub, pixel, low))
    extra = b("fmod", torch.fmod, distance, span)
    flips = b("floor", torch.floor, b("div", torch.div, distance, span))
    even = b("eq", torch.eq, b("remainder", torch.remainder, flips, 2.0), 0.0)
    forward = b("add", torch.add, extra, low)
    back = b("add", torch.add, b("rsub", torch.rsub, extra, span), low)
    return b("where", torch.where, even, forward, back)
