"""A sum of a broadcast product over a dim both operands span, computed as one (batched) GEMM:
a cosine-similarity matrix on broadcast views, attention scores written with broadcasting, a
mean, a summed dim that is not the last. Each checked against PyTorch in the CPU emulation; a
vector broadcast against a matrix (a weighted sum) stays a reduction."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, a, b):
        return {expr}


def get_inputs():
    return [torch.randn({a}), torch.randn({b})]


def get_init_inputs():
    return []
"""

CASES = {
    "cosine_matrix": ("F.cosine_similarity(a.unsqueeze(1), b.unsqueeze(0), dim=-1) / 0.05",
                      "12, 40", "10, 40"),
    "batched_scores": ("(a.unsqueeze(2) * b.unsqueeze(1)).sum(-1).softmax(-1)",
                       "2, 16, 32", "2, 24, 32"),
    "mean_kept": ("(a[:, None, :] * b[None, :, :]).mean(-1, keepdim=True) + 1", "9, 20", "11, 20"),
    "summed_in_the_middle": ("(a.unsqueeze(3) * b.unsqueeze(2)).sum(1)", "3, 32, 16", "3, 32, 24"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_sum_is_a_gemm_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    expr, a, b = CASES[name]
    task, program = generate_checked(_PROBLEM.format(expr=expr, a=a, b=b))
    assert "_sgemm(" in program.host_source.split("class ModelNew")[1], name
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_weighted_sum_stays_a_reduction() -> None:
    task, program = generate_checked(
        _PROBLEM.format(expr="(a * b.unsqueeze(0)).sum(-1)", a="64, 40", b="40")
    )
    assert "_sgemm(" not in program.host_source.split("class ModelNew")[1]
