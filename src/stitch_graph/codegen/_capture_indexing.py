"""Advanced indexing by integer tensors on adjacent dims, read (``x[i, j]``) and written
(``index_put``, ``y[i, j] = v``, ``adj.index_put_((b, dst, src), w, accumulate=True)``).

Both flatten the indexed dims into one and index it by ``i * size_j + j`` (each index wrapped
into its dim, as negative indices are): a read becomes one gather, a write one scatter into a
copy of the tensor. A sum (``accumulate=True``) adds with atomics, as PyTorch's CUDA kernel
does without deterministic algorithms; a plain write stores, and where indices repeat the
winner is unspecified, as in PyTorch.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from stitch_graph.codegen._capture_builder import _Builder
from stitch_graph.codegen.ir import ProgramIR, Ref


def _flat_joint(
    ir: ProgramIR, b: _Builder, x: Ref, index: Any, least: int
) -> tuple[Ref, Ref, int, int] | None:
    """(``x`` with its indexed dims flattened, the joint index, the first and last indexed
    dims) for an index of ``least`` or more int64 tensors on adjacent dims after full slices;
    ``None`` for any other index."""
    items = list(index) if isinstance(index, tuple | list) else [index]
    items = [slice(None) if item is None else item for item in items]
    dims = [k for k, v in enumerate(items) if isinstance(v, Ref)]
    if len(dims) < least or dims != list(range(dims[0], dims[0] + len(dims))):
        return None
    if any(v != slice(None) for k, v in enumerate(items) if k not in dims):
        return None
    shape = ir.shapes[x]
    if len(items) > len(shape) or any(ir.dtypes.get(items[k]) != "int64" for k in dims):
        return None
    joint: Ref | None = None
    for k in dims:
        wrapped = b("remainder", torch.remainder, items[k], shape[k])
        joint = wrapped if joint is None else b(
            "add", torch.add, b("mul", torch.mul, joint, shape[k]), wrapped)
    first, last = dims[0], dims[-1]
    sizes = [*shape[:first], math.prod(shape[first:last + 1]), *shape[last + 1:]]
    flat = b("reshape", torch.reshape, x, sizes)
    assert joint is not None
    return flat, joint, first, last


def joint_index(ir: ProgramIR, b: _Builder, x: Ref, index: Any) -> Ref | None:
    """``x[i, j]`` with integer tensors on adjacent dims (``logp[torch.arange(n), target]``),
    after full slices, as one gather; ``None`` for any other index."""
    found = _flat_joint(ir, b, x, index, least=2)
    if found is None:
        return None
    flat, joint, first, _ = found
    return b("index", operator.getitem, flat, (*[slice(None)] * first, joint))


def sliced_index(ir: ProgramIR, b: _Builder, x: Ref, index: Any) -> Ref | None:
    """``x[perm, :, a:b]``: one int64 tensor beside slices, some not whole, as the slices'
    view then a gather by the tensor (slices keep every dim, so it indexes the same dim);
    ``None`` for any other index."""
    items = list(index) if isinstance(index, tuple) else [index]
    tensors = [k for k, v in enumerate(items) if isinstance(v, Ref)]
    if len(tensors) != 1 or ir.dtypes.get(items[tensors[0]]) != "int64":
        return None
    if not all(isinstance(v, slice) for k, v in enumerate(items) if k != tensors[0]):
        return None
    if all(v == slice(None) for k, v in enumerate(items) if k != tensors[0]):
        return None  # a gather by itself
    at = tensors[0]
    view = b("getitem", operator.getitem, x,
             tuple(slice(None) if k == at else v for k, v in enumerate(items)))
    return b("index", operator.getitem, view, (*[slice(None)] * at, items[at]))


def index_put(
    ir: ProgramIR, b: _Builder, x: Ref, index: Any, values: Any, accumulate: bool
) -> Ref | None:
    """``x`` with ``x[index] = values`` (or ``+=`` with ``accumulate``) applied, for float32
    ``x`` indexed by int64 tensors on adjacent dims after full slices: ``index_add`` or
    ``scatter`` along the flattened dims, then the result shaped as ``x``. ``None`` for any
    other index or value."""
    if ir.dtypes.get(x) != "float32":
        return None
    if isinstance(values, Ref) and ir.dtypes.get(values) != "float32":
        return None
    if not isinstance(values, Ref) and (accumulate or isinstance(values, bool)
                                        or not isinstance(values, int | float)):
        return None
    found = _flat_joint(ir, b, x, index, least=1)
    if found is None:
        return None
    flat, joint, first, last = found
    shape = ir.shapes[x]
    lead, rest, spread = list(shape[:first]), list(shape[last + 1:]), list(ir.shapes[joint])
    count = math.prod(spread)
    positions = b("reshape", torch.reshape, joint, [count])
    along = [*lead, count, *rest]
    if isinstance(values, Ref):
        target = [*lead, *spread, *rest]
        if list(ir.shapes[values]) != target:
            values = b("expand", "expand", values, target)
        values = b("reshape", torch.reshape, values, along)
    if accumulate:
        put = b("index_add", torch.index_add, flat, first, positions, values)
    else:
        placed = [1] * len(lead) + [count] + [1] * len(rest)
        spots = b("expand", "expand", b("reshape", torch.reshape, positions, placed), along)
        if isinstance(values, Ref):
            put = b("scatter", torch.scatter, flat, first, spots, values)
        else:
            put = b("scatter", torch.scatter, flat, first, spots, value=float(values))
    return b("reshape", torch.reshape, put, list(shape))
