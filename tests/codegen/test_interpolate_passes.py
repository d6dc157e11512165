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


# nearest to sizes that are not whole multiples: one gather at PyTorch's source indices; area
# by a scale factor: adaptive average pooling to the size it floors to
GATHERED = [
    ("F.interpolate(x, scale_factor=1.7, mode='nearest') + 1.0", "2, 3, 6, 5"),
    ("F.interpolate(x, size=(11, 13), mode='nearest-exact') * 2.0", "2, 3, 8, 10"),
    ("F.interpolate(x, scale_factor=3, mode='nearest') - 1.0", "2, 3, 4, 5"),
    ("F.interpolate(x, size=7, mode='nearest')", "2, 3, 5"),
    ("F.interpolate(x, scale_factor=0.5, mode='area') + 1.0", "2, 3, 9, 8"),
]


@pytest.mark.parametrize(("expr", "shape"), GATHERED)
def test_nearest_and_area_to_any_size(expr: str, shape: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr, shape=shape))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True, rtol=0, atol=1e-6)
