"""``F.max_unpool1d/2d/3d`` written out in registry ops: each plane's pooled values stored at
the positions their indices name (flattened over the plane, as ``max_pool*d(...,
return_indices=True)`` gives them) in a plane of zeros. One ``scatter`` over the planes
flattened; where two indices repeat, which value stays is unspecified, as in PyTorch."""

from __future__ import annotations

import math
from typing import Any

import torch

from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen.ir import ProgramIR, Ref

UNPOOL_SIGNATURES = {
    f"max_unpool{d}d": "input, indices, kernel_size, stride=None, padding=0, output_size=None"
    for d in (1, 2, 3)
}


def _per_dim(value: Any, nd: int) -> list[int] | None:
    values = list(value) if isinstance(value, list | tuple) else [value]
    if not all(isinstance(v, int) for v in values) or len(values) not in (1, nd):
        return None
    return values * nd if len(values) == 1 else values


def unpool(ir: ProgramIR, b: _Builder, name: str, a: dict[str, Any]) -> Ref | None:
    """The call in registry ops; ``None`` outside (N, C, *spatial) float32 values and int64
    indices of one shape."""
    nd = int(name[-2])
    x, idx = a["input"], a["indices"]
    if not (isinstance(x, Ref) and isinstance(idx, Ref)):
        return None
    shape = list(ir.shapes[x])
    if len(shape) != nd + 2 or list(ir.shapes[idx]) != shape:
        return None
    if ir.dtypes.get(x) != "float32" or ir.dtypes.get(idx) != "int64":
        return None
    kernel = _per_dim(a["kernel_size"], nd)
    stride = _per_dim(a["stride"] if a["stride"] is not None else a["kernel_size"], nd)
    padding = _per_dim(a["padding"], nd)
    if kernel is None or stride is None or padding is None:
        return None
    if a["output_size"] is not None:
        size = [int(s) for s in list(a["output_size"])[-nd:]]
    else:
        size = [(n - 1) * s - 2 * p + k for n, s, p, k in zip(
            shape[2:], stride, padding, kernel, strict=True)]
    planes, length, out_length = shape[:2], math.prod(shape[2:]), math.prod(size)
    values = b("reshape", torch.reshape, x, [*planes, length])
    positions = b("reshape", torch.reshape, idx, [*planes, length])
    zeros = b("new_zeros", "new_zeros", x, [*planes, out_length])
    placed = b("scatter", torch.scatter, zeros, 2, positions, values)
    return b("reshape", torch.reshape, placed, [*planes, *size])
