"""A keepdim reduction and the consumer that broadcasts it back over the rows, in one kernel.

``x * rsqrt(sum(x * x) + eps)``, ``x / x.norm(dim=-1, keepdim=True)``, ``x - x.mean(...)``: each
row is reduced, then rewritten, by the same threads, so the rows are read from memory once for the
reduction and mostly from cache for the rewrite. Checked on the CPU with CUDA's block semantics
(``cooperative=True``) and compiled with nvcc where it is installed.
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
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn({last}))

    def forward(self, x):
{body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""
FUSED = "result broadcast back"


@pytest.fixture
def few_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fuse at the small row counts a CPU check can afford (the GPU default wants hundreds)."""
    monkeypatch.setattr(schedule, "_BROADCAST_BACK_ROWS", 1)
    monkeypatch.setattr(schedule, "_BROADCAST_BACK_THREAD_ROWS", 1)


def _generate(body: str, shape: tuple[int, ...], tuning: Tuning | None = None) -> tuple[Any, Any]:
    lines = "\n".join(f"        {line}" for line in body.splitlines())
    task, program = generate_checked(
        _PROBLEM.format(body=lines, shape=", ".join(map(str, shape)), last=shape[-1]), tuning
    )
    assert not program.declared_torch_ops
    return task, program


def _knobs(**knobs: Any) -> Tuning:
    return Tuning(default=KernelTuning(**knobs))


# an inverse norm (a sum, not the mean an RMS norm takes, which becomes the rms_norm kernel)
INV_NORM = "return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6) * self.weight"
CASES = {
    # contiguous rows, float4 kernel: per-row epilogue (add, rsqrt), two ops per element
    "inverse_norm_float4": (INV_NORM, (3, 5, 64), None, "float4 loads"),
    # the scalar twin of the same kernel
    "inverse_norm_scalar": (INV_NORM, (3, 5, 64), _knobs(vector_width=1), "scalar loads"),
    # rows longer than 1024: a block per row
    "centre_long_rows": ("return x - x.mean(-1, keepdim=True)", (3, 1500), None, "float4 loads"),
    # L2 normalisation through torch's norm, an odd length
    "l2_normalise": ("return x / x.norm(p=2, dim=-1, keepdim=True)", (7, 33), None, "a row"),
    # two trailing dims at once
    "two_dims": ("return x / x.amax(dim=(-2, -1), keepdim=True)", (4, 6, 7), None, "a row"),
    # a middle dimension: one thread per (strided) row
    "middle_dim": ("return x * x.sum(dim=1, keepdim=True)", (2, 5, 40), None, "thread per row"),
    # rows per block forced by the tuning: a block, or warps
    "block_per_row": (INV_NORM, (3, 5, 64), _knobs(rows_per_block=1), "block per row"),
    "warp_per_row": (INV_NORM, (3, 5, 64), _knobs(rows_per_block=2), "warp per row"),
    # Welford statistics (var): the same loop with its own accumulator
    "by_variance": ("return x / (x.var(-1, keepdim=True) + 1)", (5, 24), None, "warp per row"),
}


@pytest.mark.usefixtures("few_rows")
@pytest.mark.parametrize("name", list(CASES))
def test_reduction_and_its_broadcast_consumer_share_one_kernel(name: str, tmp_path: Path) -> None:
    body, shape, tuning, kernel = CASES[name]
    task, program = _generate(body, shape, tuning)
    assert FUSED in program.kernel_source and kernel in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(kernels.launched) == 1, kernels.launched
    assert kernels.launched[0].endswith("_v4") == (kernel == "float4 loads")


@pytest.mark.usefixtures("few_rows")
def test_softmax_written_out_is_one_softmax_kernel(tmp_path: Path) -> None:
    """Recognised as the softmax it computes (``_capture_norms``), not two such kernels."""
    body = "e = (x - x.amax(-1, keepdim=True)).exp()\nreturn e / e.sum(-1, keepdim=True)"
    task, program = _generate(body, (6, 50))
    assert FUSED not in program.kernel_source
    assert "// softmax:" in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(kernels.launched) == 1, kernels.launched


@pytest.mark.usefixtures("few_rows")
@pytest.mark.parametrize("body", [
    "return x / x.sum()",  # a whole-tensor reduction cannot be finished row by row
    "s = x.sum(-1, keepdim=True)\nreturn x / s, s",  # the reduction is an output too
    "return x[:, :1] * x.sum(-1, keepdim=True)",  # the consumer's shape is not the input's
])
def test_other_consumers_stay_in_their_own_kernel(body: str, tmp_path: Path) -> None:
    task, program = _generate(body, (4, 9))
    assert FUSED not in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(("shape", "fused"), [
    ((600, 8), True),  # enough rows for a warp each
    ((100, 2048), False),  # too few: the GPU would idle
    ((2, 8, 20000), True),  # a thread per (strided) row, 40000 of them
    ((2, 2048, 400), False),  # 800 threads only
    ((100, 8), True),  # too few, but so small that a second launch costs more
    ((2, 8, 400), True),
])
def test_rows_enough_to_fill_the_gpu_are_needed(shape: tuple[int, ...], fused: bool) -> None:
    dim = 1 if len(shape) == 3 else -1
    _, program = _generate(f"return x / x.sum(dim={dim}, keepdim=True)", shape)
    assert (FUSED in program.kernel_source) is fused


@pytest.mark.usefixtures("few_rows")
def test_unfused_on_feedback_the_rewrite_becomes_a_pointwise_kernel(tmp_path: Path) -> None:
    task, program = _generate(INV_NORM, (3, 5, 64), _knobs(fuse=False))
    assert FUSED not in program.kernel_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    # the prologue (x * x), the reduction, and the per-row and per-element epilogue together
    assert [k.removesuffix("_v4")[-1] for k in kernels.launched] == ["p", "t", "e"]


@pytest.mark.usefixtures("few_rows")
@pytest.mark.skipif(find_nvcc() is None, reason="counts loads in nvcc's PTX")
def test_a_short_strided_row_is_read_from_memory_once(tmp_path: Path) -> None:
    """RMS norm over 64 channels of NCHW, a thread per row: both loops unrolled whole, so nvcc
    keeps the row's values in registers for the rewrite (64 global loads, not 128)."""
    body = "return x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)"
    task, program = _generate(body, (2, 64, 4, 8))
    assert "thread per row" in program.kernel_source
    (tmp_path / "k.cu").write_text(program.kernel_source)
    ptx = tmp_path / "k.ptx"
    subprocess.run(
        [find_nvcc(), "-arch=sm_90", "-ptx", "-o", str(ptx), str(tmp_path / "k.cu")], check=True
    )
    entries = re.split(r"\.entry\s+", ptx.read_text())[1:]
    kernel = next(e for e in entries if "ld.global" in e)
    assert kernel.count("ld.global") == 64
    check_on_cpu(task, program, tmp_path, cooperative=True)
