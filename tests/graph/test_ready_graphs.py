"""The ready graphs in ``graphs/``: they load, draw, and run with scripted models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from langgraph.types import Command

from stitch_graph import load_task
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedChatModel, ScriptedExecutor, passed
from tests.graph.test_routing import KERNEL, PROBLEM, plan_answer, program

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"ready_{name}", GRAPHS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # type hints of the state resolve through the module
    spec.loader.exec_module(module)
    return module


def test_every_graph_listed_for_studio_loads_and_draws():
    import json

    listed = json.loads((GRAPHS / "langgraph.json").read_text())["graphs"]
    for target in listed.values():
        path, attr = target.split(":")
        graph = getattr(load(Path(path).stem), attr)
        assert "__end__" in graph.get_graph().draw_mermaid(with_styles=False)


def variant(ms: float) -> dict:
    return {
        "planner_model": ScriptedChatModel(script=[plan_answer()]),
        "coder_model": ScriptedChatModel(script=[program(KERNEL + f"// {ms}\n")]),
        "executor": ScriptedExecutor([passed(ms)]),
        "max_tool_calls": 0,
        "use_knowledge": False,
    }


@needs_nvcc
def test_best_of_n_keeps_the_fastest_verified_program():
    graph = load("best_of_n").graph
    task = load_task(PROBLEM, name="add_relu")
    result = graph.invoke({"task": task, "variants": [variant(1.2), variant(0.6), variant(0.9)]})
    assert len(result["reports"]) == 3
    assert result["report"].best.timing.candidate_ms == 0.6
    assert result["messages"][-1].content.startswith("best of 3")


@needs_nvcc
def test_human_review_pauses_then_records_the_verdict():
    from stitch_graph import StitchContext

    module = load("human_review")
    task = load_task(PROBLEM, name="add_relu")
    ctx = StitchContext(**variant(0.5))
    config = {"configurable": {"thread_id": "review-1"}}
    paused = module.graph.invoke({"task": task}, config, context=ctx)
    request = paused["__interrupt__"][0].value
    assert request["outcome"] == "verified" and "add_relu" in request["cuda"]
    done = module.graph.invoke(
        Command(resume={"approved": True, "comment": "ship it"}), config, context=ctx
    )
    assert done["approved"] is True
    assert done["messages"][-1].content == "approved by reviewer: ship it"
