"""Batch norm over (N, C): each channel's elements lie a row of memory apart.

A block per channel reads 4 bytes of every 32-byte sector it touches (a GEMM + batch norm
of level 2 spent about 1 ms more than eager this way). The column form gives each lane of
a block one channel, so every warp load is one line; these cases run it in the CPU emulation
against PyTorch, with channel counts that leave the last tile part empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen._emit_softmax_norm import _ColumnLoops
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gemm = nn.Linear(24, {channels})
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
    "channels_only": (
        "torch.relu(F.batch_norm(x * 2, None, None, self.weight, self.bias, training=True))",
        "40",
        "300, 40",
    ),
    "short_maps": (
        "F.batch_norm(x, None, None, self.weight, self.bias, training=True)",
        "40",
        "64, 40, 3",
    ),
    "after_a_gemm": (
        "F.gelu(F.batch_norm(self.gemm(x), None, None, self.weight, self.bias, training=True))",
        "72",
        "200, 24",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_column_batch_norm_matches_pytorch(case: str, tmp_path: Path) -> None:
    call, channels, shape = CASES[case]
    task, program = generate_checked(_PROBLEM.format(call=call, channels=channels, shape=shape))
    assert "a lane per column" in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert any(name.endswith("_part") for name in kernels.launched)


def test_column_tiles_fill_the_gpu_and_cover_every_position() -> None:
    loops = _ColumnLoops(rows=4096, length=16384, index="int")
    assert loops.tiles == 128
    assert loops.tiles * loops.splits >= 2 * 1056  # two waves of 256-thread blocks
    assert loops.splits * loops.chunk >= 16384 > (loops.splits - 1) * loops.chunk
    few = _ColumnLoops(rows=40, length=100, index="int")
    assert few.splits == 1 and few.chunk == 100  # short columns: one chunk, eight a thread
