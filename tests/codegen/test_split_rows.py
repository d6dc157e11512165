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


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_split_rows_match_pytorch(case: str, width: int, tmp_path: Path) -> None:
    call, channels, shape = CASES[case]
    source = _PROBLEM.format(call=call, channels=channels, shape=shape)
    tuning = KernelTuning(split_reduction=True, vector_width=width)
    task, program = generate_checked(source, Tuning(default=tuning))
    assert "_part(" in program.host_source  # the split form was emitted
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    # every case's rows run in multiples of 4 elements: width 4 takes the float4 twins
    suffix = "_part_v4" if width == 4 else "_part"
    assert any(k.endswith(suffix) for k in kernels.launched)


TWO_PASS = {  # rows longer than the registers hold (more than 32 values a thread at 512)
    "softmax": ("torch.softmax(x, dim=-1) + self.weight.sum() * 0", "1", "2, 20000"),
    "batch_norm_batch_stats": (
        "F.batch_norm(x, None, None, self.weight, self.bias, training=True)", "3", "4, 3, 80, 64"
    ),
    "rms_norm": ("F.rms_norm(x, (20000,), self.weight)", "20000", "3, 20000"),
}


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("case", sorted(TWO_PASS))
def test_two_pass_rows_match_pytorch(case: str, width: int, tmp_path: Path) -> None:
    """Rows too long for registers, one block a row: statistics pass then write pass, float4
    twins chosen when asked for."""
    call, channels, shape = TWO_PASS[case]
    source = _PROBLEM.format(call=call, channels=channels, shape=shape)
    tuning = KernelTuning(split_reduction=False, vector_width=width)
    task, program = generate_checked(source, Tuning(default=tuning))
    assert "statistics pass, then write pass" in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert any(k.endswith("_v4") for k in kernels.launched) == (width == 4)


def test_the_split_is_taken_for_few_long_rows_only() -> None:
    def host(shape: str) -> str:
        source = _PROBLEM.format(
            call="F.layer_norm(x, (x.shape[-1],), None, None)", channels="1", shape=shape
        )
        ir = capture_program(load_task(source))
        return emit_candidate(ir, plan_program(ir)).host_source

    assert "_part(" in host("8, 262144")
    assert "_part(" not in host("4096, 262144")
