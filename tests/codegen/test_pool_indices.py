"""Max pooling's indices (``max_pool*d(..., return_indices=True)``) and ``max_unpool*d``,
generated and matched against PyTorch in the cooperative CPU emulation: the indices exactly,
ties to the first element as PyTorch's kernel takes them (a ReLU's zeros)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        {body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

CASES = {
    # SegNet's encoder and decoder: ties among a ReLU's zeros, the size given
    "segnet": (
        "y = torch.relu(x)\n"
        "        p, i = F.max_pool2d(y, 2, stride=2, return_indices=True)\n"
        "        return F.max_unpool2d(p * 2.0, i, 2, stride=2, output_size=y.shape) + y, i",
        "2, 4, 17, 20",
    ),
    # padding, dilation and ceil_mode; the default unpooled size
    "dilated": (
        "p, i = F.max_pool2d(x, 3, stride=2, padding=1, dilation=2, ceil_mode=True,"
        " return_indices=True)\n"
        "        return p, i, F.max_unpool2d(p, i, 2, stride=2)",
        "2, 3, 15, 16",
    ),
    "one_dim": (
        "p, i = F.max_pool1d(x, 4, stride=3, padding=2, return_indices=True)\n"
        "        return i, F.max_unpool1d(p, i, 4, stride=3, padding=2, output_size=[40])",
        "2, 5, 40",
    ),
    "three_dim": (
        "p, i = F.max_pool3d(torch.relu(x), 2, return_indices=True)\n"
        "        return F.max_unpool3d(p, i, 2), i",
        "2, 3, 6, 8, 8",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_max_pool_indices_and_unpooling_are_generated(case: str, tmp_path: Path) -> None:
    body, shape = CASES[case]
    task, program = generate_checked(_PROBLEM.format(body=body, shape=shape))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "arg = at" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
