"""Results of ops left to PyTorch are read with our (contiguous) layout.

``torch.einsum`` with more than a matrix product returns a permuted view of its product; the
kernels after it index the result as a contiguous buffer, so the host makes it one.
"""

from __future__ import annotations

from pathlib import Path

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        y = torch.einsum("bhzc,bchp->bzhp", a, b)
        return torch.relu(y[:, :-1]) * 2.0


def get_inputs():
    return [torch.randn(2, 3, 4, 5), torch.randn(2, 5, 3, 6)]


def get_init_inputs():
    return []
"""


def test_permuted_einsum_result_matches_pytorch(tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM)
    assert "torch.einsum" in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
