"""Reductions over a non-last dimension, split into chunks and combined, checked on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from cpu_emulation import CpuKernels

from stitch_graph.codegen import capture_program, emit_candidate, plan_program
from stitch_graph.codegen.emit import _column_splits
from stitch_graph.task import load_task
from stitch_graph.tools.nvcc import find_nvcc, nvcc_compile
from stitch_graph.verify import check_candidate

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

CASES = [
    ("torch.sum(x, dim=0)", "300, 96"),
    ("torch.amax(x, dim=0)", "257, 64"),
    ("torch.argmax(x, dim=0)", "130, 40"),
    ("x.mean(dim=1, keepdim=True)", "3, 200, 40"),
    ("torch.var(x, dim=0)", "500, 33"),
    ("torch.logsumexp(x, dim=1)", "2, 100, 64"),
    ("torch.relu(x).sum(dim=0) * 2.0 + 1.0", "100, 48"),
]


def _run(expr: str, shape: str, tmp_path: Path, poison: bool = False) -> Any:
    task = load_task(_PROBLEM.format(expr=expr, shape=shape))
    ir = capture_program(task)
    program = emit_candidate(ir, plan_program(ir))
    assert "_part(" in program.host_source, "expected the split column kernel"
    assert not check_candidate(program, reference_source=task.source).rejected
    if find_nvcc() is not None:
        assert nvcc_compile(program.kernel_source).ok
    host: dict[str, Any] = {
        "__name__": "candidate",
        "KERNELS": CpuKernels(program.kernel_source, tmp_path, with_prelude=True),
    }
    exec(compile(program.host_source, "<candidate>", "exec"), host)
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(task.source, "<reference>", "exec"), ns)
    torch.manual_seed(0)
    x = ns["get_inputs"]()[0]
    if poison:
        x[1, 3] = float("nan")
    with torch.no_grad():
        return ns["Model"]()(x), host["ModelNew"]()(x)


@pytest.mark.parametrize(("expr", "shape"), CASES, ids=[c[0] for c in CASES])
def test_column_reduction_matches_pytorch(expr: str, shape: str, tmp_path: Path) -> None:
    expected, got = _run(expr, shape, tmp_path)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_nan_in_a_column_propagates(tmp_path: Path) -> None:
    expected, got = _run("torch.amax(x, dim=0)", "257, 64", tmp_path, poison=True)
    assert torch.isnan(got[3]) and torch.isnan(expected[3])
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_split_count_fills_the_gpu_and_keeps_chunks_long() -> None:
    assert _column_splits(4096, 4096) == 66  # 4096 x 66 threads, chunks of 63
    assert _column_splits(300_000, 4096) == 1  # enough outputs: one thread each
    assert _column_splits(96, 40) == 1  # too short to split
    assert _column_splits(8, 1 << 20) == 1024
