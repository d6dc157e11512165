"""A reduction over a middle dim broadcast back over its rows, a tile of 32 adjacent rows a block.

``x / ||x||`` over the channels of NCHW, ``x - x.mean(1)``: the rows are strided, so a lane per
row keeps each warp load one line, and the block's warps split the row's positions (their
accumulators merged by ``sg_slice_reduce``). Checked on the CPU with CUDA's block semantics
(``cooperative=True``); ``generate_checked`` compiles every program with nvcc where installed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stitch_graph.codegen import schedule
from stitch_graph.codegen.tuning import KernelTuning, Tuning
from stitch_graph.toolchain.nvcc import find_nvcc
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""
TILES = "column tiles of 32 rows"
L2 = "x / torch.sqrt((x * x).sum(dim=1, keepdim=True)).clamp_min(1e-12)"
LAYER_NORM = (
    "(x - x.mean(1, keepdim=True)) / torch.sqrt(x.var(1, keepdim=True, unbiased=False) + 1e-5)"
)


@pytest.fixture(autouse=True)
def few_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fuse at the small row counts a CPU check can afford (the GPU default wants 16384)."""
    monkeypatch.setattr(schedule, "_BROADCAST_BACK_THREAD_ROWS", 1)


def _generate(body: str, shape: tuple[int, ...], tuning: Tuning | None = None) -> tuple[Any, Any]:
    source = _PROBLEM.format(body=body, shape=", ".join(map(str, shape)))
    return generate_checked(source, tuning)


CASES = {
    # 70 channels over 8 warps: the last of 9 slots holds 6 positions, inner 64 (two tiles)
    "l2_normalise": (L2, (2, 70, 2, 32), "8 warps"),
    "centre": ("x - x.mean(1, keepdim=True)", (3, 100, 32), "4 warps"),  # whole slots
    "max_shift": ("x - x.amax(1, keepdim=True)", (2, 80, 64), "8 warps"),
    "by_variance": ("x / (x.var(1, keepdim=True) + 1)", (2, 66, 32), "8 warps"),
    # longer than 32 slots a thread: a loop not unrolled whole, rewritten from cache
    "long_row": (L2, (1, 1100, 32), "16 warps"),
    # whole slots in fours: a channels-first layer norm's mean and variance, a log-softmax
    "layer_norm": (LAYER_NORM, (2, 96, 32), "8 warps"),
    "log_softmax": ("x - torch.logsumexp(x, 1, keepdim=True)", (2, 128, 32), "8 warps"),
    # siblings of different values: a pair of sums, each of its own four
    "mean_and_square": (
        "(x - x.mean(1, keepdim=True)) * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-5)",
        (2, 96, 32), "8 warps",
    ),
}
FOURS = "acc.update4(v4, w);"


@pytest.mark.parametrize("name", list(CASES))
def test_column_tiles_match_pytorch(name: str, tmp_path: Path) -> None:
    body, shape, warps = CASES[name]
    task, program = _generate(body, shape)
    assert f"{TILES} x {warps}" in program.kernel_source
    assert (FOURS in program.kernel_source) == (name in ("layer_norm", "log_softmax", "mean_and_square"))
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(kernels.launched) == 1, kernels.launched


@pytest.mark.parametrize(("block", "warps"), [(128, 4), (512, 16), (64, 2)])
def test_the_tuners_block_sizes_set_the_warps(block: int, warps: int, tmp_path: Path) -> None:
    """The column-reduction space's block sizes reach this kernel as its warps a tile; four
    elements at a time wherever the slots come in fours (96 channels over 4 and 2 warps)."""
    tuning = Tuning(default=KernelTuning(block_size=block))
    task, program = _generate(LAYER_NORM, (2, 96, 32), tuning)
    assert f"{TILES} x {warps} warps" in program.kernel_source
    assert (FOURS in program.kernel_source) == (96 // warps % 4 == 0)
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(("shape", "tuning"), [
    ((2, 70, 40), None),  # inner 40: a tile of 32 rows would straddle two outer indices
    ((2, 64, 32), None),  # short rows: a thread each, held in registers as fast
    ((2, 70, 32), Tuning(default=KernelTuning(unroll=2))),  # the tuner's variants stay
    ((2, 70, 32), Tuning(default=KernelTuning(rows_per_block=1))),
])
def test_other_strided_rows_keep_their_kernels(
    shape: tuple[int, ...], tuning: Tuning | None, tmp_path: Path
) -> None:
    task, program = _generate(L2, shape, tuning)
    assert TILES not in program.kernel_source
    assert "broadcast back" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.skipif(find_nvcc() is None, reason="counts loads in nvcc's PTX")
def test_a_row_unrolled_whole_is_read_from_memory_once(tmp_path: Path) -> None:
    """100 channels over 4 warps (8 would leave the last slot short), 25 slots a thread: nvcc
    keeps the loads in registers across ``sg_slice_reduce``'s barriers for the rewrite (25
    global loads, not 50; over 8 warps, with the last slot guarded, it loads twice)."""
    _, program = _generate(L2, (2, 100, 1, 32))
    assert f"{TILES} x 4 warps" in program.kernel_source
    (tmp_path / "k.cu").write_text(program.kernel_source)
    ptx = tmp_path / "k.ptx"
    subprocess.run(
        [find_nvcc(), "-arch=sm_90", "-ptx", "-o", str(ptx), str(tmp_path / "k.cu")], check=True
    )
    kernel = next(e for e in re.split(r"\.entry\s+", ptx.read_text())[1:] if "ld.global" in e)
    assert kernel.count("ld.global") == 25
