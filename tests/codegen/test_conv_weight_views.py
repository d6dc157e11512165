"""A convolution whose weight is a view (a filter expanded to every channel, a tied weight
permuted, a flipped and transposed one) reads the values the view holds: capture copies such a
weight, and the emitter refuses one that is not contiguous rather than read past it. Each
checked against PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.arange(9, dtype=torch.float32).view(1, 1, 3, 3) / 9)
        self.w = torch.nn.Parameter(torch.randn(6, 4, 3, 3))
        self.v = torch.nn.Parameter(torch.randn(4, 1, 5))

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(2, 4, 12, 12)]


def get_init_inputs():
    return []
"""

EXPRS = [
    "F.conv2d(x, self.k.expand(4, 1, -1, -1), padding=1, groups=4)",
    "F.conv2d(x, self.k.expand(6, 4, -1, -1))",
    "F.conv2d(F.conv2d(x, self.w), self.w.permute(1, 0, 2, 3))",
    "F.conv_transpose2d(x, self.w.flip(-1).transpose(2, 3).transpose(0, 1))",
    "F.conv1d(x.flatten(2), self.v.expand(4, 1, 5), groups=4)",
]


@pytest.mark.parametrize("expr", EXPRS)
def test_a_viewed_weight_is_read_as_its_view(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
