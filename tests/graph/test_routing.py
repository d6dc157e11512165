"""The loop's routing, driven by scripted chat models, the real nvcc and a scripted GPU."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from stitch_graph import StitchContext, create_stitch_graph, load_task
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedChatModel, ScriptedExecutor, call, passed, profile, wrong

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")

PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x + y)

def get_inputs():
    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]

def get_init_inputs():
    return []
"""

KERNEL = r"""
extern "C" __global__ void add_relu(const float* __restrict__ x, const float* __restrict__ y,
                                    float* __restrict__ out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i] + y[i], 0.0f);
}
"""

BROKEN_KERNEL = KERNEL.replace("fmaxf(x[i] + y[i], 0.0f)", "fmaxf(x[i] + z[i], 0.0f)")

HOST = """
import torch


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        KERNELS.add_relu((n + 255) // 256, 256, x, y, out, n)
        return out
"""


def plan_answer(n_items: int = 1):
    items = [
        {
            "kernel": f"add_relu_{i}",
            "ops": ["add", "relu"],
            "fusion": "one pass",
            "kind": "pointwise",
        }
        for i in range(n_items)
    ]
    return call("PlanDraft", summary="fuse add and relu", items=items)


def program(kernel: str = KERNEL) -> AIMessage:
    return call("CandidateDraft", kernel_source=kernel, host_source=HOST)


@pytest.fixture
def task():
    return load_task(PROBLEM, name="add_relu")


def run(task, *, planner, coder, executor, **settings):
    ctx = StitchContext(
        planner_model=planner, coder_model=coder, executor=executor, use_knowledge=False, **settings
    )
    graph = create_stitch_graph()
    return graph.invoke({"task": task}, context=ctx), graph


def test_happy_path_with_a_tool_call_before_handing_over(task, tmp_path):
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(
        script=[
            call("nvcc_compile", kernel_source=KERNEL),
            AIMessage(content="draft compiles"),
            program(),
        ]
    )
    executor = ScriptedExecutor([passed()])
    result, _ = run(task, planner=planner, coder=coder, executor=executor, work_dir=str(tmp_path))
    report = result["report"]
    assert report.outcome == "verified"
    assert report.best.timing.speedup_vs_compile == pytest.approx(1.5)
    # the tool result the coder saw came from the real nvcc
    tool_messages = [m for m in coder.prompts[1] if isinstance(m, ToolMessage)]
    assert "nvcc succeeded" in tool_messages[0].content
    assert "add_relu" in tool_messages[0].content
    assert result["messages"][-1].content == report.summary


def test_compile_error_goes_back_to_the_coder_and_is_fixed(task):
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(
        script=[
            AIMessage(content="here"),
            program(BROKEN_KERNEL),
            AIMessage(content="fixed"),
            program(),
        ]
    )
    executor = ScriptedExecutor([passed()])
    result, _ = run(task, planner=planner, coder=coder, executor=executor, max_tool_calls=1)
    history = result["report"].details
    assert result["report"].outcome == "verified"
    # the second coder request carried the real compiler error, with its line
    second_request = coder.prompts[2][-1].content
    assert "compile_error" in second_request
    assert 'identifier "z" is undefined' in second_request
    assert len(executor.verified) == 1, "the broken program must never run"
    assert history["items"] == {"k1": "done"}


def test_wrong_result_goes_back_to_the_coder(task):
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(script=[program(), program(KERNEL + "\n// second try\n")])
    executor = ScriptedExecutor([wrong(), passed()])
    result, _ = run(task, planner=planner, coder=coder, executor=executor, max_tool_calls=0)
    assert result["report"].outcome == "verified"
    assert "wrong_result" in coder.prompts[1][-1].content
    assert "25.00% of elements differ" in coder.prompts[1][-1].content
    assert result["report"].best.round == 2


def test_bottleneck_with_headroom_goes_to_the_planner(task):
    planner = ScriptedChatModel(script=[plan_answer(), plan_answer()])
    coder = ScriptedChatModel(script=[program(), program(KERNEL + "\n// tuned\n")])
    executor = ScriptedExecutor([passed(1.0), passed(0.8)], profiles=[profile(0.6), profile(0.6)])
    result, _ = run(
        task, planner=planner, coder=coder, executor=executor, max_tool_calls=0, max_replans=1
    )
    assert len(planner.prompts) == 2, "the planner was asked to re-plan"
    replan_request = planner.prompts[1][-1].content
    assert "bottleneck" in replan_request and "memory-bound" in replan_request
    assert result["report"].best.timing.candidate_ms == 0.8
    assert result["report"].rounds == 2


@pytest.mark.parametrize(("second_ms", "rounds"), [(0.99, 2), (0.8, 3)])
def test_a_replan_that_gained_nothing_is_the_last_one(task, second_ms, rounds):
    """Two re-plans are allowed; after a first that made the program only 1% faster the run
    ends (a 20% gain earns the second)."""
    planner = ScriptedChatModel(script=[plan_answer(), plan_answer(), plan_answer()])
    coder = ScriptedChatModel(
        script=[program(), program(KERNEL + "\n// a\n"), program(KERNEL + "\n// b\n")]
    )
    outcomes = [passed(1.0), passed(second_ms), passed(0.5)]
    executor = ScriptedExecutor(outcomes, profiles=[profile(0.6)] * 3)
    result, _ = run(
        task, planner=planner, coder=coder, executor=executor, max_tool_calls=0, max_replans=2
    )
    report = result["report"]
    assert report.rounds == rounds and len(planner.prompts) == rounds
    assert len(executor.outcomes) == 3 - rounds  # the third program was never asked for
    assert report.best.timing.candidate_ms == (0.99 if rounds == 2 else 0.5)


def test_budget_exhaustion_finalizes_with_the_best_so_far(task):
    planner = ScriptedChatModel(script=[plan_answer(2)])
    coder = ScriptedChatModel(script=[program()] + [program(KERNEL + f"//{i}") for i in range(5)])
    executor = ScriptedExecutor([passed(), wrong(), wrong(), wrong()])
    result, _ = run(
        task, planner=planner, coder=coder, executor=executor, max_tool_calls=0, max_rounds=3
    )
    report = result["report"]
    assert report.rounds == 3
    assert report.best is not None and report.best.round == 1
    assert report.details["items"] == {"k1": "done", "k2": "pending"}


def test_malformed_output_is_retried_then_fails_cleanly(task):
    garbage = [call("PlanDraft", summary="x", items="not a list") for _ in range(3)]
    planner = ScriptedChatModel(script=garbage)
    result, _ = run(
        task, planner=planner, coder=None, executor=ScriptedExecutor([]), model_retries=2
    )
    report = result["report"]
    assert report.outcome == "failed"
    assert "no valid PlanDraft after 3 attempts" in report.summary
    # the model was shown its parse error before each retry
    assert "could not be parsed as PlanDraft" in planner.prompts[1][-1].content
    assert len(planner.prompts) == 3


def test_malformed_output_then_valid_output_recovers(task):
    planner = ScriptedChatModel(script=[AIMessage(content="I think we should fuse"), plan_answer()])
    coder = ScriptedChatModel(script=[program()])
    result, _ = run(
        task, planner=planner, coder=coder, executor=ScriptedExecutor([passed()]), max_tool_calls=0
    )
    assert result["report"].outcome == "verified"


def test_model_verifier_calls_its_tools_then_sends_findings_to_the_planner(
    task, monkeypatch, tmp_path
):
    from stitch_graph.knowledge import reset_default_index

    monkeypatch.setenv("STITCH_EMBEDDER", "hashing")  # the weight-free embedder keeps this quick
    monkeypatch.setenv("STITCH_CACHE_DIR", str(tmp_path))
    reset_default_index()
    planner = ScriptedChatModel(script=[plan_answer(), plan_answer()])
    coder = ScriptedChatModel(script=[program(), program(KERNEL + "// vectorised\n")])
    verifier = ScriptedChatModel(
        script=[
            call("search_cuda_knowledge", query="DRAM throughput 40% elementwise kernel", k=2),
            AIMessage(content="loads are scalar"),
            call(
                "AnalysisDraft",
                summary="scalar loads",
                items=[{"action": "vectorise loads", "detail": "use float4", "source": "verifier"}],
            ),
            AIMessage(content="fine now"),
            call("AnalysisDraft", summary="near peak", items=[]),
        ]
    )
    executor = ScriptedExecutor([passed(1.0), passed(0.7)], profiles=[profile(0.6), profile(0.6)])
    ctx = StitchContext(
        planner_model=planner,
        coder_model=coder,
        verifier_model=verifier,
        executor=executor,
        max_tool_calls=1,
        max_replans=1,
    )
    result = create_stitch_graph().invoke({"task": task}, context=ctx)
    reset_default_index()
    tool_reply = [m for m in verifier.prompts[1] if isinstance(m, ToolMessage)][0]
    assert tool_reply.content.startswith("Knowledge entries for: DRAM throughput 40%")
    assert "\n2. [" in tool_reply.content and "\n3. [" not in tool_reply.content
    replan_request = planner.prompts[1][-1].content
    assert "vectorise loads: use float4 (verifier)" in replan_request
    assert result["report"].best.timing.candidate_ms == 0.7


def test_round_records_are_keyed_by_round():
    from stitch_graph.agents.state import append_records
    from stitch_graph.artifacts import RoundRecord

    first = [RoundRecord(round=1, summary="analysing"), RoundRecord(round=2)]
    merged = append_records(first, [RoundRecord(round=1, summary="done"), RoundRecord(round=3)])
    assert [(r.round, r.summary) for r in merged] == [(1, "done"), (2, ""), (3, "")]


def test_a_reference_that_fails_on_the_gpu_ends_the_run_with_a_clear_reason(task):
    from stitch_graph.artifacts import TestResult, TimingResult
    from stitch_graph.execution import VerificationOutcome

    broken = VerificationOutcome(
        test=TestResult(
            status="error",
            reason="reference failed: RuntimeError: CUDA error",
            failed_side="reference",
        ),
        timing=TimingResult(status="not_run"),
        seconds=0.1,
    )
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(script=[program()])
    result, _ = run(
        task, planner=planner, coder=coder, executor=ScriptedExecutor([broken]), max_tool_calls=0
    )
    report = result["report"]
    assert report.rounds == 1, "no retries against a broken reference"
    assert "reference failed: RuntimeError: CUDA error" in report.summary


def test_compile_errors_come_back_with_knowledge_advice(task, monkeypatch, tmp_path):
    from stitch_graph.knowledge import reset_default_index

    monkeypatch.setenv("STITCH_EMBEDDER", "hashing")  # the weight-free embedder keeps this quick
    monkeypatch.setenv("STITCH_CACHE_DIR", str(tmp_path))
    reset_default_index()
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(script=[program(BROKEN_KERNEL), program()])
    ctx = StitchContext(
        planner_model=planner,
        coder_model=coder,
        max_tool_calls=0,
        executor=ScriptedExecutor([passed()]),
    )
    result = create_stitch_graph().invoke({"task": task}, context=ctx)
    reset_default_index()
    assert result["report"].outcome == "verified"
    fix_request = coder.prompts[1][-1].content
    assert "(nvcc)" in fix_request and "(knowledge:" in fix_request
