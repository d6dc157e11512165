"""``torch.eye`` built in ``forward``: a small one baked, one too large to bake compared from
baked row and column numbers (a pairwise mask over 300 particles), in float32, int64 and bool,
fully generated and checked against PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        n = x.size(1)
        return {expr}


def get_inputs():
    return [torch.randn(2, {n})]


def get_init_inputs():
    return []
"""

CASES = [
    ("x[:, :, None] * (1 - torch.eye(n, device=x.device))", 300),
    ("x[:, :, None] + torch.eye(n, n + 3, dtype=torch.long, device=x.device)[:, :n]", 260),
    ("x[:, None, :].masked_fill(torch.eye(n, dtype=torch.bool, device=x.device), 0.0)", 270),
    ("x[:, :, None] * torch.eye(n, device=x.device)", 40),
]


@pytest.mark.parametrize(("expr", "n"), CASES)
def test_eye_is_generated(expr: str, n: int, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr, n=n))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path)
