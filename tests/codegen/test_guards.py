"""Forwards whose control flow reads tensor values: generated for the path the example inputs
take, with the decisions computed by the program's kernels and checked by its host, so that an
input taking another path raises instead of getting a wrong answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import CaptureError, Tuning, capture_program
from stitch_graph.runtime import GuardFailed
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, load_on_cpu

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x, y):
{body}


def get_inputs():
    return [torch.rand(4, 8, 6, 5) + 0.1, torch.randn(4, 8, 6, 5)]


def get_init_inputs():
    return []
"""

_BRANCH = """\
        if x.mean() > 0:
            return torch.relu(x * self.scale.view(1, -1, 1, 1)) + y
        return x - 1"""

BODIES = {
    # the library's own argument check: torch.any(var < 0) read on the host
    "gaussian_nll_loss": "        return F.gaussian_nll_loss(y, x, x * 0.5 + 0.1)",
    "branch_on_a_mean": _BRANCH,
}


@pytest.mark.parametrize("name", list(BODIES))
def test_the_traced_path_is_generated_whole_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=BODIES[name]))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "KERNELS.guard(" in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_an_input_that_takes_another_path_raises(tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=_BRANCH))
    _, host, ns = load_on_cpu(task, program, tmp_path, cooperative=True)
    model = host["ModelNew"]()
    model.load_state_dict(ns["Model"]().state_dict())
    x, y = ns["get_inputs"]()
    model(x, y)  # the traced path
    with pytest.raises(GuardFailed, match="not generated for"):
        model(-x, y)


def test_a_guarded_program_is_never_replayed_from_a_cuda_graph() -> None:
    _, program = generate_checked(_PROBLEM.format(body=_BRANCH), tuning=Tuning(cuda_graph=True))
    assert "KERNELS.graphed" not in program.host_source
    # the checks come after every launch: one wait for the kernels, at the end
    body = program.host_source.split("def forward", 1)[1]
    assert body.rindex("KERNELS.k") < body.index("KERNELS.guard(")


def test_a_value_read_on_the_host_that_feeds_compute_is_refused() -> None:
    # it may decide a branch as well, which the graph does not show: no program, a clear reason
    body = """\
        s = x.sum()
        if s > 0:
            return x * s.item()
        return x"""
    with pytest.raises(CaptureError, match="value read on the host"):
        capture_program(load_task(_PROBLEM.format(body=body)))
