"""The host plan in generated code: CUDA-graph replay for launch-bound programs."""

from __future__ import annotations

from pathlib import Path

from stitch_graph.checks import check_candidate
from stitch_graph.codegen import capture_program, emit_candidate, plan_program
from stitch_graph.codegen.tuning import Tuning
from stitch_graph.task import load_task

ROOT = Path(__file__).resolve().parents[2]


def _program(problem: str, tuning: Tuning | None = None):
    task = load_task(ROOT / "problems" / problem)
    ir = capture_program(task)
    plan = plan_program(ir)
    return task, plan, emit_candidate(ir, plan, tuning=tuning)


def test_cuda_graph_requested_by_tuning_wraps_the_launches() -> None:
    task, plan, plain = _program("models/01_mlp3.py")
    assert not plan.host.cuda_graph
    assert "KERNELS.graphed" not in plain.host_source
    _, _, graphed = _program("models/01_mlp3.py", Tuning(cuda_graph=True))
    assert "return KERNELS.graphed(self, self._launch, x)" in graphed.host_source
    assert "def _launch(self, x):" in graphed.host_source
    compile(graphed.host_source, "<host>", "exec")
    assert check_candidate(graphed, reference_source=task.source).findings == []


def test_plan_marks_many_tiny_launches_as_launch_bound() -> None:
    task = load_task(ROOT / "tests" / "fixtures" / "codegen_problems" / "launch_bound_chain.py")
    ir = capture_program(task)
    plan = plan_program(ir)
    assert plan.host.cuda_graph, plan.host.notes
    program = emit_candidate(ir, plan)
    assert "KERNELS.graphed" in program.host_source
    assert check_candidate(program, reference_source=task.source).findings == []
