"""Inputs whose shape changes from draw to draw (bags of random lengths): the task records
them, and the program, whose kernels hold one draw's sizes, refuses another draw's shapes with
an error that says so instead of computing a wrong answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import generate_checked, load_on_cpu

_BAGS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 8, mode="mean")

    def forward(self, indices, offsets):
        return self.bag(indices, offsets) * 2.0


def get_inputs():
    lengths = torch.randint(1, 20, (64,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)[:-1]])
    return [torch.randint(0, 100, (int(lengths.sum()),)), offsets]


def get_init_inputs():
    return []
"""


def test_a_shape_that_varies_between_draws_is_recorded_and_guarded(tmp_path: Path) -> None:
    task = load_task(_BAGS)
    assert task.varying_inputs == [0]  # the indices; the offsets keep their shape
    _, program = generate_checked(_BAGS)
    _, host, ns = load_on_cpu(task, program, tmp_path, cooperative=True)
    torch.manual_seed(0)
    reference = ns["Model"]()
    model = host["ModelNew"]()
    model.load_state_dict(reference.state_dict())
    torch.manual_seed(0)  # the draw the program was generated for
    drawn = ns["get_inputs"]()
    assert list(drawn[0].shape) == list(task.inputs[0].shape)
    with torch.no_grad():
        torch.testing.assert_close(model(*drawn), reference(*drawn))
        short = [drawn[0][:-1], drawn[1]]
        with pytest.raises(ValueError, match="was generated for"):
            model(*short)


def test_fixed_shapes_are_not_guarded() -> None:
    fixed = _BAGS.replace("torch.randint(1, 20, (64,))", "torch.full((64,), 3)")
    assert load_task(fixed).varying_inputs == []
    _, program = generate_checked(fixed)
    assert "was generated for" not in program.host_source
