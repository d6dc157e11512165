"""Reductions over dims of one element are their input reshaped: views, not kernels."""

from __future__ import annotations

from pathlib import Path

from stitch_graph.codegen import capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.max(x.sum(1, keepdim=True), dim=1, keepdim=True)[0]
        y = torch.logsumexp(torch.mean(y, dim=1, keepdim=True), dim=1)
        return torch.amin(y.unsqueeze(0), dim=0) * 2 + x.{kept}(dim=1)


def get_inputs():
    return [torch.randn(6, {width})]


def get_init_inputs():
    return []
"""


def _reductions(source: str) -> list[str]:
    ir = capture_program(load_task(source))
    return [n.op for n in ir.nodes if n.op in ("sum", "amax", "amin", "mean", "logsumexp")]


def test_reductions_of_single_elements_become_views(tmp_path: Path) -> None:
    source = _PROBLEM.format(kept="amax", width=3)
    assert _reductions(source) == ["sum", "amax"]  # over 3 elements: kept
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_row_of_one_element_reduces_to_itself(tmp_path: Path) -> None:
    source = _PROBLEM.format(kept="sum", width=1)
    assert _reductions(source) == []
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)
