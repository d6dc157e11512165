"""A sum over a product's output features becomes a product with the summed weights.

Each case runs the generated program in the CPU emulation against PyTorch; the captured
program must hold no product of the full feature count where the rewrite applies, and must
keep it where it does not (a sum over another dim, a product read twice).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(48, 40)
        self.weight = nn.Parameter(torch.randn(40, 48))

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(6, 5, 48)]


def get_init_inputs():
    return []
"""

REWRITTEN = {
    "linear_sum": "self.fc(x).sum(-1, keepdim=True) * 0.5",
    "scaled_matmul_sum": "(torch.matmul(x, self.weight.T) / 2).sum(dim=2) * 1.5",
    "linear_mean": "torch.mean(3.0 * self.fc(x), dim=-1)",
    "mm_transposed": "torch.relu(torch.mm(x[0], self.weight.t()).sum(1))",
}
KEPT = {
    "sum_over_rows": "self.fc(x).sum(1)",
    "read_twice": "self.fc(x).sum(-1, keepdim=True) + self.fc(x)",
}


def _full_products(source: str) -> int:
    ir = capture_program(load_task(source))
    return sum(1 for n in ir.nodes if n.op in ("linear", "matmul", "mm") and n.shape[-1] == 40)


@pytest.mark.parametrize("case", sorted(REWRITTEN))
def test_summed_products_match_pytorch(case: str, tmp_path: Path) -> None:
    source = _PROBLEM.format(expr=REWRITTEN[case])
    assert _full_products(source) == 0
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize("case", sorted(KEPT))
def test_other_sums_keep_their_product(case: str, tmp_path: Path) -> None:
    source = _PROBLEM.format(expr=KEPT[case])
    assert _full_products(source) >= 1
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)
