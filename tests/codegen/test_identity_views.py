"""A reshape to the shape and strides its input has is dropped: what reads it reads the input,
so a gather read through ``.view_as(x)`` fuses with its reader."""

from __future__ import annotations

from pathlib import Path

from stitch_graph.codegen import capture_program, plan_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_LOOKUP = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(16))

    def forward(self, x, idx):
        picked = torch.gather(self.table.expand(x.shape[0], -1), 1, idx.view(x.shape[0], -1))
        return torch.tanh(x * picked.view_as(x) + 1.0)


def get_inputs():
    return [torch.randn(8, 64), torch.randint(0, 16, (8, 64))]


def get_init_inputs():
    return []
"""


def test_a_gather_read_through_same_shape_views_fuses(tmp_path: Path) -> None:
    ir = capture_program(load_task(_LOOKUP))
    assert not [n.op for n in ir.nodes if n.op in ("view", "view_as")]
    items = plan_program(ir).items
    assert len(items) == 1 and "gather" in items[0].ops
    task, program = generate_checked(_LOOKUP)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_reshape_that_changes_the_shape_stays() -> None:
    source = _LOOKUP.replace("picked.view_as(x)", "picked.view(8, 8, 8).view_as(x)")
    ops = [n.op for n in capture_program(load_task(source)).nodes]
    assert ops.count("view") == 1 and "view_as" in ops
