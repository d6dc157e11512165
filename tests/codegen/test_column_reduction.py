"""Reductions over a non-last dimension (outputs side by side in memory), checked on the CPU.

Few outputs: one launch whose blocks split the reduced dim into chunks merged in shared memory;
very few outputs of a big input: two stages (partials, then a combine). Kernels run under
``CpuKernels(cooperative=True)`` so barriers and shared memory keep their CUDA meaning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from stitch_graph.checks import check_candidate
from stitch_graph.codegen import capture_program, emit_candidate, plan_program
from stitch_graph.codegen._emit_reduce import _column_splits, _column_tile
from stitch_graph.task import load_task
from stitch_graph.toolchain.nvcc import find_nvcc, nvcc_compile
from tests.codegen.cpu_emulation import load_on_cpu

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

TILE = "chunks merged in shared memory"
TWO_STAGE = "_part("


def run_problem(
    expr: str, shape: str, tmp_path: Path, marker: str, poison: list[tuple] | None = None
) -> Any:
    """PyTorch's and the generated program's results; the kernel source must contain ``marker``
    and compile with nvcc."""
    task = load_task(_PROBLEM.format(expr=expr, shape=shape))
    ir = capture_program(task)
    program = emit_candidate(ir, plan_program(ir))
    assert marker in program.kernel_source + program.host_source, "unexpected kernel style"
    assert not check_candidate(program, reference_source=task.source).rejected
    if find_nvcc() is not None:
        assert nvcc_compile(program.kernel_source).ok
    _, host, ns = load_on_cpu(task, program, tmp_path, cooperative=True)
    torch.manual_seed(0)
    x = ns["get_inputs"]()[0]
    for at, value in poison or []:
        x[at] = value
    with torch.no_grad():
        return ns["Model"]()(x), host["ModelNew"]()(x)


CASES = [
    ("torch.sum(x, dim=0)", "300, 96"),  # ragged chunks
    ("torch.sum(x, dim=0)", "1024, 64"),  # chunks of a whole number of batches: no guards
    ("torch.amax(x, dim=0)", "257, 64"),
    ("torch.argmax(x, dim=0)", "130, 40"),  # a partly filled block of outputs
    ("x.mean(dim=1, keepdim=True)", "3, 200, 40"),  # a block of outputs across two outer rows
    ("torch.var(x, dim=0)", "500, 33"),
    ("torch.logsumexp(x, dim=1)", "2, 100, 64"),
    ("torch.relu(x).sum(dim=0) * 2.0 + 1.0", "100, 48"),
    ("torch.amin(x, dim=(0, 1))", "20, 30, 40"),
]


@pytest.mark.parametrize(("expr", "shape"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_column_reduction_matches_pytorch(expr: str, shape: str, tmp_path: Path) -> None:
    expected, got = run_problem(expr, shape, tmp_path, TILE)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_few_outputs_of_a_big_input_take_two_stages(tmp_path: Path) -> None:
    expected, got = run_problem("torch.sum(x, dim=0)", "131072, 32", tmp_path, TWO_STAGE)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


def test_nan_in_a_column_propagates(tmp_path: Path) -> None:
    poison = [((1, 3), float("nan")), ((200, 5), float("nan"))]
    expected, got = run_problem("torch.amax(x, dim=0)", "257, 64", tmp_path, TILE, poison)
    assert torch.isnan(got[3]) and torch.isnan(got[5]) and torch.isnan(expected[3])
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_argmax_keeps_the_first_nan_and_the_first_tie(tmp_path: Path) -> None:
    # NaNs and ties in different chunks: the merge must keep the lowest index
    poison = [((100, 3), float("nan")), ((20, 3), float("nan")), ((9, 5), 50.0), ((120, 5), 50.0)]
    expected, got = run_problem("torch.argmax(x, dim=0)", "130, 40", tmp_path, TILE, poison)
    assert got[3] == 20 and got[5] == 9
    assert torch.equal(got, expected)


def test_split_count_fills_the_gpu_and_keeps_chunks_long() -> None:
    assert _column_splits(4096, 4096) == 66  # 4096 x 66 threads, chunks of 63
    assert _column_splits(300_000, 4096) == 1  # enough outputs: one thread each
    assert _column_splits(96, 40) == 1  # too short to split
    assert _column_splits(8, 1 << 20) == 1024


def test_column_tile_fills_the_gpu_with_whole_sectors() -> None:
    assert _column_tile(16 * 1024, 1024, 512) == (16, 32)  # 512 blocks of 512: the whole GPU
    assert _column_tile(4096, 4096, 512) == (64, 8)  # 8 lanes: a warp reads 4 full sectors
    assert _column_tile(96, 40, 512) == (4, 128)  # chunks of at least 8 elements


def test_outputs_enough_for_a_thread_each_split_only_when_asked() -> None:
    """An argmax over 4096 of 270336 outputs fills the GPU with a thread an output; the
    tuner's ``split_reduction=True`` emits the tiled form instead, so both get timed."""
    from stitch_graph.codegen import KernelTuning, Tuning

    task = load_task(_PROBLEM.format(expr="torch.argmax(x, dim=1)", shape="1, 4096, 270336"))
    ir = capture_program(task)
    plain = emit_candidate(ir, plan_program(ir))
    split = emit_candidate(
        ir, plan_program(ir), tuning=Tuning(default=KernelTuning(split_reduction=True))
    )
    assert TILE not in plain.kernel_source and "thread per row" in plain.kernel_source
    assert f"64 adjacent output(s) x 4 chunk(s) of 1024 a block, {TILE}" in split.kernel_source
    if find_nvcc() is not None:
        assert nvcc_compile(split.kernel_source).ok


@pytest.mark.parametrize(("expr", "strided"), [("x.argmax(dim=1)", True), ("x.sum(-1)", False)])
def test_a_strided_reduction_is_tuned_in_its_own_space_first_loads_in_flight(
    expr: str, strided: bool
) -> None:
    from stitch_graph.codegen import groups_from_plan
    from stitch_graph.codegen.schedule import reduces_strided
    from stitch_graph.codegen.space import space_kind, tuning_space

    ir = capture_program(load_task(_PROBLEM.format(expr=expr, shape="8, 64, 33")))
    (group,) = groups_from_plan(ir, plan_program(ir))
    assert reduces_strided(ir, group) == strided
    kind = space_kind(group.kind, "argmax", strided=reduces_strided(ir, group))
    assert (kind == "column_reduction") == strided
    assert (tuning_space(kind)[1].split_reduction is True) == strided
