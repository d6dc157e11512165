"""Convolutions as im2col + cuBLAS SGEMM, checked numerically on the CPU (no GPU needed).

The generated ``ModelNew.forward`` runs unchanged on CPU tensors: its grid-stride kernels are
compiled with g++ behind a small CUDA shim and launched by a serial loop over blocks and threads,
and ``_sgemm`` is replaced by a column-major emulation that reads and writes exactly the elements
cuBLAS would for the given m/n/k, leading dimensions and batch strides (asserting they lie inside
the tensors passed). The output is compared with the reference PyTorch model on the CPU.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cpu_emulation import check_on_cpu

from stitch_graph.codegen import KernelTuning, Tuning, capture_program, emit_candidate, plan_program
from stitch_graph.codegen import emit as emit_mod
from stitch_graph.task import load_task
from stitch_graph.tools.nvcc import find_nvcc, nvcc_compile
from stitch_graph.verify import check_candidate


def _run(source: str, tmp_path: Path, tuning: Tuning | None = None) -> tuple[Any, Any]:
    """Generate with the generated-convolution paths (not cuDNN), run on the CPU, compare."""
    task = load_task(textwrap.dedent(source))
    ir = capture_program(task)
    plan = plan_program(ir)
    tuning = tuning or Tuning()
    tuning.default.conv_library = False
    cand = emit_candidate(ir, plan, tuning=tuning)
    assert not cand.declared_torch_ops, cand.declared_torch_ops
    report = check_candidate(cand, reference_source=task.source)
    assert not report.rejected, report.findings
    if find_nvcc() is not None:
        result = nvcc_compile(cand.kernel_source)
        assert result.ok, [d.message for d in result.errors][:5]
    kernels = check_on_cpu(task, cand, tmp_path)
    return cand, kernels


_CONV2D = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d({cin}, {cout}, {k}, stride={s}, padding={p}, dilation={d},
                              groups={g}, bias={bias})
        self.bn = nn.BatchNorm2d({cout})
        self.eval()  # batch norm with running statistics: a pointwise epilogue

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({n}, {cin}, {h}, {w})]


def get_init_inputs():
    return []
"""

_CONV1D = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d({cin}, {cout}, {k}, stride={s}, padding={p}, dilation={d},
                              bias={bias})

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({n}, {cin}, {length})]


def get_init_inputs():
    return []
"""

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


_KEYS2D = ("n", "cin", "cout", "k", "s", "p", "d", "g", "bias", "h", "w", "expr")
_KEYS1D = ("n", "cin", "cout", "k", "s", "p", "d", "bias", "length", "expr")
_RELU = "torch.relu(self.conv(x))"


@pytest.mark.parametrize(
    ("values", "path"),
    [
        # 3x3, padding 1, bias + relu: im2col, SGEMM, bias/relu epilogue
        ((3, 5, 6, 3, 1, 1, 1, 1, True, 9, 7, _RELU), "im2col"),
        # non-square kernel, strides, dilations, asymmetric padding, no bias, no epilogue
        ((2, 4, 5, (3, 2), (2, 1), (2, 1), (2, 3), 1, False, 11, 10, "self.conv(x)"), "im2col"),
        # 1x1, stride 1, no padding, + batch norm (eval): x is the GEMM operand itself
        ((3, 16, 7, 1, 1, 0, 1, 1, True, 5, 6, "F.relu(self.bn(self.conv(x)))"), "1x1"),
        # 1x1 stride 2 (the residual shortcut): needs the im2col gather
        ((2, 17, 8, 1, 2, 0, 1, 1, False, 9, 8, "self.bn(self.conv(x))"), "im2col"),
        # groups=2 keeps the direct kernel
        ((2, 8, 6, 3, 1, 1, 1, 2, True, 6, 5, _RELU), "direct"),
        # tiny K = C*KH*KW keeps the direct kernel
        ((2, 1, 4, 3, 1, 1, 1, 1, True, 6, 5, _RELU), "direct"),
    ],
)
def test_conv2d_matches_pytorch_on_cpu(values: tuple, path: str, tmp_path: Path) -> None:
    cand, _ = _run(_CONV2D.format(**dict(zip(_KEYS2D, values, strict=True))), tmp_path)
    assert ("im2col" in cand.kernel_source) == (path == "im2col")
    assert ("_sgemm(" in cand.host_source.split("def forward")[1]) == (path != "direct")
    assert ("cublas" in cand.link_libraries) == (path != "direct")
    assert ("direct conv" in cand.kernel_source) == (path == "direct")


@pytest.mark.parametrize(
    "values",
    [
        (3, 8, 12, 5, 1, 2, 1, True, 33, "F.gelu(self.conv(x))"),
        (2, 6, 4, 3, 3, 1, 2, False, 40, "self.conv(x)"),
        (2, 20, 4, 1, 1, 0, 1, True, 9, "self.conv(x)"),
    ],
)
def test_conv1d_matches_pytorch_on_cpu(values: tuple, tmp_path: Path) -> None:
    cand, _ = _run(_CONV1D.format(**dict(zip(_KEYS1D, values, strict=True))), tmp_path)
    assert "_sgemm(" in cand.host_source.split("def forward")[1]


@pytest.mark.parametrize(("bias", "expr"), [(True, _RELU), (False, "self.conv(x)")])
def test_chunked_im2col_matches_pytorch(
    bias: bool, expr: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small scratch budget forces chunks of 2 images (2, 2, 1) and the chunk loop."""
    params = dict(zip(_KEYS2D, (5, 3, 4, 3, 1, 1, 1, 1, bias, 6, 7, expr), strict=True))
    per_image = 3 * 9 * 6 * 7 * 4
    monkeypatch.setattr(emit_mod, "_CONV_SCRATCH_BYTES", 2 * per_image + 4)
    cand, kernels = _run(_CONV2D.format(**params), tmp_path)
    forward = cand.host_source.split("def forward")[1]
    assert "for _n0 in range(0, 5, 2):" in forward
    assert "torch.empty([2, 27, 42]" in forward
    assert sum(name.endswith("_im2col") for name in kernels.launched) == 3


def test_unfused_and_tuned_conv_matches_pytorch(tmp_path: Path) -> None:
    params = dict(zip(_KEYS2D, (2, 4, 6, 3, 2, 1, 1, 1, True, 9, 9, _RELU), strict=True))
    tuning = Tuning(default=KernelTuning(fuse=False, block_size=64, unroll=4, vector_width=1))
    cand, kernels = _run(_CONV2D.format(**params), tmp_path, tuning)
    assert "__launch_bounds__(64) void k0_conv2d_relu_im2col" in cand.kernel_source
    assert "#pragma unroll 4" in cand.kernel_source
    assert len(set(kernels.launched)) == 3  # im2col, bias, separate relu


def test_chunk_rule_of_the_suite_problem() -> None:
    geo = emit_mod._ConvGeom(16, 64, 128, 128, 128, 3, 3, 128, 128, 1, 1, 1, 1, 1, 1)
    chunk, chunks = emit_mod._conv_chunk(geo)
    assert (chunk, chunks) == (6, 3)
    assert chunk * geo.k * geo.p * 4 <= emit_mod._CONV_SCRATCH_BYTES
