"""Rule-based and model-driven agents mixed in one run."""

from __future__ import annotations

import pytest

from stitch_graph import StitchContext, create_stitch_graph, load_task
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedChatModel, ScriptedExecutor, call, passed
from tests.graph.test_routing import PROBLEM, program

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")


def run(planner, coder):
    ctx = StitchContext(
        planner_model=planner,
        coder_model=coder,
        use_knowledge=False,
        max_tool_calls=0,
        executor=ScriptedExecutor([passed()]),
    )
    return create_stitch_graph().invoke({"task": load_task(PROBLEM, name="add_relu")}, context=ctx)


def test_rule_planner_with_a_model_coder():
    coder = ScriptedChatModel(script=[program()])
    result = run(None, coder)
    assert result["report"].outcome == "verified"
    request = coder.prompts[0][-1].content
    assert '"author": "rules"' in request and "k0_add_relu" in request


def test_model_planner_with_the_rule_coder_following_graph_names():
    plan = call("PlanDraft", summary="fuse", items=[{"kernel": "fused", "ops": ["add", "relu"]}])
    planner = ScriptedChatModel(script=[plan])
    result = run(planner, None)
    assert result["report"].outcome == "verified"
    assert "add = add[1024, 1024]" in planner.prompts[0][-1].content
    assert 'extern "C" __global__' in result["report"].best.candidate.kernel_source
    assert result["report"].details["items"] == {"k1": "done"}


def test_rule_coder_uses_its_own_schedule_when_the_plan_names_unknown_ops():
    plan = call("PlanDraft", summary="fuse", items=[{"kernel": "fused", "ops": ["x plus y, relu"]}])
    result = run(ScriptedChatModel(script=[plan]), None)
    report = result["report"]
    assert report.outcome == "verified"
    assert list(report.details["items"]) == ["k0"], "the generator's own item ids"


CONV_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(2, 8, 16, 16)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(("second_ms", "best_round"), [(1.0, 2), (4.0, 1)])
def test_rule_agents_try_the_generated_convolution_when_cudnn_loses_to_eager(
    second_ms: float, best_round: int
):
    """Round 1 (cuDNN) measures 0.67x vs eager; round 2 is the generated convolution, once, and
    the faster of the two is the result."""
    executor = ScriptedExecutor([passed(3.0), passed(second_ms)])
    ctx = StitchContext(use_knowledge=False, max_tool_calls=0, profile=False, max_rounds=4,
                        executor=executor)
    task = load_task(CONV_PROBLEM, name="conv_relu")
    result = create_stitch_graph().invoke({"task": task}, context=ctx)
    report = result["report"]
    assert report.rounds == 2 and report.best.round == best_round
    assert len(executor.verified) == 2
    uses_cudnn = "KERNELS.conv(" in report.best.candidate.host_source
    assert uses_cudnn == (best_round == 1)
    assert ("_im2col" in report.best.candidate.kernel_source) == (best_round == 2)
