"""An indexed op's operand read at its own element (a gather's index, the values a bucketize
searches for, an index into a 1-D table) is computed by the same kernel as the op."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program, plan_program
from stitch_graph.codegen._cuda import PRELUDE
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("knots", torch.linspace(-2.0, 2.0, 16))
        self.register_buffer("values", torch.randn(16))

    def forward(self, x, idx):
        {body}


def get_inputs():
    return [torch.randn(8, 64), torch.randint(0, 16, (8, 64))]


def get_init_inputs():
    return []
"""

CASES = {
    "gather_of_a_computed_index": (
        "return torch.gather(self.values.expand(8, -1), 1, (idx + 3).clamp(max=15)) * x"
    ),
    "table_read_at_a_bucket": (
        "return self.values[torch.bucketize(torch.tanh(x) * 2.0, self.knots).clamp(0, 15)] + x"
    ),
}


# a bucket and the one below it, each read by two lookups, of a search too costly to compute
# again: the search's kernel stores them beside the first lookup (``joins_storing``), the
# rest is one kernel
SHARED = """bucket = torch.bucketize(torch.tanh(x) * 2.0, self.knots).clamp(1, 15)
        below = bucket - 1
        return self.values[below] * self.knots[below] + self.values[bucket] * x"""


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_index_is_computed_where_it_is_read(case: str, tmp_path: Path) -> None:
    source = _PROBLEM.format(body=CASES[case])
    assert len(plan_program(capture_program(load_task(source))).items) == 1
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_an_index_read_by_several_lookups_joins_the_first(tmp_path: Path) -> None:
    source = _PROBLEM.format(body=SHARED)
    assert len(plan_program(capture_program(load_task(source))).items) == 2
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_triangles_cheap_input_is_computed_again_not_stored_beside() -> None:
    # the triangle reads its input at its own element, as a pointwise op does: its kernel and
    # the other reader's each compute ``y``, no kernel stores it for the other to read
    body = "y = torch.sigmoid(x) * 3.0\n        return torch.tril(y), y * 2"
    plan = plan_program(capture_program(load_task(_PROBLEM.format(body=body))))
    assert len(plan.items) == 2
    assert all(any(op.startswith("sigmoid") for op in item.ops) for item in plan.items)


def test_a_search_read_by_four_lookups_is_computed_once_in_their_kernel(tmp_path: Path) -> None:
    # each lookup gets its copy of the search (``_capture_recompute``); met in one kernel, the
    # copies are spelled alike and computed once there
    body = ("idx = torch.bucketize(x, self.knots).clamp(1, 15)\n        return (self.values[idx - 1]"
            " * x + self.values[idx]) * (self.knots[idx] - self.knots[idx - 1])")
    source = _PROBLEM.format(body=body)
    task, program = generate_checked(source)
    kernels = program.kernel_source.replace(PRELUDE, "", 1)
    assert kernels.count("__global__") == kernels.count("sg_bucket(") >= 1
    assert len(plan_program(capture_program(task)).items) == 1
    check_on_cpu(task, program, tmp_path, cooperative=True)
