"""Convolutions through cuDNN (``KERNELS.conv`` / ``KERNELS.conv_transpose``), checked on the CPU.

The generated host code calls the runtime's cuDNN entry points with the convolution's geometry;
the CPU emulation computes the same call with PyTorch, so a wrong stride, padding, dilation, group
count or output shape in the generated call fails the comparison. The bias and the fused epilogue
run in a generated kernel afterwards, which the emulation runs as C++.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from stitch_graph.checks import check_candidate
from stitch_graph.codegen import KernelTuning, Tuning, capture_program, emit_candidate, plan_program
from stitch_graph.task import load_task
from stitch_graph.toolchain.nvcc import find_nvcc, nvcc_compile
from tests.codegen.cpu_emulation import check_on_cpu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

_PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.{layer}
        self.scale = nn.Parameter(torch.randn(1))

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn{shape}]


def get_init_inputs():
    return []
"""


def _generate(layer: str, shape: tuple, expr: str, tuning: Tuning | None = None) -> tuple:
    task = load_task(textwrap.dedent(_PROBLEM.format(layer=layer, shape=shape, expr=expr)))
    ir = capture_program(task)
    cand = emit_candidate(ir, plan_program(ir), tuning=tuning)
    assert not cand.declared_torch_ops, cand.declared_torch_ops
    report = check_candidate(cand, reference_source=task.source)
    assert not report.rejected, report.findings
    return task, cand


@pytest.mark.parametrize(
    ("layer", "shape", "expr", "call"),
    [
        ("Conv2d(4, 6, 3, padding=1)", (2, 4, 7, 5), "torch.relu(self.conv(x))", "conv"),
        ("Conv1d(3, 5, 4, stride=2, dilation=2, bias=False)", (2, 3, 19), "self.conv(x)", "conv"),
        ("Conv3d(4, 6, (3, 1, 2), stride=(1, 2, 1), groups=2)", (2, 4, 5, 6, 4),
         "F.gelu(self.conv(x)) * self.scale", "conv"),
        ("ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)", (2, 4, 5, 4),
         "torch.tanh(self.conv(x))", "conv_transpose"),
        ("ConvTranspose3d(4, 4, 3, stride=1, padding=1, groups=2, bias=False)", (1, 4, 4, 5, 3),
         "self.conv(x)", "conv_transpose"),
        ("ConvTranspose1d(3, 2, 5, stride=3, dilation=2)", (2, 3, 6), "self.conv(x) - 1.0",
         "conv_transpose"),
    ],
)
def test_library_convolution_matches_pytorch(
    layer: str, shape: tuple, expr: str, call: str, tmp_path: Path
) -> None:
    task, cand = _generate(layer, shape, expr)
    assert f"KERNELS.{call}(" in cand.host_source
    assert "im2col" not in cand.kernel_source and "direct conv" not in cand.kernel_source
    if find_nvcc() is not None:
        result = nvcc_compile(cand.kernel_source)
        assert result.ok, [d.message for d in result.errors][:5]
    kernels = check_on_cpu(task, cand, tmp_path)
    assert kernels.launched[0] == call
    has_epilogue = "bias=False" not in layer or expr != "self.conv(x)"
    assert len(kernels.launched) == 1 + has_epilogue  # the library call, then one kernel at most


@pytest.mark.parametrize("layer", ["Conv2d(4, 6, 3, padding=1)", "ConvTranspose2d(4, 6, 3)"])
def test_a_tuned_cudnn_engine_is_passed_to_the_runtime(layer: str, tmp_path: Path) -> None:
    default = _generate(layer, (2, 4, 7, 5), "self.conv(x)")[1]
    assert "engine=" not in default.host_source  # cuDNN's first choice, as before
    tuning = Tuning(default=KernelTuning(conv_engine=2))
    task, cand = _generate(layer, (2, 4, 7, 5), "self.conv(x)", tuning)
    assert ", engine=2)" in cand.host_source
    kernels = check_on_cpu(task, cand, tmp_path)
    assert kernels.engines and set(kernels.engines) == {2}


def test_generated_convolution_when_the_coder_is_told_so(tmp_path: Path) -> None:
    tuning = Tuning(default=KernelTuning(conv_library=False))
    task, cand = _generate("Conv2d(4, 6, 3, padding=1)", (2, 4, 7, 5), "self.conv(x)", tuning)
    assert "KERNELS.conv(" not in cand.host_source
    check_on_cpu(task, cand, tmp_path)


@pytest.mark.parametrize("layer", ["Conv2d(32, 6, 1)", "Conv2d(4, 6, 3, padding=1)"])
def test_a_generated_convolution_takes_the_tuned_cublaslt_algorithm(
    layer: str, tmp_path: Path
) -> None:
    """The im2col path (a 1x1 convolution: x itself) runs its SGEMM with the tuned algo."""
    tuning = Tuning(default=KernelTuning(conv_library=False, gemm_algo=1))
    channels = int(layer.split("(")[1].split(",")[0])
    task, cand = _generate(layer, (2, channels, 7, 5), "self.conv(x)", tuning)
    assert "KERNELS.conv(" not in cand.host_source and ", algo=1)" in cand.host_source
    check_on_cpu(task, cand, tmp_path)


def test_a_cudnn_failure_switches_the_coder_to_generated_convolution() -> None:
    from stitch_graph.artifacts import Feedback, FeedbackItem
    from stitch_graph.codegen import apply_feedback

    task, cand = _generate("Conv2d(4, 6, 3, padding=1)", (2, 4, 7, 5), "torch.relu(self.conv(x))")
    plan = plan_program(capture_program(task))
    error = FeedbackItem(action="fix error", detail="RuntimeError: convolution failed: "
                         "CUDNN_STATUS_NOT_SUPPORTED (cuDNN status 3000)")
    tuned = apply_feedback(None, plan, Feedback(target="coder", category="runtime_error",
                                                items=[error]))
    assert all(tuned.for_item(i.id).conv_library is False for i in plan.items)
    again = emit_candidate(capture_program(task), plan, tuning=tuned)
    assert "KERNELS.conv(" in cand.host_source and "KERNELS.conv(" not in again.host_source
    advice = FeedbackItem(action="use cuDNN for the convolution")
    back = apply_feedback(tuned, plan, Feedback(target="coder", category="bottleneck",
                                                items=[advice]))
    assert all(back.for_item(i.id).conv_library is True for i in plan.items)


@pytest.mark.parametrize(
    ("layer", "depthwise"),
    [
        ("Conv2d(8, 8, (3, 1), groups=8)", True),
        ("Conv2d(8, 16, 3, groups=8)", True),  # a channel multiplier of two
        ("Conv2d(8, 8, 3, groups=2)", False),
        ("Conv2d(8, 8, 3)", False),
        ("ConvTranspose2d(8, 8, 3, groups=8)", False),
    ],
)
def test_depthwise_convolutions_time_the_generated_kernel_first(layer, depthwise, tmp_path):
    from stitch_graph.codegen import groups_from_plan
    from stitch_graph.codegen.schedule import convolves_depthwise
    from stitch_graph.codegen.space import space_kind, tuning_space

    task, _ = _generate(layer, (2, 8, 12, 10), "self.conv(x)")
    ir = capture_program(task)
    group = next(g for g in groups_from_plan(ir, plan_program(ir)) if g.kind == "conv")
    assert convolves_depthwise(ir, group) == depthwise
    kind = space_kind("conv", ir.node(group.anchor).op, depthwise=depthwise)
    assert (tuning_space(kind)[1].conv_library is False) == (depthwise or "Transpose" in layer)
    if depthwise:  # the first alternative: the direct kernel, correct
        tuning = Tuning(default=KernelTuning(conv_library=False))
        task, cand = _generate(layer, (2, 8, 12, 10), "self.conv(x)", tuning)
        assert "direct conv2d" in cand.kernel_source
        check_on_cpu(task, cand, tmp_path)
