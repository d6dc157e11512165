"""Capture a KernelBench program as ``ProgramIR``: trace it, propagate shapes, normalise its ops.

The reference is executed only symbolically: the model is built on the meta device (rebuilt on the
CPU under ``torch.manual_seed(0)`` only when it holds constants whose values the host code needs),
traced with ``torch.fx.symbolic_trace`` through every submodule but the normalisations
(``torch.export`` when fx fails or its graph does not run, its ATen calls spelled with public
callables in host code), and
shapes come from ``ShapeProp`` on meta tensors, so a problem with gigabytes of weights captures in
milliseconds. Every call becomes a canonical op (``F.gelu(x, approximate="tanh")`` ->
``gelu_tanh``, ``x.sum(1)`` -> ``sum``, ``nn.BatchNorm2d`` in eval -> ``batch_norm_eval``, ``x.T``
-> ``permute``, a global average pool -> ``mean``) with its arguments bound to the op registry's
signature names; composite calls (losses, distances, attention, two-operand ``einsum``) are
decomposed into registry ops, constants built in ``forward`` are baked, and in-place ops
(``x += y`` included) rebind the tensor they write and its whole aliases; a later read of a view or
base they changed is refused. Unknown calls keep all their arguments and stay in PyTorch.

Layout: this module is the entry point (``capture_program``); the stages live in private modules,
one concern each: ``_capture_base`` (``CaptureError`` and helpers for traced values),
``_capture_trace`` (building the model on meta, fx tracing or ``torch.export``, shape
propagation), ``_capture_lower`` (the walk over the traced graph that builds the IR's nodes),
``_capture_names`` (canonical op names, their variants and host-code spellings),
``_capture_aliases`` (in-place writes, aliases and views), ``_capture_decompose`` (composite calls
as registry ops) and ``_capture_compose`` (calls that are compositions of registry ops), both
writing through ``_capture_builder``, and ``_capture_passes`` (passes over the finished IR: dead
nodes, contiguous copies).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from stitch_graph.artifacts import Task
from stitch_graph.codegen._capture_base import CaptureError, _PropagationError
from stitch_graph.codegen._capture_lower import _lower
from stitch_graph.codegen._capture_trace import (
    _build_model,
    _export,
    _meta_inputs,
    _meta_model,
    _real_inputs,
    _trace,
)
from stitch_graph.codegen.ir import ProgramIR
from stitch_graph.runtime.problem_source import exec_problem

__all__ = ["CaptureError", "capture_program"]


def capture_program(task: Task, *, exact_order: bool = False) -> ProgramIR:
    """Trace the task's ``Model`` and lower it to the codegen IR.

    Args:
        task: A KernelBench task; ``task.inputs`` gives the input shapes (when empty, the source's
            ``get_inputs()`` is run on the meta device).
        exact_order: Keep every sum's terms in the reference's order: no rewrite that trades
            rounding for speed (``ProgramIR.reordered`` names those a default capture made).

    Returns:
        The program: inputs, parameters/buffers by dotted name, canonical nodes, outputs.

    Raises:
        CaptureError: The source has no ``Model`` or cannot be traced.
    """
    # the source by its file name for inspect (draft_export reads the forward's source lines)
    namespace = exec_problem(
        task.source, task.path or f"<task {task.name}>", f"stitch_task_{task.digest}"
    )
    if "Model" not in namespace:
        msg = f"task {task.name!r} defines no class Model"
        raise CaptureError(msg)
    init_args = list(task.init_args)
    if not init_args and "get_init_inputs" in namespace and not task.inputs:
        init_args = list(namespace["get_init_inputs"]())
    model = _meta_model(namespace, init_args)
    args, in_dtypes = _meta_inputs(task, namespace)

    def real() -> tuple[torch.nn.Module, list[Any]]:
        return _build_model(namespace, init_args, "cpu"), _real_inputs(namespace, args)

    gm, method = _trace(model, args, real)
    state = model.state_dict()
    needs_values = any(n.op == "get_attr" and n.target not in state for n in gm.graph.nodes) or any(
        name in m._non_persistent_buffers_set
        for _, m in model.named_modules()
        for name in m._buffers
    )
    on_meta = any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])

    def fresh() -> torch.nn.Module:
        if needs_values and on_meta:
            return _build_model(namespace, init_args, "cpu")
        return _meta_model(namespace, init_args)

    built = None
    if needs_values and on_meta:
        model = fresh()
        built = _attributes_of(model)  # built once: what a trace reassigns is undone
        gm, method = _trace(model, args, real)
        state = model.state_dict()
    try:
        return _lower(task, model, gm, method, args, in_dtypes, state, exact_order=exact_order)
    except _PropagationError:
        if method != "fx":
            raise
    # the fx graph does not run (a forward that assigns module attributes, say): export the
    # model as it was built (the trace may have reassigned its attributes)
    model = _restored(model, built) if built is not None else fresh()
    gm = _export(model, args, real)
    state = model.state_dict()
    return _lower(task, model, gm, "export", args, in_dtypes, state, exact_order=exact_order)


def _attributes_of(model: torch.nn.Module) -> list[tuple[torch.nn.Module, dict[str, Any]]]:
    """Each module's attributes, its parameter, buffer and submodule tables copied: what an fx
    trace of a forward that assigns attributes (an RNN's ``self.hidden = ...``) changes. Its
    tensors are not touched: the trace runs on proxies."""
    return [(module, _containers_copied(vars(module))) for module in model.modules()]


def _restored(
    model: torch.nn.Module, saved: list[tuple[torch.nn.Module, dict[str, Any]]]
) -> torch.nn.Module:
    """``model`` as it was built, from ``_attributes_of``: a model whose weights fill gigabytes
    on the CPU (a vanilla RNN's 2 GB, built in 5 s) is not built a second time."""
    for module, attributes in saved:
        vars(module).clear()
        vars(module).update(_containers_copied(attributes))
    return model


def _containers_copied(attributes: dict[str, Any]) -> dict[str, Any]:
    """``attributes`` with each dict, list and set copied (their items shared)."""
    return {
        name: copy.copy(value) if isinstance(value, dict | list | set) else value
        for name, value in attributes.items()
    }
