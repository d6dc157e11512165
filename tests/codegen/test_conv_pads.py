"""Zero padding written before a convolution is folded into the convolution's own padding:
equal sides add to it, and a causal convolution's left pad (WaveNet's, a TCN's) pads both
sides with the extra outputs sliced off, the gate's ``chunk`` reading through the slice. Other
pads (sides that differ by part of a stride, a value other than zero, a pad read twice) stay
kernels. Each program must match PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(8, 16, 3, dilation=2)
        self.r1 = nn.Conv1d(8, 8, 1)
        self.c2 = nn.Conv2d(6, 6, 3, stride={stride}, padding=1)
        self.c3 = nn.Conv3d(4, 4, 3)

    def forward(self, x, y, z):
        {body}


def get_inputs():
    return [torch.randn(2, 8, 40), torch.randn(2, 6, 13, 12), torch.randn(2, 4, 6, 7, 5)]


def get_init_inputs():
    return []
"""

FOLDED = {
    "causal_gate": """h = self.c1(F.pad(x, (4, 0)))
        a, b = h.chunk(2, dim=1)
        return (x + self.r1(torch.tanh(a) * torch.sigmoid(b))) * 0.5""",
    "right_only": "return torch.relu(self.c1(F.pad(x, (0, 4))))",
    "symmetric_2d": "return self.c2(F.pad(y, (2, 2, 1, 1))) * 2.0",
    "symmetric_3d": "return torch.sigmoid(self.c3(F.pad(z, (1, 1, 1, 1, 1, 1))))",
}

KEPT = {
    "part_of_a_stride": ("return self.c2(F.pad(y, (0, 1, 0, 1)))", 2),
    "ones": ("return self.c2(F.pad(y, (1, 1, 1, 1), value=1.0))", 1),
    "read_twice": ("p = F.pad(y, (1, 1, 1, 1))\n        return self.c2(p), p * 2.0", 1),
}


@pytest.mark.parametrize("name", FOLDED)
def test_a_zero_pad_is_folded_into_the_convolution(name: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(stride=1, body=FOLDED[name]))
    assert not any(n.op == "pad" for n in capture_program(task).nodes)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("name", KEPT)
def test_other_pads_stay_and_match(name: str, tmp_path: Path) -> None:
    body, stride = KEPT[name]
    task, program = generate_checked(_PROBLEM.format(stride=stride, body=body))
    assert any(n.op == "pad" for n in capture_program(task).nodes)
    check_on_cpu(task, program, tmp_path, cooperative=True)
