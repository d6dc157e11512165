"""Autotuning inside the loop: the Verifier tunes a finished rule-generated program once, the
Coder re-emits it with the chosen settings, and the next round judges it; a scripted GPU."""

from __future__ import annotations

import pytest

from stitch_graph import StitchContext, create_stitch_graph, load_task, memory_checkpointer
from stitch_graph.agents.run_folder import render_markdown
from stitch_graph.artifacts import KernelChoice, TuningReport
from stitch_graph.codegen import KernelTuning, Tuning
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedChatModel, ScriptedExecutor, passed
from tests.graph.test_routing import PROBLEM, plan_answer, program

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")


class TuningExecutor(ScriptedExecutor):
    """A scripted GPU that also tunes: it returns ``tuned`` and records what it was asked."""

    def __init__(self, outcomes, tuned: Tuning | None):
        super().__init__(outcomes)
        self.tuned = tuned
        self.calls: list[dict] = []

    def tune_candidate(self, task, plan, tuning, ctx, *, bottleneck, budget_s):
        self.calls.append({"tuning": tuning, "bottleneck": bottleneck, "budget_s": budget_s})
        report = TuningReport(
            seconds=2.5,
            device="fake GPU",
            base_ms=1.0,
            best_ms=0.5,
            choices=[
                KernelChoice(
                    item="k0",
                    kind="pointwise",
                    setting={"block_size": 1024},
                    tried=6,
                    base_ms=1.0,
                    best_ms=0.5,
                )
            ],
        )
        return self.tuned, report


@pytest.fixture
def task():
    return load_task(PROBLEM, name="add_relu")


def run(task, executor, **settings):
    """The whole final state of a run (the graph's output is only messages and the report)."""
    ctx = StitchContext(executor=executor, use_knowledge=False, **settings)
    graph = create_stitch_graph(checkpointer=memory_checkpointer())
    config = {"configurable": {"thread_id": "tuning"}}
    graph.invoke({"task": task}, config, context=ctx)
    return graph.get_state(config).values


FASTER = Tuning(kernels={"k0": KernelTuning(block_size=1024)})


def test_tuned_settings_are_re_emitted_and_judged_in_the_next_round(task, tmp_path):
    executor = TuningExecutor([passed(1.0), passed(0.5)], tuned=FASTER)
    result = run(task, executor, work_dir=str(tmp_path), tune_budget_s=7.0)
    assert len(executor.calls) == 1  # once per run
    assert executor.calls[0]["budget_s"] == 7.0
    assert executor.calls[0]["bottleneck"] == "memory"  # the profile narrows the space
    assert len(executor.verified) == 2
    assert executor.verified[0] != executor.verified[1]
    categories = [r.feedback for r in result["history"]]
    assert categories[0] == "tuned"
    tuned_program = result["candidate"]
    assert "__launch_bounds__(1024" in tuned_program.kernel_source
    report = result["report"]
    assert report.outcome == "verified"
    assert report.best.round == 2 and report.best.timing.candidate_ms == 0.5
    assert report.details["tuning"]["seconds"] == 2.5
    assert "autotuned in 2.5 s" in report.summary
    assert "## Autotuning" in render_markdown(result)


def test_nothing_faster_costs_no_extra_round(task):
    executor = TuningExecutor([passed(1.0)], tuned=Tuning())
    result = run(task, executor)
    assert len(executor.calls) == 1 and len(executor.verified) == 1
    assert result["report"].outcome == "verified"
    assert "autotuned" in result["report"].summary


def test_autotune_off_never_tunes(task):
    executor = TuningExecutor([passed(1.0)], tuned=FASTER)
    run(task, executor, autotune=False)
    assert executor.calls == []


def test_a_model_written_program_is_not_tuned(task):
    executor = TuningExecutor([passed(1.0)], tuned=FASTER)
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(script=[program()])
    ctx = StitchContext(
        planner_model=planner, coder_model=coder, executor=executor, use_knowledge=False
    )
    create_stitch_graph().invoke({"task": task}, context=ctx)
    assert executor.calls == []


def test_an_executor_that_cannot_tune_is_left_alone(task):
    executor = ScriptedExecutor([passed(1.0)])
    result = run(task, executor)
    assert result["report"].outcome == "verified"
    assert "tuning" not in result["report"].details


def test_a_round_whose_profile_could_route_nowhere_is_not_profiled(task, tmp_path, monkeypatch):
    """Round 1 is profiled for the tuning, round 2 (tuned) for the re-plan; round 3, the
    re-plan's program, gained nothing, so no further re-plan may follow and ncu is skipped."""
    from stitch_graph.agents import analysis
    from stitch_graph.artifacts import FeedbackItem
    from tests.graph.fakes import profile

    advice = [FeedbackItem(action="unroll the loop", detail="k0", source="knowledge")]
    monkeypatch.setattr(analysis, "knowledge_items", lambda kind, subject, ctx: advice)

    class Counting(TuningExecutor):
        profiled = 0

        def profile_candidate(self, task, candidate, ctx, **kwargs):
            self.profiled += 1
            return profile(0.6)

    executor = Counting([passed(1.0), passed(0.5), passed(0.5)], tuned=FASTER)
    result = run(task, executor, work_dir=str(tmp_path))
    assert len(executor.verified) == 3 and executor.profiled == 2
    assert [r.feedback for r in result["history"]] == ["tuned", "bottleneck", "done"]
    assert "not profiled: the last re-plan gained 1.000x" in result["history"][-1].summary
