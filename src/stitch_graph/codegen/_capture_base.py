"""What every capture stage shares: the capture errors and helpers for traced values.

The stages (tracing, lowering, alias tracking, decompositions) raise ``CaptureError`` and move
values between the traced graph and the IR: ``_subst`` puts each fx node's ``Ref`` (or folded
constant) in place of the node, ``_to_meta`` puts each ``Ref``'s meta tensor in place of the
``Ref``. They live here so that no stage imports another just for them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen.ir import OpNode, ParamSpec, ProgramIR, Ref, contiguous_strides


class CaptureError(RuntimeError):
    """The program could not be traced or its shapes could not be propagated."""


class _PropagationError(CaptureError):
    """The fx graph cannot be lowered as traced (it does not run on meta tensors, or it assigns
    into a tensor in a way only the exported graph spells out): ``torch.export`` is tried."""


_MAX_BAKED = 1 << 16  # elements of a constant tensor we are willing to bake into host code
BAKED_PREFIX = "_const_"  # the name of a constant the forward builds (no module attribute)


def module_state(ref: Ref) -> bool:
    """Whether ``ref`` is a parameter or buffer of the module, which outlives the call (a
    constant the forward builds, ``torch.zeros(T, d)`` to fill, does not)."""
    return ref.kind == "param" and not ref.name.startswith(BAKED_PREFIX)


def _bake(ir: ProgramIR, ours: dict[Ref, Any], name: str, tensor: torch.Tensor) -> Ref:
    """``tensor`` (on the CPU) as a non-persistent buffer ``name`` whose values the host code
    holds; its ``Ref``, with shape, strides, dtype and meta tensor recorded."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    spec = ParamSpec(
        name, tuple(tensor.shape), dtype, buffer=True, persistent=False,
        value=tensor.flatten().tolist(),
    )
    ir.params.append(spec)
    ref = Ref("param", spec.name)
    ir.shapes[ref], ir.dtypes[ref] = spec.shape, dtype
    ir.strides[ref] = contiguous_strides(spec.shape)
    ours[ref] = torch.empty(spec.shape, dtype=tensor.dtype, device="meta")
    return ref


def _flat(value: Any) -> list[Any]:
    """The leaves of nested lists, tuples and dict values."""
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    if isinstance(value, dict):
        return _flat(list(value.values()))
    return [value]


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    """The attribute of ``gm`` at a dotted path."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _is_tensor_seq(value: Any) -> bool:
    """Whether a traced value is a non-empty list or tuple of tensors."""
    return (
        isinstance(value, list | tuple) and bool(value) and all(torch.is_tensor(v) for v in value)
    )


def _subst(value: Any, env: dict[str, Any]) -> Any:
    """``value`` with every fx node replaced by what ``env`` binds it to."""
    if isinstance(value, torch.fx.Node):
        return env[value.name]
    if isinstance(value, list | tuple):
        return type(value)(_subst(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _subst(v, env) for k, v in value.items()}
    if isinstance(value, slice):  # x[:, :t] with t read from a size: its value
        return slice(*(_subst(v, env) for v in (value.start, value.stop, value.step)))
    if isinstance(value, torch.dtype | torch.device | torch.memory_format):
        return value
    return value


def _with_operands(value: Any, swap: dict[Ref, Ref]) -> Any:
    """``value`` with every operand (inputs and parameters included) that ``swap`` names
    replaced by the reference it maps it to."""
    if isinstance(value, Ref):
        return swap.get(value, value)
    if isinstance(value, dict):
        return {k: _with_operands(v, swap) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_with_operands(v, swap) for v in value)
    return value


def _rewire(node: OpNode, swap: dict[Ref, Ref]) -> None:
    """``node`` reads, wherever it names an operand that ``swap`` maps, the value it maps it
    to: its bound arguments and its original call's arguments alike."""
    for table in ("args", "call_args", "call_kwargs"):
        setattr(node, table, _with_operands(getattr(node, table), swap))


def _replace_by_built(ir: ProgramIR, node: OpNode, before: int, value: Ref) -> None:
    """The nodes a builder appended since the program had ``before`` nodes take ``node``'s
    place, and whatever read ``node`` (its readers, the outputs) reads ``value``."""
    at = ir.nodes.index(node)
    added = ir.nodes[before:]
    del ir.nodes[before:]
    ir.nodes[at : at + 1] = added
    _read_instead(ir, {Ref("node", node.name): value})


def _read_instead(ir: ProgramIR, swap: dict[Ref, Ref]) -> None:
    """Whatever reads a value that ``swap`` maps (the program's nodes, its outputs) reads the
    value it maps it to."""
    for reader in ir.nodes:
        _rewire(reader, swap)
    ir.outputs = [swap.get(ref, ref) for ref in ir.outputs]


def _describe(ir: ProgramIR, ref: Ref, shape: tuple[int, ...], dtype: str) -> None:
    """Record a new contiguous value's layout."""
    ir.shapes[ref], ir.strides[ref], ir.dtypes[ref] = shape, contiguous_strides(shape), dtype


def _copy_of(ir: ProgramIR, node: OpNode, name: str) -> OpNode:
    """A copy of ``node`` called ``name``, with argument containers of its own and the layout of
    ``node``'s value recorded for it; the caller places it in the program."""
    copy = replace(
        node,
        name=name,
        args=dict(node.args),
        call_args=list(node.call_args),
        call_kwargs=dict(node.call_kwargs),
        attrs=dict(node.attrs),
    )
    old, new = Ref("node", node.name), Ref("node", name)
    for table in (ir.shapes, ir.strides, ir.dtypes):
        table[new] = table[old]
    return copy


def _node_of(ir: ProgramIR, ref: Ref) -> OpNode | None:
    """The node that computes ``ref``; ``None`` for inputs and parameters."""
    if ref.kind != "node":
        return None
    return next((n for n in ir.nodes if n.name == ref.name), None)


def _meta(ir: ProgramIR, ref: Ref) -> torch.Tensor:
    """A meta tensor of ``ref``'s shape, strides and dtype."""
    dtype = getattr(torch, ir.dtypes[ref])
    return torch.empty_strided(ir.shapes[ref], ir.strides[ref], dtype=dtype, device="meta")


def _to_meta(value: Any, ours: dict[Ref, Any]) -> Any:
    """``value`` with every ``Ref`` replaced by its meta tensor in ``ours``."""
    if isinstance(value, Ref):
        return ours[value]
    if isinstance(value, list | tuple):
        return type(value)(_to_meta(v, ours) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v, ours) for k, v in value.items()}
    return value
