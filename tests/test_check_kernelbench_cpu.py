"""The CPU check of generated programs for KernelBench-format problems, batch shrunk."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tool_scripts import load_tool

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.softmax(self.bn(self.conv(x)), dim=1) + 0.01 * torch.randn(1, device=x.device)


batch_size = 64


def get_inputs():
    return [torch.randn(batch_size, 3, 10, 10)]


def get_init_inputs():
    return []
"""


def test_the_batch_is_shrunk_and_the_program_matches_in_training_mode(tmp_path: Path):
    tool = load_tool("check_kernelbench_cpu")
    assert "batch_size = 2\n" in tool.shrink(PROBLEM, 2)
    problem = tmp_path / "conv_bn_softmax.py"
    problem.write_text(PROBLEM)
    out = tmp_path / "rows.json"
    assert tool.main([str(tmp_path), "--batch", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    # batch-norm statistics of the batch (training mode) and the draw in forward both match
    assert row["ok"], row
    assert row["declared"] == ["randn"] and row["kernels"] >= 1
    assert row["err"] <= 1e-4 and row["err_f64"] <= 1e-4


def test_the_error_agrees_on_nan_and_infinity_on_both_sides() -> None:
    import torch

    tool = load_tool("check_kernelbench_cpu")
    nan, inf = float("nan"), float("inf")
    same = torch.tensor([nan, inf, -inf, 1.0])
    assert tool._max_error([same], [same.clone()]) == 0.0
    assert tool._max_error([same], [torch.tensor([0.0, inf, -inf, 1.0])]) == inf
    assert tool._max_error([same], [torch.tensor([nan, inf, -inf, 1.5])]) == 0.5
