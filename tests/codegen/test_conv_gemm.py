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

from stitch_graph.checks import check_candidate
from stitch_graph.codegen import KernelTuning, Tuning, capture_program, emit_candidate, plan_program
from stitch_graph.codegen import _emit_conv as conv_mod
from stitch_graph.task import load_task
from stitch_graph.toolchain.nvcc import find_nvcc, nvcc_compile
from tests.codegen.cpu_emulation import check_on_cpu


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
        # groups=2 with 3 output channels per group keeps the direct kernel
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
    monkeypatch.setattr(conv_mod, "_CONV_SCRATCH_BYTES", 2 * per_image + 4)
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
    geo = conv_mod._ConvGeom(16, 64, 128, 128, 128, 3, 3, 128, 128, 1, 1, 1, 1, 1, 1)
    chunk, chunks = conv_mod._conv_chunk(geo)
    assert (chunk, chunks) == (6, 3)
    assert chunk * geo.k * geo.p * 4 <= conv_mod._CONV_SCRATCH_BYTES


_CONVT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose{nd}d({cin}, {cout}, {k}, stride=1, padding={p},
                                         output_padding={op}, dilation={d}, groups={g},
                                         bias={bias})

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({n}, {cin}, {size})]


def get_init_inputs():
    return []
"""
_KEYST = ("nd", "n", "cin", "cout", "k", "p", "op", "d", "g", "bias", "size", "expr")
_PLAIN = "self.conv(x)"
_TANH = "torch.tanh(self.conv(x)) + 1.0"


@pytest.mark.parametrize(
    ("values", "path"),
    [
        # 1-D: padding 0 (conv padding K-1), bias + relu epilogue
        ((1, 2, 5, 7, 4, 0, 0, 1, 1, True, "13", _RELU), "im2col"),
        # 1-D: dilation 2, padding 2 (conv padding 2), no bias, no epilogue
        ((1, 2, 6, 4, 3, 2, 0, 2, 1, False, "11", _PLAIN), "im2col"),
        # 2-D: non-square kernel, per-dim padding, bias + epilogue
        ((2, 3, 4, 6, (3, 2), (1, 0), 0, 1, 1, True, "9, 7", _TANH), "im2col"),
        # 2-D: dilation (2, 1), padding at the limit dil*(K-1) in one dim
        ((2, 2, 3, 5, 3, (4, 1), 0, (2, 1), 1, False, "8, 6", _PLAIN), "im2col"),
        # 2-D: C >= 16, padding 0 (the output is larger than the input), C = OC: im2col
        ((2, 2, 16, 16, 3, 0, 0, 1, 1, True, "6, 5", _RELU), "im2col"),
        # 2-D: C > 2 OC: the col2im buffer is under half the im2col one
        ((2, 2, 20, 4, 3, 1, 0, 1, 1, True, "6, 5", _RELU), "col2im"),
        # 3-D: non-cubic kernel and padding, bias + epilogue
        ((3, 2, 4, 5, (2, 3, 3), (0, 1, 2), 0, 1, 1, True, "3, 5, 6", _TANH), "im2col"),
        # 3-D: dilation 2, no bias
        ((3, 2, 2, 3, 3, 1, 0, 2, 1, False, "4, 5, 6", _PLAIN), "im2col"),
        # 1x1, padding 0: the input is the GEMM operand, the weight only transposed
        ((2, 2, 16, 8, 1, 0, 0, 1, 1, True, "5, 6", _RELU), "1x1"),
        # padding beyond dil*(K-1) and output padding have no convolution equivalent
        ((2, 2, 4, 5, 3, 3, 0, 1, 1, True, "9, 8", _PLAIN), "direct"),
        ((2, 2, 4, 5, 3, 1, 1, 2, 1, True, "7, 6", _PLAIN), "direct"),
        # grouped: one SGEMM per group
        ((2, 2, 32, 32, 3, 1, 0, 1, 2, True, "5, 6", _RELU), "im2col"),
        ((1, 2, 48, 48, 2, 0, 0, 2, 3, False, "9", _PLAIN), "im2col"),
        # grouped with few channels per group keeps the direct kernel
        ((2, 2, 8, 6, 3, 1, 0, 1, 2, True, "6, 5", _RELU), "direct"),
    ],
)
def test_stride1_conv_transpose_matches_pytorch_on_cpu(
    values: tuple, path: str, tmp_path: Path
) -> None:
    params = dict(zip(_KEYST, values, strict=True))
    cand, kernels = _run(_CONVT.format(**params), tmp_path)
    forward = cand.host_source.split("def forward")[1]
    assert ("_wflip" in cand.kernel_source) == (path in ("im2col", "1x1"))
    assert ("im2col" in cand.kernel_source) == (path == "im2col")
    assert ("transposed conv by parts" in forward) == (path == "col2im")
    assert ("_sgemm(" in forward) == (path != "direct")
    assert ("for _g in range(" in forward) == (params["g"] > 1 and path != "direct")
    assert ("direct transposed" in cand.kernel_source) == (path == "direct")


@pytest.mark.parametrize(
    "values",
    [
        # 2 groups of 16 -> 24 channels, 3x3, padding 1, bias + relu
        (2, 32, 48, 3, 1, 1, 1, 2, True, 7, 6, _RELU),
        # 3 groups, strided and dilated, no bias
        (2, 48, 48, (3, 2), (2, 1), (1, 0), (1, 2), 3, False, 9, 8, _PLAIN),
        # grouped 1x1 (channel-shuffle style): x is the GEMM operand, sliced by group
        (2, 64, 64, 1, 1, 0, 1, 4, True, 5, 6, "F.relu(self.bn(self.conv(x)))"),
    ],
)
def test_grouped_conv2d_matches_pytorch_on_cpu(values: tuple, tmp_path: Path) -> None:
    cand, _ = _run(_CONV2D.format(**dict(zip(_KEYS2D, values, strict=True))), tmp_path)
    forward = cand.host_source.split("def forward")[1]
    assert f"for _g in range({values[7]}):" in forward
    assert "direct conv" not in cand.kernel_source


@pytest.mark.parametrize("groups", [1, 2])
def test_chunked_stride1_conv_transpose_matches_pytorch(
    groups: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small scratch budget runs the flipped-weight convolution image by image."""
    values = (3, 3, 32, 32, 3, 1, 0, 1, groups, True, "4, 5, 6", _TANH)
    monkeypatch.setattr(conv_mod, "_CONV_SCRATCH_BYTES", 4000)
    cand, kernels = _run(_CONVT.format(**dict(zip(_KEYST, values, strict=True))), tmp_path)
    assert "for _n0 in range(0, 3, 1):" in cand.host_source
    assert sum(name.endswith("_im2col") for name in kernels.launched) == 3
    assert sum(name.endswith("_wflip") for name in kernels.launched) == 1


def test_the_suite_stride1_conv_transpose3d_takes_im2col() -> None:
    """ConvTranspose3d(16 -> 64, k3, s1, p1) on 16x16x32x128x128: the col2im buffer of one image
    (3.6 GB) is over the limit, the im2col one (0.9 GB) is not: one image at a time."""
    geo = conv_mod._ConvGeom(16, 16, 128, 128, 64, 3, 3, 128, 128, 1, 1, 1, 1, 1, 1, 32, 3, 32, 1, 1)
    assert conv_mod._col2im_elems(geo) * 4 > conv_mod._CONV_SCRATCH_MAX
    fwd = conv_mod._conv_transpose_as_conv(geo)
    assert fwd is not None and (fwd.pd, fwd.ph, fwd.pw) == (1, 1, 1)
    assert fwd.k * fwd.p * 4 <= conv_mod._CONV_SCRATCH_MAX
    assert conv_mod._conv_chunk(fwd) == (1, 16)
