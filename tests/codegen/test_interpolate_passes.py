"""Linear, bilinear and bicubic resizing gather every tap from the input itself at a baked
joint index, so the blend is one kernel (a crop of a feature map included); outputs with too
many positions to bake blend one dim at a time. Each checked against PyTorch in the CPU
emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, planned_kernels

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

ONE_KERNEL = [
    ("F.interpolate(x, scale_factor=2, mode='bilinear') * 2.0", "2, 3, 6, 5"),
    ("F.interpolate(x[:, :, 1:5, 2:6], size=(7, 7), mode='bilinear') + 1.0", "2, 3, 8, 8"),
    ("F.interpolate(x, size=(9, 4), mode='bicubic', align_corners=True) - 1.0", "2, 3, 5, 6"),
]


@pytest.mark.parametrize(("expr", "shape"), ONE_KERNEL)
def test_the_blend_is_one_kernel(expr: str, shape: str, tmp_path: Path) -> None:
    source = _PROBLEM.format(expr=expr, shape=shape)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    assert planned_kernels(source) == 1
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_large_output_blends_one_dim_at_a_time(tmp_path: Path) -> None:
    source = _PROBLEM.format(
        expr="F.interpolate(x, scale_factor=2, mode='bilinear') * 2.0", shape="1, 1, 130, 140"
    )
    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    assert planned_kernels(source) == 2
    check_on_cpu(task, program, tmp_path)
