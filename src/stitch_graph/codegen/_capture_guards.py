"""Forwards that branch on input values: the path real inputs take, checked at run time.

``torch.export`` refuses a forward whose Python control flow reads tensor values (``if
x.mean() > 0:``, or a library's argument check such as ``gaussian_nll_loss``'s ``var < 0``).
``torch.export.draft_export`` runs such a forward on real inputs instead and records the path
they took, each decision an ``_assert_scalar`` on an ``item()`` of a tensor. Here those decisions
become tensor ops: ``item`` is its 0-d tensor, ``sym_ite`` and ``sym_not`` are ``where`` and
``logical_not``, scalar comparisons compare tensors, and each assertion is a ``guard`` node. The
program computes the conditions with its own kernels, and its host checks them once its kernels
are launched (``KERNELS.guard``): an input that would take another path raises rather than get
the traced path's answer.
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx

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
    _decisions_as_tensor_ops(gm)
    _one_guard(gm)
    return gm


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """Export's loggers at ERROR and its prints discarded: on a data-dependent forward they
    show the graph around each decision, which the capture handles (or reports in its error)."""
    loggers = [logging.getLogger(n) for n in _CHATTY]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


_CHATTY = ("torch.export", "torch._export", "torch.fx.experimental.symbolic_shapes")

_SCALAR_OF_TENSOR = {torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default}
_REPLACED: dict[Any, Callable[..., Any]] = {
    torch.sym_ite: torch.where,
    torch.sym_not: torch.logical_not,
    torch.ops.aten._assert_scalar.default: guard,
}
_DROPPED = {
    torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}


def _decisions_as_tensor_ops(gm: torch.fx.GraphModule) -> None:
    """Rewrite the scalar decisions of a draft-exported graph into tensor ops (in place)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _SCALAR_OF_TENSOR:
            node.replace_all_uses_with(node.args[0])  # the 0-d tensor stands for its value
            gm.graph.erase_node(node)
        elif node.target in _DROPPED:
            gm.graph.erase_node(node)
        elif node.target in _REPLACED:
            node.target = _REPLACED[node.target]
        elif node.target is operator.not_:
            node.target = torch.logical_not
    gm.graph.lint()
    gm.recompile()


def _one_guard(gm: torch.fx.GraphModule) -> None:
    """The graph's guards as one, on the conjunction of their conditions (in place): one
    kernel computes them all, and the host waits once."""
    guards = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is guard]
    if len(guards) < 2:
        return
    with gm.graph.inserting_before(guards[-1]):
        condition = guards[0].args[0]
        for other in guards[1:]:
            condition = gm.graph.call_function(torch.logical_and, (condition, other.args[0]))
        message = "; ".join(str(g.args[1]) for g in guards)
        gm.graph.call_function(guard, (condition, message))
    for node in guards:
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
