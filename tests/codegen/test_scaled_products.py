"""A matrix product scaled by a number is scaled through the operand whose kernel writes it, so
cuBLAS writes the result and no kernel reads it back to scale it; where the scaling costs
nothing already (a softmax computes it as it loads the scores), the program stays as it was.
The values match PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import _capture_lower, capture_program, plan_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, planned_kernels

_PROBLEM = """
import math
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 48, bias={bias})

    def forward(self, q, k):
        {body}


def get_inputs():
    return [torch.randn(4, 2, 64, 32), torch.randn(4, 2, 64, 32)]


def get_init_inputs():
    return []
"""

SCALED = [
    # rotated queries' scores, returned scaled: the factor joins the queries' kernel
    "return torch.matmul(torch.tanh(q) * 2.0 + q, k.transpose(-2, -1)) * 0.125",
    "return torch.sigmoid(q) @ k.transpose(-2, -1) / math.sqrt(32)",
    "return 0.5 * self.proj(torch.relu(q))",  # a projection without bias
]


def _product_ops(source: str) -> list[str]:
    """The ops of the GEMM's plan item: the product, then its epilogue kernel's ops."""
    items = plan_program(capture_program(load_task(source))).items
    (gemm,) = [item for item in items if item.kind == "gemm"]
    return gemm.ops


@pytest.mark.parametrize("body", SCALED)
def test_a_scaled_product_is_scaled_through_an_operand(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _PROBLEM.format(body=body, bias=False)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(_product_ops(source)) == 1  # cuBLAS writes the result
    monkeypatch.setattr(_capture_lower, "scale_operands_of_products", lambda ir: None)
    assert len(_product_ops(source)) == 2  # the product, then a kernel that scales it


@pytest.mark.parametrize(
    ("body", "bias"),
    [
        ("return torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1)", False),  # on load
        ("return 0.5 * self.proj(torch.relu(q))", True),  # the bias is not scaled with it
        ("s = q @ k.transpose(-2, -1)\n        return s * 0.125, s", False),  # read twice
        ("x = torch.tanh(q[:, :, :32])\n        return (x @ x) * 0.5", False),  # one operand, both factors
    ],
)
def test_a_product_whose_scaling_costs_nothing_or_cannot_move_stays(body: str, bias: bool) -> None:
    ir = capture_program(load_task(_PROBLEM.format(body=body, bias=bias)))
    assert not any(n.name.endswith(("__of_input", "__of_other", "__of_weight")) for n in ir.nodes)


def test_an_einsums_scores_are_scaled_where_the_queries_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scores reach the scaling through views of a batched product, and its operand is a
    permuted copy of the rotated queries: the factor joins the queries' kernel, and the kernel
    that read the scores back to scale them goes."""
    body = 'return torch.einsum("bthd,bshd->bhts", torch.tanh(q) + q, k) * 0.125'
    source = _PROBLEM.format(body=body, bias=False)
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)
    kernels = planned_kernels(source)
    monkeypatch.setattr(_capture_lower, "scale_operands_of_products", lambda ir: None)
    assert kernels < planned_kernels(source)
