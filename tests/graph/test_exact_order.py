"""A wrong result from a program whose capture reordered a sum sends the rule-based Coder to
the program that keeps the reference's order (real nvcc, a scripted GPU)."""

from __future__ import annotations

import pytest

from stitch_graph import StitchContext, create_stitch_graph, load_task
from stitch_graph.agents.coder import exact_order_plan
from stitch_graph.agents.program_cache import program_ir
from stitch_graph.artifacts import Feedback
from stitch_graph.codegen import plan_program
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedExecutor, passed, wrong

PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 128)

    def forward(self, x):
        return self.fc(x).sum(dim=1, keepdim=True) / 2

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
"""


@pytest.fixture
def task():
    return load_task(PROBLEM, name="linear_row_sum")


def _wrong_result() -> Feedback:
    return Feedback(target="coder", category="wrong_result", summary="output 0 differs")


def test_the_exact_plan_keeps_the_product_whole(task):
    plan = plan_program(program_ir(task))
    assert program_ir(task).reordered == ["sum_products_first"]
    exact = exact_order_plan(task, plan, _wrong_result())
    assert exact is not None and exact.exact_order
    assert exact.revision == plan.revision + 1
    assert "sum_products_first" in exact.summary
    assert [i.kind for i in exact.items] == ["gemm", "reduction"]
    assert program_ir(task, exact_order=True).reordered == []
    # once exact, or for feedback that is not about the result, nothing changes
    assert exact_order_plan(task, exact, _wrong_result()) is None
    bottleneck = Feedback(target="planner", category="bottleneck")
    assert exact_order_plan(task, plan, bottleneck) is None


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")
def test_a_wrong_reordered_program_is_followed_by_the_exact_one(task):
    executor = ScriptedExecutor([wrong(), passed()])
    ctx = StitchContext(executor=executor, use_knowledge=False)
    result = create_stitch_graph().invoke({"task": task}, context=ctx)
    assert result["report"].outcome == "verified"
    assert len(set(executor.verified)) == 2  # two different programs were run
    # the kept program multiplies by the whole weight (128 features), then sums the rows
    host = result["result"]["program"]["host_source"]
    assert "_sgemm(1, 0, 128, 64, 256, _get(self, 'fc.weight')" in host
