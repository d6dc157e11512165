"""Rounds and budgets: the rule-based Coder writes the whole program first and goes item by item
only after it fails; a round budget is never exceeded, and a run cut short keeps its best correct
(partial) program. A scripted GPU, the real nvcc."""

from __future__ import annotations

import pytest

from stitch_graph import StitchContext, create_stitch_graph, load_task, memory_checkpointer
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedExecutor, passed, wrong

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")

THREE_KERNELS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.softmax(x, dim=-1) * 2.0
        z = torch.cumsum(y, dim=-1)
        return z.sum(dim=0)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
"""


def run(executor, **settings):
    ctx = StitchContext(executor=executor, use_knowledge=False, autotune=False, **settings)
    graph = create_stitch_graph(checkpointer=memory_checkpointer())
    config = {"configurable": {"thread_id": "budget"}}
    graph.invoke({"task": load_task(THREE_KERNELS, name="three")}, config, context=ctx)
    return graph.get_state(config).values


def test_the_whole_program_is_verified_in_one_round():
    executor = ScriptedExecutor([passed()])
    state = run(executor)
    plan = state["plan"]
    assert len(plan.items) >= 3
    assert len(executor.verified) == 1
    report = state["report"]
    assert report.outcome == "verified" and report.rounds == 1
    assert {i.status for i in plan.items} == {"done"}
    assert report.best.candidate.item_ids == [i.id for i in plan.items]


def test_a_failed_whole_program_is_retried_item_by_item():
    executor = ScriptedExecutor([wrong(), passed(), passed(), passed()])
    state = run(executor)
    items = [i.id for i in state["plan"].items]
    candidates = [r.item_id for r in state["history"]]
    assert candidates == [items[-1], *items]  # the whole program, then each item in turn
    assert state["report"].outcome == "verified"
    assert state["report"].rounds == 1 + len(items)


def test_the_round_budget_is_never_exceeded_and_the_best_partial_program_is_kept():
    executor = ScriptedExecutor([wrong(), passed(), passed(), passed()])
    state = run(executor, max_rounds=2)
    report = state["report"]
    assert report.rounds == 2 and len(executor.verified) == 2
    assert report.outcome == "partial"  # the first item generated, the rest left to PyTorch
    assert report.best.declared_torch_ops
    assert "not generated" in state["feedback"].summary


def test_the_report_shows_the_round_budget_and_where_the_time_went():
    from stitch_graph.agents.run_folder import render_markdown

    state = run(ScriptedExecutor([wrong(), passed(), passed(), passed()]), max_rounds=7)
    details = state["report"].details
    assert details["round_budget"] == 7
    assert set(details["seconds_by_step"]) >= {"checks", "build", "test"}
    assert all(seconds >= 0 for seconds in details["seconds_by_step"].values())
    markdown = render_markdown(state)
    assert "of a budget of 7" in markdown and "build" in markdown


def test_a_run_that_finishes_every_item_on_its_last_round_does_not_say_the_budget_was_spent():
    items = 3  # the three kernels of THREE_KERNELS, checked below
    state = run(ScriptedExecutor([wrong(), passed(), passed(), passed()]), max_rounds=1 + items)
    assert len(state["plan"].items) == items
    assert {i.status for i in state["plan"].items} == {"done"}
    assert state["report"].outcome == "verified" and state["report"].rounds == 1 + items
    verdicts = [r.summary for r in state["history"]] + [state["feedback"].summary]
    assert not any("budget spent" in v for v in verdicts), verdicts
    assert "all items done" in state["feedback"].summary
    assert f"{1 + items} of {1 + items} used" in state["feedback"].summary


class _DeferringExecutor(ScriptedExecutor):
    """A scripted GPU whose rounds carry no torch.compile time: the run deferred it."""

    def __init__(self, outcomes):
        super().__init__(outcomes)
        self.baselines: list[str] = []

    def compile_baseline(self, task, ctx):
        self.baselines.append(task.name)
        return 3.0


def test_a_deferred_compile_baseline_is_taken_once_for_the_report():
    outcome = passed(1.0)
    outcome.timing.compile_ms = None
    executor = _DeferringExecutor([outcome])
    state = run(executor)
    assert executor.baselines == ["three"]
    report = state["report"]
    assert report.best.timing.compile_ms == 3.0 and state["best"].timing.compile_ms == 3.0
    assert "3.00x vs torch.compile" in report.summary
    assert state["result"]["speedup_vs_compile"] == 3.0
    assert report.details["seconds_by_step"]["compile_baseline"] >= 0


def test_a_round_that_timed_torch_compile_needs_no_baseline_at_the_end():
    executor = _DeferringExecutor([passed(1.0)])
    state = run(executor)
    assert executor.baselines == [] and state["report"].best.timing.compile_ms == 1.5
