"""A spatial transformer's two steps, ``F.affine_grid`` and bilinear or nearest
``F.grid_sample`` (zeros, border and reflection padding, both ``align_corners``), generated whole and
matching PyTorch in the CPU emulation, coordinates outside the input included, from a traced
forward or an exported one; bicubic sampling stays in PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(5 * 6 * 8, 6)

    def forward(self, x, g):
        theta = self.loc(x.flatten(1)).view(-1, 2, 3)
        return {expr}


def get_inputs():
    return [torch.randn(3, 5, 6, 8), torch.randn(3, 7, 9, 2) * 0.8]


def get_init_inputs():
    return []
"""

EXPRS = [
    "F.grid_sample(x, g, align_corners=False)",
    "F.grid_sample(torch.relu(x), g * 1.4, align_corners=True) + 1",  # some points outside
    "F.grid_sample(x, g * 1.6, padding_mode='border', align_corners=False)",
    "F.affine_grid(theta, (3, 5, 4, 7), align_corners=False)",
    "F.grid_sample(x, F.affine_grid(theta, (3, 5, 6, 8), align_corners=True), align_corners=True)",
    # the size as a list of the input's dims: a forward fx cannot trace, exported as ATen's
    # affine_grid_generator and grid_sampler
    "F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)",
    # the nearest pixel (a flow warp's), halves rounded to even
    "F.grid_sample(x, g * 1.3, mode='nearest', align_corners=False) * 2",
    "F.grid_sample(x, g * 1.5, mode='nearest', padding_mode='border', align_corners=True)",
    # reflected at the edges, several spans out on both sides
    "F.grid_sample(x, g * 3.5, padding_mode='reflection', align_corners=False)",
    "F.grid_sample(x, g * 3.5, padding_mode='reflection', align_corners=True)",
    "F.grid_sample(x, g * 2.5, mode='nearest', padding_mode='reflection', align_corners=False)",
]


@pytest.mark.parametrize("expr", EXPRS)
def test_grid_sampling_is_generated_and_matches_pytorch(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_bicubic_sampling_stays_in_pytorch() -> None:
    _, program = generate_checked(_PROBLEM.format(expr="F.grid_sample(x, g, mode='bicubic', align_corners=False) * 2"))
    assert "grid_sample" in program.declared_torch_ops
