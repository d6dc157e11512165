"""Zero padding written before a convolution, folded into the convolution's own.

``conv(F.pad(x, (p, p, ...)))`` copied the padded input into a tensor of its own (a kernel, a
read and a write of the input) before the convolution read it, and a convolution pads with
zeros as it reads. Equal pads on both sides add to the convolution's padding. A pad larger on
one side (a causal convolution's ``F.pad(x, (d, 0))``, WaveNet's and a TCN's) pads both sides
by the larger amount, and the outputs that only the extra zeros reach are sliced off, where
the difference is a whole number of strides: each output kept reads the same elements and the
same zeros as before, so the values are the same.
"""

from __future__ import annotations

from typing import Any

from stitch_graph.codegen._capture_base import _describe
from stitch_graph.codegen._capture_passes import _eliminate_dead, _relayout_views
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref

_CONVS = {"conv1d": 1, "conv2d": 2, "conv3d": 3}


def pads_into_convolutions(ir: ProgramIR) -> None:
    """Fold each zero ``pad`` that only a convolution reads into that convolution."""
    users = ir.users()
    outputs = {r.name for r in ir.outputs if r.kind == "node"}
    for conv in list(ir.nodes):
        nd = _CONVS.get(conv.op)
        src = conv.args.get("input")
        if nd is None or not isinstance(src, Ref) or src.kind != "node":
            continue
        pad = ir.node(src.name)
        if pad.op != "pad" or users[pad.name] != [conv.name] or pad.name in outputs:
            continue
        folded = _folded(pad, conv, nd)
        if folded is None:
            continue
        padding, skips = folded
        if conv.name in outputs and _output_shape(ir, conv, pad.args["input"], padding) != (
            tuple(conv.shape)
        ):
            continue  # an output is written whole, not a view of a larger result
        _fold(ir, conv, pad.args["input"], padding, skips)
    _eliminate_dead(ir)
    _relayout_views(ir)  # views of a sliced result read its larger rows


def _per_dim(value: Any, nd: int) -> list[int] | None:
    if isinstance(value, int):
        return [value] * nd
    if isinstance(value, list | tuple) and len(value) == nd and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _folded(pad: OpNode, conv: OpNode, nd: int) -> tuple[list[int], list[int]] | None:
    """The convolution's padding with ``pad`` folded in, and the outputs to skip at the start
    of each spatial dim; ``None`` where the pad is not zeros on the spatial dims alone or its
    sides differ by other than whole strides."""
    value = pad.args.get("value")
    if pad.args.get("mode", "constant") != "constant" or value not in (None, 0, 0.0):
        return None
    sides = pad.args.get("pad")
    padding = _per_dim(conv.args.get("padding"), nd)
    stride = _per_dim(conv.args.get("stride"), nd)
    if not isinstance(sides, list | tuple) or len(sides) != 2 * nd or padding is None or stride is None:
        return None
    if any(not isinstance(s, int) or s < 0 for s in sides):
        return None
    merged, skips = [], []
    for d in range(nd):  # F.pad lists the last dim first
        low, high = sides[2 * (nd - 1 - d)], sides[2 * (nd - 1 - d) + 1]
        wider = max(low, high)
        if (wider - low) % stride[d]:
            return None
        merged.append(padding[d] + wider)
        skips.append((wider - low) // stride[d])
    return merged, skips


def _fold(ir: ProgramIR, conv: OpNode, x: Ref, padding: list[int], skips: list[int]) -> None:
    """``conv`` reads ``x`` with ``padding``; where outputs are skipped, it writes a larger
    result under a name of its own and a chain of ``narrow`` views takes its name."""
    wanted, full = tuple(conv.shape), _output_shape(ir, conv, x, padding)
    a = conv.args
    conv.args = {**a, "input": x, "padding": tuple(padding)}
    conv.call = f"torch.nn.functional.{conv.op}"
    conv.call_args = [x, a["weight"], a.get("bias"), a.get("stride", 1), tuple(padding),
                      a.get("dilation", 1), a.get("groups", 1)]
    conv.call_kwargs = {}
    if full == wanted:
        return
    ref = Ref("node", conv.name)
    dtype = ir.dtypes[ref]
    conv.name = f"{conv.name}__padded"
    conv.shape = full
    _describe(ir, Ref("node", conv.name), full, dtype)
    strides = ir.strides[Ref("node", conv.name)]
    at = ir.nodes.index(conv) + 1
    source, shape = Ref("node", conv.name), full
    sliced = [d for d in range(len(full)) if full[d] != wanted[d]]
    for n, d in enumerate(sliced):
        start = skips[d - 2]
        shape = (*shape[:d], wanted[d], *shape[d + 1 :])
        name = ref.name if n == len(sliced) - 1 else f"{ref.name}__narrow{d}"
        view = OpNode(
            name=name,
            op="narrow",
            args={"input": source, "dim": d, "start": start, "length": wanted[d]},
            shape=shape,
            dtype=dtype,
            call="torch.narrow",
            call_args=[source, d, start, wanted[d]],
        )
        ir.nodes.insert(at + n, view)
        view_ref = Ref("node", name)
        ir.shapes[view_ref], ir.strides[view_ref], ir.dtypes[view_ref] = shape, strides, dtype
        source = view_ref


def _output_shape(ir: ProgramIR, conv: OpNode, src: Ref, padding: list[int]) -> tuple[int, ...]:
    """The convolution's output shape on ``src`` with ``padding``."""
    x = ir.shapes[src]
    k = ir.shapes[conv.args["weight"]][2:]
    nd = len(k)
    stride = _per_dim(conv.args.get("stride", 1), nd) or [1] * nd
    dilation = _per_dim(conv.args.get("dilation", 1), nd) or [1] * nd
    spatial = [
        (x[2 + d] + 2 * padding[d] - dilation[d] * (k[d] - 1) - 1) // stride[d] + 1
        for d in range(nd)
    ]
    return (conv.shape[0], conv.shape[1], *spatial)
