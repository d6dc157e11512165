"""Values a forward computes from constants alone, computed once at capture.

A detector's grid of cell centres, ``(torch.arange(H) + 0.5) * stride`` spread by
``meshgrid``, depends on no input and no module state, yet it was two kernels on every call.
Such a value is computed here, on the CPU, and baked into the program like the constants it
comes from, where it would be a kernel of its own (a copy, a scan, a reduction). Only
constants the forward builds are read (never a parameter or buffer, which ``load_state_dict``
may change), no random draw is folded, and a result over ``_MAX_BAKED`` elements stays a
kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from stitch_graph.codegen._capture_base import _MAX_BAKED, BAKED_PREFIX, _bake, _read_instead
from stitch_graph.codegen._capture_passes import _call, _eliminate_dead
from stitch_graph.codegen.ir import OpNode, ProgramIR, Ref
from stitch_graph.codegen.ops import lookup

_DRAWS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "poisson", "exponential")


def fold_constants(ir: ProgramIR) -> None:
    """Replace each value computed from baked constants alone, where a kernel or the host
    reads it, by a baked constant of its values."""
    values: dict[Ref, torch.Tensor] = {
        Ref("param", p.name): torch.tensor(p.value, dtype=getattr(torch, p.dtype)).reshape(p.shape)
        for p in ir.params
        if p.name.startswith(BAKED_PREFIX) and p.value is not None
    }
    outputs = {r.name for r in ir.outputs if r.kind == "node"}
    computed: list[OpNode] = []
    for node in ir.nodes:
        refs = node.tensor_refs()
        if not refs or node.name in outputs or any(d in node.op for d in _DRAWS):
            continue
        if not all(r in values for r in refs):
            continue
        value = _evaluate(node, values)
        if value is not None:
            values[Ref("node", node.name)] = value
            computed.append(node)
    inside = {n.name for n in computed}
    read_elsewhere = {
        r.name for n in ir.nodes if n.name not in inside for r in n.tensor_refs()
    } | {r.name for r in ir.outputs}
    for n in reversed(computed):  # a view read elsewhere stays: what it views is read
        info = lookup(n.op)
        if n.name in read_elsewhere and info is not None and info.kind == "view":
            read_elsewhere |= {r.name for r in n.tensor_refs()}
    swap = {
        Ref("node", n.name): _bake(ir, {}, f"{BAKED_PREFIX}{n.name}", values[Ref("node", n.name)])
        for n in computed
        if n.name in read_elsewhere and _kernel_of_its_own(n)
    }
    if swap:
        _read_instead(ir, swap)
        _eliminate_dead(ir)


def _kernel_of_its_own(node: OpNode) -> bool:
    """Whether ``node`` would be a kernel of its own: a copy (a reshape of an expanded grid), a
    scan, a reduction. A pointwise value or a view of constants (a causal mask from ``ones``
    and ``triu``) is computed where it is read, in registers, which a baked tensor would turn
    into loads."""
    info = lookup(node.op)
    return node.op == "copy" or info is None or info.kind not in ("pointwise", "view", "identity")


def _evaluate(node: OpNode, values: dict[Ref, torch.Tensor]) -> torch.Tensor | None:
    """``node`` run on the CPU on the constants' values, where it gives a tensor of its
    recorded shape and dtype small enough to bake; else ``None``."""

    def real(value: Any) -> Any:
        if isinstance(value, Ref):
            return values[value]
        if isinstance(value, list | tuple):
            return type(value)(real(v) for v in value)
        return value

    try:
        with torch.no_grad():
            value = _call(node.call)(*real(node.call_args), **real(node.call_kwargs))
    except Exception:  # noqa: BLE001 - a call that does not run here stays in the program
        return None
    if not torch.is_tensor(value) or value.numel() > _MAX_BAKED:
        return None
    if tuple(value.shape) != tuple(node.shape) or str(value.dtype) != f"torch.{node.dtype}":
        return None
    return value.contiguous()
