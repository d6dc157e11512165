"""Reductions over the last dims (contiguous rows), checked on the CPU.

Each case hits one shape of the row kernel: float4 loads or the scalar twin (odd lengths,
misaligned inputs), one thread / a group of lanes / a warp / a block per row, ragged or exact
batches of loads, fused prologue and epilogue, NaN and infinities, empty and size-1 dims.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from stitch_graph.codegen._emit_reduce import _row_threads
from tests.codegen.cpu_emulation import generate_checked, load_on_cpu

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, w):
        return {expr}


def get_inputs():
    return [torch.randn({shape}), torch.randn({wshape})]


def get_init_inputs():
    return []
"""

ROW = "thread(s) a row"


def _generate(expr: str, shape: str, wshape: str = "1") -> tuple[Any, Any]:
    return generate_checked(_PROBLEM.format(expr=expr, shape=shape, wshape=wshape))


def _run(task: Any, program: Any, tmp_path: Path, shift: int = 0, poison: list | None = None):
    """Reference and generated results; ``shift`` elements of offset make ``x`` misaligned."""
    kernels, host, ns = load_on_cpu(task, program, tmp_path, cooperative=True)
    torch.manual_seed(0)
    x, w = ns["get_inputs"]()
    if shift:
        x = torch.randn(x.numel() + shift)[shift:].view(x.shape)
    for at, value in poison or []:
        x[at] = value
    with torch.no_grad():
        expected, got = ns["Model"]()(x, w), host["ModelNew"]()(x, w)
    return expected, got, kernels.launched


# (expression, x shape, w shape, the threads a row of the float4 kernel or None: scalar only)
CASES = [
    ("torch.sum(x, dim=-1)", "300, 100", "1", 32),  # a warp a row, ragged batches
    ("torch.amin(x, dim=-1)", "1000, 12", "1", 4),  # groups of 4 lanes, rows past the end
    ("torch.amax(x, dim=1)", "3000, 4", "1", 1),  # a thread a row
    ("x.mean(dim=-1, keepdim=True)", "100, 500", "1", 128),  # a block a row
    ("torch.sum(x, dim=-1)", "4, 16384", "1", 1024),  # a block a row, exact batches
    ("torch.sum(x, dim=-1)", "37, 333", "1", None),  # odd length: scalar only
    ("torch.sum(x, dim=(1, 2))", "8, 16, 20", "1", 128),  # two reduced dims
    ("torch.sum(x)", "1000", "1", 256),  # one row
    ("(x * w).sum(dim=-1)", "50, 64", "50, 64", 16),  # two float4 operands
    ("(x * w).sum(dim=-1) + 1.0", "50, 64", "64", 16),  # a broadcast operand read by index
    ("torch.sqrt((x * x).mean(-1, keepdim=True)) * 2.0", "40, 96", "1", 32),  # epilogue
    ("torch.norm(x, dim=-1)", "30, 200", "1", 64),
    ("torch.prod(1.0 + 0.01 * x, dim=-1)", "30, 200", "1", 64),
    ("torch.logsumexp(x, dim=-1)", "30, 200", "1", 64),
    ("torch.sum(x, dim=1)", "7, 1", "1", None),  # size-1 dim
]


@pytest.mark.parametrize(
    ("expr", "shape", "wshape", "threads"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
def test_row_reduction_matches_pytorch(
    expr: str, shape: str, wshape: str, threads: int | None, tmp_path: Path
) -> None:
    task, program = _generate(expr, shape, wshape)
    assert ROW in program.kernel_source
    vector = re.search(r"(\d+) thread\(s\) a row, \d+ float4", program.kernel_source)
    assert (int(vector.group(1)) if vector else None) == threads
    expected, got, launched = _run(task, program, tmp_path)
    assert any(name.endswith("_v4") for name in launched) == (threads is not None)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_misaligned_input_takes_the_scalar_twin(tmp_path: Path) -> None:
    task, program = _generate("torch.sum(x, dim=-1)", "300, 100")
    expected, got, launched = _run(task, program, tmp_path, shift=1)
    assert launched and not any(name.endswith("_v4") for name in launched)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shift", [0, 1])
def test_nan_and_infinities_propagate(shift: int, tmp_path: Path) -> None:
    nan, inf = float("nan"), float("inf")
    poison = [((1, 3), nan), ((2, 0), inf), ((3, 5), -inf), ((4, 99), nan), ((4, 98), -inf)]
    exprs = ["torch.amax(x, dim=-1)", "torch.amin(x, dim=-1)", "torch.sum(x, dim=-1)"]
    for n, expr in enumerate([*exprs, "torch.logsumexp(x, dim=-1)"]):
        task, program = _generate(expr, "300, 100")
        (tmp_path / str(n)).mkdir()
        expected, got, _ = _run(task, program, tmp_path / str(n), shift, poison)
        assert torch.isnan(got[1]) and torch.isnan(got[4])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_empty_rows_keep_the_generic_path(tmp_path: Path) -> None:
    task, program = _generate("torch.sum(x, dim=1)", "5, 0")
    assert ROW not in program.kernel_source
    expected, got, _ = _run(task, program, tmp_path)
    torch.testing.assert_close(got, expected)


def test_row_threads_fill_the_gpu() -> None:
    assert _row_threads(1024, 4096) == 128  # 4096 x 4096 in float4: 8 loads a thread
    assert _row_threads(256, 16384) == 32  # 64 x 256 x 1024: a warp a row
    assert _row_threads(4, 1_000_000) == 1  # short rows, many of them: a thread a row
    assert _row_threads(1 << 20, 1) == 1024


@pytest.mark.parametrize("shift", [0, 1])
def test_long_log_softmax_row_is_read_once(shift: int, tmp_path: Path) -> None:
    # 1024 threads x 32 values: the row stays in registers (no statistics pass)
    task, program = _generate("torch.log_softmax(x, dim=1) * 2.0", "3, 32000")
    assert "stays in registers (32 per thread, float4)" in program.kernel_source
    assert "__launch_bounds__(1024)" in program.kernel_source
    expected, got, launched = _run(task, program, tmp_path, shift, [((1, 7), float("nan"))])
    assert launched[-1].endswith("_v4") == (shift == 0)
    assert torch.isnan(got[1]).all() and not torch.isnan(got[0]).any()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_long_softmax_reading_two_tensors_keeps_two_passes() -> None:
    _, program = _generate("torch.log_softmax(x + w, dim=1) - w", "3, 32000", "3, 32000")
    assert "statistics pass, then write pass" in program.kernel_source


def test_a_block_per_gathered_row_keeps_four_loads_in_flight(tmp_path: Path) -> None:
    """std over dims 1 and 3 (rows gathered by index, 1170 elements: a block each): the loop
    is unrolled by 4 so that each thread's loads overlap, and the result matches."""
    from tests.codegen.cpu_emulation import check_on_cpu

    source = _PROBLEM.format(expr="torch.std(x, dim=(1, 3)) + w", shape="2, 9, 5, 130", wshape="5")
    task, program = generate_checked(source)
    assert "block per row" in program.kernel_source
    assert "#pragma unroll 4" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
