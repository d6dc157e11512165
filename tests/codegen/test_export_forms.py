"""Calls as ``torch.export`` writes them (the path a program takes when fx cannot trace it):
``adaptive_max_pool2d`` returns values and indices, ``eye`` is an ATen overload, ``F.unfold``
and ``F.fold`` are ``im2col`` and ``col2im``. With the fx trace turned off, each must be
generated whole and match PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

import stitch_graph.codegen._capture_trace as capture_trace
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(2, 3, 11, 9)]


def get_init_inputs():
    return []
"""

EXPRS = [
    "F.adaptive_max_pool2d(x, (4, 3)) * 2.0",
    "x.flatten(1).t() @ x.flatten(1) * torch.eye(297, dtype=torch.bool, device=x.device)",
    "x.masked_fill(torch.eye(11, 9, dtype=torch.bool, device=x.device), -9e15).softmax(-1)",
    # ATen's im2col and col2im: F.unfold's and F.fold's
    "F.fold(F.unfold(x, 3, padding=1, stride=2) * 0.5, (11, 9), 3, padding=1, stride=2)",
]


@pytest.fixture
def export_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("fx trace turned off")

    monkeypatch.setattr(capture_trace._ThroughTracer, "trace", refuse)


@pytest.mark.parametrize("expr", EXPRS)
def test_exported_calls_are_generated(expr: str, tmp_path: Path, export_only: None) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
