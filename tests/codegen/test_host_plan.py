"""The host plan in generated code: CUDA-graph replay for launch-bound programs."""

from __future__ import annotations

from pathlib import Path

import torch

from stitch_graph.checks import check_candidate
from stitch_graph.codegen import capture_program, emit_candidate, plan_program
from stitch_graph.codegen.tuning import Tuning
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import generate_checked, load_on_cpu

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


_DRAW = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        noise = torch.randn(16, {n}, device=x.device)
        return {result}


def get_inputs():
    return [torch.randn(16, {n})]


def get_init_inputs():
    return []
'''


def test_a_draw_in_forward_runs_ahead_of_the_graph_and_matches_eager(tmp_path) -> None:
    # an LSTM's h0 = torch.randn(...) in forward kept the whole program out of a CUDA graph
    source = _DRAW.format(n=64, result="torch.relu(x * 2.0 + noise)")
    task, program = generate_checked(source, Tuning(cuda_graph=True))
    forward = program.host_source.split("def forward", 1)[1].split("def _launch", 1)[0]
    assert "randn = torch.randn(16, 64" in forward
    assert "return KERNELS.graphed(self, self._launch, x, randn)" in forward
    _, host, ns = load_on_cpu(task, program, tmp_path)
    x = torch.randn(16, 64)
    torch.manual_seed(3)
    got = host["ModelNew"]()(x)
    torch.manual_seed(3)
    torch.testing.assert_close(got, ns["Model"]()(x), rtol=1e-5, atol=1e-5)


def test_a_pytorch_op_that_reads_a_tensor_keeps_the_program_out_of_a_graph() -> None:
    source = _DRAW.format(n=16, result="torch.linalg.inv(torch.relu(x * 2.0 + noise))")
    _, program = generate_checked(source, Tuning(cuda_graph=True))
    assert "KERNELS.graphed" not in program.host_source
    assert program.declared_torch_ops == ["randn", "linalg_inv", "inv"]
