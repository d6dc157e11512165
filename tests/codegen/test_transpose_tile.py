"""Pointwise kernels that read an operand transposed go through a shared-memory tile.

The cases run the generated program in the cooperative CPU emulation (barriers with CUDA's
semantics) against PyTorch, with tile edges that do not divide the dims, and check which
operands the tile takes and where it steps aside.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stitch_graph.codegen import KernelTuning, Tuning
from stitch_graph.codegen._emit_transpose import plan_tile
from stitch_graph.codegen.ir import Ref
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return {expr}


def get_inputs():
    return [torch.randn({x}), torch.randn({y})]


def get_init_inputs():
    return []
"""

CASES = {
    # NHWC result added back to an NCHW input (a ConvNeXt block's residual), edges of 17 and 40
    "nhwc_into_nchw": ("x + 0.5 * y.permute(0, 3, 1, 2)", "2, 40, 5, 7", "2, 5, 7, 40"),
    # a ViT's flatten(2).transpose(1, 2), then an activation and a broadcast position table
    "tokens_from_channels": (
        "torch.tanh(x.flatten(2).transpose(1, 2)) + y",
        "3, 48, 6, 6",
        "1, 36, 48",
    ),
    # two operands read transposed the same way, one read in order
    "two_transposed": (
        "x.transpose(1, 2) * y.transpose(1, 2) + x.transpose(1, 2).exp()",
        "4, 33, 65",
        "4, 33, 65",
    ),
}


def _tiled(kernel_source: str) -> int:
    return kernel_source.count("read transposed")


@pytest.mark.parametrize("case", sorted(CASES))
def test_transposed_operands_match_pytorch(case: str, tmp_path: Path) -> None:
    expr, x, y = CASES[case]
    task, program = generate_checked(_PROBLEM.format(expr=expr, x=x, y=y))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert _tiled(program.kernel_source) >= 1
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert kernels.launched


def test_tuning_can_turn_the_tile_off() -> None:
    expr, x, y = CASES["nhwc_into_nchw"]
    source = _PROBLEM.format(expr=expr, x=x, y=y)
    _, off = generate_checked(source, Tuning(default=KernelTuning(transpose_tile=False)))
    assert _tiled(off.kernel_source) == 0


def _ir(shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]) -> Any:
    """The layout tables ``plan_tile`` reads, for input operands of these shapes and strides."""
    ir = SimpleNamespace(shapes={}, strides={}, dtypes={})
    for name, (shape, strides) in shapes.items():
        ref = Ref("input", name)
        ir.shapes[ref], ir.strides[ref], ir.dtypes[ref] = shape, strides, "float32"
    return ir


def test_plan_takes_the_dim_of_unit_stride_and_merges_the_rows() -> None:
    # (N, C, H, W) read from NHWC memory: C has stride 1, H and W merge into rows of stride C
    ir = _ir({"a": ((2, 40, 5, 7), (1400, 1, 280, 40)), "b": ((2, 40, 5, 7), (1400, 35, 7, 1))})
    tile = plan_tile(ir, [Ref("input", "a"), Ref("input", "b")], (2, 40, 5, 7))
    assert tile is not None
    assert (tile.outer, tile.span, tile.rows, tile.refs) == (2, 40, 35, (Ref("input", "a"),))


def test_plan_steps_aside_for_operands_read_in_order_small_dims_or_unmergeable_rows() -> None:
    space = (2, 40, 5, 7)
    ordered = _ir({"a": (space, (1400, 35, 7, 1))})
    assert plan_tile(ordered, [Ref("input", "a")], space) is None
    small = _ir({"a": ((2, 8, 5, 7), (280, 1, 56, 8))})
    assert plan_tile(small, [Ref("input", "a")], (2, 8, 5, 7)) is None
    # the rows' dims do not merge (W's stride is not H's over W's length)
    torn = _ir({"a": (space, (1400, 1, 40, 200))})
    assert plan_tile(torn, [Ref("input", "a")], space) is None


@pytest.mark.parametrize(
    ("expr", "x", "y"),
    [
        ("torch.cat([x.transpose(1, 2), y], dim=2) * 2", "4, 40, 33", "4, 33, 20"),
        ("x.transpose(1, 2).flip(1) + y", "4, 40, 33", "4, 33, 40"),
    ],
    ids=["concatenated", "flipped"],
)
def test_operands_an_indexed_op_reads_keep_their_own_offsets(
    expr: str, x: str, y: str, tmp_path: Path
) -> None:
    """An indexed op reads its operand at its own offset, never from the tile."""
    task, program = generate_checked(_PROBLEM.format(expr=expr, x=x, y=y))
    assert _tiled(program.kernel_source) == 0
    check_on_cpu(task, program, tmp_path, cooperative=True)
