"""Common subexpressions: a GEMM, a reduction or a pointwise chain the forward writes twice on
the same operands is computed once, and the program still matches PyTorch; random ops keep
their separate calls."""

from __future__ import annotations

from pathlib import Path

from stitch_graph.codegen import capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import (
    check_on_cpu,
    generate_checked,
)

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(48, 48)

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(6, 48)]


def get_init_inputs():
    return []
"""

_REPEATED = (
    "torch.sigmoid(self.lin(x)) * x.mean(-1, keepdim=True)"
    " + torch.sigmoid(self.lin(x)) / (1 + x.mean(-1, keepdim=True).abs())"
)


def _gemm_calls(program) -> int:  # noqa: ANN001
    return program.host_source.split("class ModelNew")[1].count("_sgemm(")


def test_a_repeated_gemm_and_reduction_run_once(tmp_path: Path, monkeypatch) -> None:
    from stitch_graph.codegen import _capture_lower

    task, program = generate_checked(_PROBLEM.format(expr=_REPEATED))
    assert not program.declared_torch_ops
    assert _gemm_calls(program) == 1
    check_on_cpu(task, program, tmp_path, cooperative=True)
    # written twice, the GEMM runs twice (the two means share a pass either way)
    monkeypatch.setattr(_capture_lower, "merge_common_subexpressions", lambda ir: None)
    assert _gemm_calls(generate_checked(_PROBLEM.format(expr=_REPEATED))[1]) == 2


def test_outputs_that_repeat_a_value_both_match(tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr="x.sum(0) * 2, (x.sum(0) * 2).exp()"))
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_random_ops_are_not_merged() -> None:
    source = _PROBLEM.format(
        expr="F.dropout(x, 0.5, training=True) + F.dropout(x, 0.5, training=True)"
    )
    ir = capture_program(load_task(source))
    assert sum(node.op.startswith("dropout") for node in ir.nodes) == 2


def test_one_logsumexp_serves_a_softmax_and_a_cross_entropy(tmp_path: Path) -> None:
    expr = (
        "F.cross_entropy(x, x.argmax(-1), reduction='none')"
        " + (x.softmax(-1) * torch.log_softmax(x, -1)).sum(-1)"
    )
    source = _PROBLEM.format(expr=expr)
    ops = [n.op for n in capture_program(load_task(source)).nodes]
    assert ops.count("logsumexp") == 1, ops
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)
