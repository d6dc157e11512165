"""Training samples exported from a checkpointed run."""

from __future__ import annotations

import json

import pytest

from stitch_graph import StitchContext, create_stitch_graph, load_task, sqlite_checkpointer
from stitch_graph.cli import main
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.graph.fakes import ScriptedChatModel, ScriptedExecutor, passed, wrong
from tests.graph.test_routing import BROKEN_KERNEL, KERNEL, PROBLEM, plan_answer, program

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is needed for real compiles")


def test_rounds_become_samples_of_both_skills(tmp_path, capsys):
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    graph = create_stitch_graph(checkpointer=sqlite_checkpointer(run / "checkpoints.sqlite"))
    planner = ScriptedChatModel(script=[plan_answer()])
    coder = ScriptedChatModel(
        script=[program(BROKEN_KERNEL), program(KERNEL + "// v2\n"), program(KERNEL)]
    )
    ctx = StitchContext(
        planner_model=planner,
        coder_model=coder,
        max_tool_calls=0,
        executor=ScriptedExecutor([wrong(), passed()]),
        use_knowledge=False,
    )
    config = {"configurable": {"thread_id": "demo"}}
    result = graph.invoke({"task": load_task(PROBLEM, name="add_relu")}, config, context=ctx)
    assert result["report"].rounds == 3

    out = tmp_path / "train"
    assert main(["export-training", str(run), "--out", str(out)]) == 0
    write = [json.loads(line) for line in (out / "write_from_task.jsonl").read_text().splitlines()]
    improve = [
        json.loads(line) for line in (out / "improve_from_feedback.jsonl").read_text().splitlines()
    ]
    assert len(write) == 1 and len(improve) == 2
    # round 1 did not build: no reward; round 2 ran wrong: no reward; round 3 is correct
    assert write[0]["reward"] == 0.0 and write[0]["test"] == "error"
    assert improve[0]["reward"] == 0.0 and improve[0]["test"] == "failed"
    assert improve[1]["reward"] > 0.0 and improve[1]["test"] == "passed"
    assert improve[1]["speedup"] == pytest.approx(1.5)
    # the fix-round prompt carries the feedback the coder acted on
    assert "wrong_result" in json.dumps(improve[1])
    assert 'identifier \\"z\\" is undefined' in json.dumps(improve[0])
