"""Forwards that branch on input values: the path real inputs take, checked at run time.

``torch.export`` refuses a forward whose Python control flow reads tensor values (``if
x.mean() > 0:``, or a library's argument check such as ``gaussian_nll_loss``'s ``var < 0``).
``torch.export.draft_export`` runs such a forward on real inputs instead and records the path
they took. Each decision read a 0-d tensor on the host (an ``item``); how the graph records the
decision differs between torch versions (runtime assertions, or nothing), so it is rebuilt here
from the value each ``item`` had on the real inputs: a ``guard`` node that the tensor still has
that value. The program computes the conditions with its own kernels, and its host checks them
once its kernels are launched (``KERNELS.guard``): an input that would take another path raises
rather than get the traced path's answer. A value read on the host that also feeds tensor
compute is refused: whether it decided a branch as well cannot be told from the graph.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx

from stitch_graph.codegen._capture_base import CaptureError

__all__ = ["GUARD_OP", "data_dependent", "draft_export", "guard", "quiet_export"]

GUARD_OP = "guard"
"""The IR op of a decision the traced path depends on (a 0-d bool tensor that must be true)."""


def guard(condition: torch.Tensor, message: str) -> torch.Tensor:
    """The traced graph's stand-in for an assertion: its condition as a bool tensor.

    It runs on meta tensors (shape propagation), so it checks nothing; the generated host checks
    the condition it computes (``KERNELS.guard``).
    """
    del message
    return condition.to(torch.bool)


def data_dependent(error: BaseException) -> bool:
    """Whether ``torch.export`` failed because control flow reads a tensor's value."""
    text = f"{type(error).__name__}: {error}"
    return any(
        mark in text
        for mark in ("GuardOnDataDependentSymNode", "data-dependent", "data dependent", "unbacked")
    )


def draft_export(model: torch.nn.Module, args: list[Any]) -> torch.fx.GraphModule:
    """The path ``args`` (real tensors) take through ``model``, its decisions as guards."""
    with quiet_export():
        gm = torch.export.draft_export(model, tuple(args)).module()
    read = _values_read(gm, args)
    _drop_scalar_logic(gm, read)
    _guard_values(gm, read)
    return gm


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """Export's loggers at ERROR and its prints discarded: on a data-dependent forward they
    show the graph around each decision, which the capture handles (or reports in its error).
    Gradients off too: a ``torch.no_grad()`` block in ``forward`` is then plain ops, not a
    ``wrap_with_set_grad_enabled`` call of a subgraph, and the program computes no gradient."""
    loggers = [logging.getLogger(n) for n in _CHATTY]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


_CHATTY = ("torch.export", "torch._export", "torch.fx.experimental.symbolic_shapes")

_SCALAR_OF_TENSOR = {torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default}


def _values_read(gm: torch.fx.GraphModule, args: list[Any]) -> dict[torch.fx.Node, Any]:
    """Each host read of a tensor (``item``) in ``gm`` and the value it had on ``args``."""
    read: dict[torch.fx.Node, Any] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            value = super().run_node(n)
            if n.op == "call_function" and n.target in _SCALAR_OF_TENSOR:
                read[n] = value
            return value

    with torch.no_grad():
        _Recorder(gm).run(*args)
    return read


def _drop_scalar_logic(gm: torch.fx.GraphModule, read: dict[torch.fx.Node, Any]) -> None:
    """Erase what the graph computes from the values read (symbolic comparisons, assertions),
    refusing a read value that reaches a tensor op."""
    derived: list[torch.fx.Node] = []
    seen = set(read)
    for node in gm.graph.nodes:
        if node in seen or not any(a in seen for a in node.all_input_nodes):
            continue
        if torch.is_tensor(node.meta.get("val")):
            msg = f"{node.name} computes with a tensor value read on the host ({node.format_node()})"
            raise CaptureError(msg)
        seen.add(node)
        derived.append(node)
    for node in reversed(derived):
        gm.graph.erase_node(node)


def _guard_values(gm: torch.fx.GraphModule, read: dict[torch.fx.Node, Any]) -> None:
    """One guard, after the graph's last node, that every read tensor still holds the value it
    had when traced: one kernel computes the conjunction, and the host waits once."""
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    conditions: list[torch.fx.Node] = []
    with graph.inserting_before(output):
        for node, value in read.items():
            tensor = node.args[0]
            if isinstance(value, bool):
                held = tensor if value else graph.call_function(torch.logical_not, (tensor,))
            else:
                held = graph.call_function(torch.eq, (tensor, value))
            conditions.append(held)
        if conditions:
            condition = conditions[0]
            for other in conditions[1:]:
                condition = graph.call_function(torch.logical_and, (condition, other))
            words = ", ".join(f"{n.args[0].name} was {v!r}" for n, v in read.items())
            graph.call_function(guard, (condition, f"traced where {words}"))
    for node in read:
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
