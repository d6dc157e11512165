"""Norms and softmax over few long rows: two kernels, each with several blocks a row.

With fewer rows than the GPU has SMs, a block per row leaves most of it idle (16 rows of 4M
elements: 0.15x of torch.compile). The split form writes each chunk's statistics, then combines
a row's and writes each chunk. Every case forces the split at a size the CPU emulation can run
and matches PyTorch; the default takes it only for few long rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import KernelTuning, Tuning, capture_program, emit_candidate, plan_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn({channels}))
        self.bias = nn.Parameter(torch.randn({channels}))

    def forward(self, x):
        return {call}


def get_inputs():
    return [torch.randn({shape}) * 3 + 1]


def get_init_inputs():
    return []
"""

CASES = {
    "layer_norm": ("F.layer_norm(x, (4096,), self.weight, self.bias)", "4096", "3, 4096"),
    "batch_norm_batch_stats": (
        "F.batch_norm(x, None, None, self.weight, self.bias, training=True)", "3", "4, 3, 40, 30"
    ),
    "group_norm": ("F.group_norm(x, 2, self.weight, self.bias)", "4", "2, 4, 30, 40"),
    "softmax": ("torch.softmax(x, dim=-1) + self.weight.sum() * 0", "1", "3, 3000"),
    "log_softmax": ("torch.log_softmax(x, dim=1) + self.bias.sum() * 0", "1", "2, 2500"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_split_rows_match_pytorch(case: str, tmp_path: Path) -> None:
    call, channels, shape = CASES[case]
    source = _PROBLEM.format(call=call, channels=channels, shape=shape)
    task, program = generate_checked(source, Tuning(default=KernelTuning(split_reduction=True)))
    assert "_part(" in program.host_source  # the split form was emitted
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert any(k.endswith("_part") for k in kernels.launched)


def test_the_split_is_taken_for_few_long_rows_only() -> None:
    def host(shape: str) -> str:
        source = _PROBLEM.format(
            call="F.layer_norm(x, (x.shape[-1],), None, None)", channels="1", shape=shape
        )
        ir = capture_program(load_task(source))
        return emit_candidate(ir, plan_program(ir)).host_source

    assert "_part(" in host("8, 262144")
    assert "_part(" not in host("4096, 262144")
