"""Two-stage (split) reductions over a few long contiguous rows: chunks of whole float4s read as
float4s where the row length allows it, run in the CPU emulation against PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_MSE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.mean((a - b) ** 2)

def get_inputs():
    return [torch.randn({n}), torch.randn({n})]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(("n", "wide"), [(1 << 17, True), ((1 << 17) + 3, False)])
def test_a_long_row_is_read_as_float4_where_its_length_allows(
    n: int, wide: bool, tmp_path: Path
) -> None:
    task, program = generate_checked(_MSE.format(n=n))
    assert "_part(" in program.kernel_source
    assert ("_part_v4(" in program.kernel_source) == wide
    assert ("if _aligned(" in program.host_source.split("def forward")[1]) == wide
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert any(name.endswith("_part_v4") for name in kernels.launched) == wide
