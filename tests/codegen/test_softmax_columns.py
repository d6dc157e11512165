"""Softmax over a strided dim (the channels of NCHW) in column tiles.

A warp per row has its 32 lanes read positions ``inner`` floats apart, a line each (softmax over
the 256 channels of a (64, 256, 64, 64) tensor: 1.32 ms on an H100, torch.compile 0.224). The
column mode gives each lane of a block one of 32 adjacent rows and each warp a share of the
row's positions, so every warp load is one line. These cases run it in the cooperative CPU
emulation against PyTorch, with lengths that leave the last warps' slots part empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen._emit_softmax_norm import _column_warps
from stitch_graph.codegen.tuning import KernelTuning, Tuning
from stitch_graph.toolchain.nvcc import find_nvcc, nvcc_compile
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return {call}


def get_inputs():
    return [torch.randn({shape}) * 3, torch.randn({shape})]


def get_init_inputs():
    return []
"""

COLUMN = "column tiles: a lane per row"
WARP_PER_ROW = "(threadIdx.x >> 5); r <"  # the row loop of a warp per row

CASES = {
    # (2, 37, 4, 16): inner 64, 4 warps of 10 slots, the last three warps' tenth slot empty
    "softmax": ("torch.softmax(x, dim=1)", "2, 37, 4, 16", 4),
    "log_softmax": ("torch.log_softmax(x, dim=1)", "2, 37, 4, 16", 4),
    # 130 positions: 8 warps of 17 slots; 5-D, softmax over a middle dim
    "softmax_8_warps": ("torch.softmax(x, dim=2)", "3, 2, 130, 2, 32", 8),
    "prologue_epilogue": ("torch.softmax(x * 2.0, dim=1) + 1.0", "2, 37, 4, 16", 4),
    "second_tensor": ("torch.log_softmax(x + y, dim=1) * y", "1, 70, 32", 4),
    # inner 77: tiles straddle the batch's slices, and 231 rows leave the last tile part empty
    "straddling": ("torch.log_softmax(x, dim=1)", "3, 40, 7, 11", 4),
    "straddling_epilogue": ("torch.softmax(x + y, dim=1) - y", "2, 36, 5, 8", 4),
}


def _generate(call: str, shape: str, tuning: Tuning | None = None):  # noqa: ANN202
    return generate_checked(_PROBLEM.format(call=call, shape=shape), tuning)


@pytest.mark.parametrize("case", sorted(CASES))
def test_column_softmax_matches_pytorch(case: str, tmp_path: Path) -> None:
    call, shape, warps = CASES[case]
    task, program = _generate(call, shape)
    assert f"{COLUMN}, {warps} warps along it" in program.kernel_source
    assert f"sg_slice_reduce<{warps}>" in program.kernel_source
    assert WARP_PER_ROW not in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_blocks_loop_over_several_tiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A grid smaller than the tiles: each block takes several, every thread the same count
    (sg_slice_reduce's barriers are reached again and again)."""
    monkeypatch.setattr("stitch_graph.codegen._emit_softmax_norm._MAX_GRID", 3)
    task, program = _generate("torch.softmax(x, dim=1) - x", "4, 45, 64")  # 8 tiles
    assert COLUMN in program.kernel_source
    assert "(3, 128," in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(
    ("shape", "tuning", "kind"),
    [
        ("2, 40, 5", None, "warp per row"),  # inner 5: a tile of 32 rows, seven runs
        ("2, 37, 4, 16", KernelTuning(rows_per_block=2), "warp per row"),  # the tuner's choice
        ("2, 37, 4, 16", KernelTuning(rows_per_block=1), "block per row"),
    ],
)
def test_other_layouts_and_tunings_keep_their_mode(
    shape: str, tuning: KernelTuning | None, kind: str, tmp_path: Path
) -> None:
    task, program = _generate(
        "torch.softmax(x, dim=1)", shape, None if tuning is None else Tuning(default=tuning)
    )
    assert COLUMN not in program.kernel_source and kind in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_column_warps() -> None:
    default = KernelTuning()
    warps = {n: _column_warps(default, "softmax", n, 4096) for n in (32, 33, 128, 129, 256, 1024)}
    assert warps == {32: 0, 33: 4, 128: 4, 129: 8, 256: 8, 1024: 32}  # 0: a thread per row
    assert _column_warps(default, "softmax", 1025, 4096) == 0  # over 32 values a thread
    assert _column_warps(default, "log_softmax", 256, 64) == 8
    assert _column_warps(default, "softmax", 256, 48) == 8  # tiles straddle slices of 48
    assert _column_warps(default, "softmax", 256, 7) == 0  # runs of 7: a tile reads five
    assert _column_warps(default, "softmax", 256, 1) == 0  # contiguous rows
    assert _column_warps(default, "layer_norm", 256, 4096) == 0
    assert _column_warps(KernelTuning(rows_per_block=4), "softmax", 256, 4096) == 0


def test_long_rows_reading_two_tensors_keep_a_warp_per_row() -> None:
    """1024 threads leave 64 registers a thread: 32 values and a second tensor spill, so such
    rows keep the warp per row; read once, they take the 32-warp column block."""
    _, two = _generate("torch.softmax(x + y, dim=1) * y", "1, 1000, 32")
    assert COLUMN not in two.kernel_source and "warp per row" in two.kernel_source
    _, one = _generate("torch.softmax(x * 2.0, dim=1) + 1.0", "1, 1000, 32")
    assert f"{COLUMN}, 32 warps along it" in one.kernel_source


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
def test_channel_softmax_compiles_without_spills() -> None:
    """The (64, 256, 64, 64) softmax over channels: 8 warps of 32 values, no spill."""
    _, program = _generate("torch.softmax(x, dim=1)", "64, 256, 64, 64")
    assert f"{COLUMN}, 8 warps along it" in program.kernel_source
    result = nvcc_compile(program.kernel_source)
    assert result.ok, result.log
    (kernel,) = [r for r in result.resources if r.kernel == "k0_softmax"]
    assert kernel.spill_stores_bytes == 0 and kernel.spill_loads_bytes == 0
