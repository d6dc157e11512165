"""Static checks on programs that build their own kernels: what stays allowed, what does not."""

from __future__ import annotations

import textwrap

import pytest

from stitch_graph.artifacts import Candidate
from stitch_graph.checks import check_candidate

KERNEL = '''r"""
extern "C" __global__ void scale(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.f * x[i];
}
"""'''

FORWARD = """
class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            K(((n + 255) // 256,), (256,), (cp.uint64(x.data_ptr()), cp.uint64(y.data_ptr()),
                                           cp.int64(n)))
        return y
"""


def _rules(source: str) -> list[str]:
    host = textwrap.dedent(source)
    return check_candidate(Candidate(kernel_source="", host_source=host, form="external")).rules


def _cupy(prelude: str, forward: str = FORWARD) -> str:
    return "import cupy as cp\nimport torch\nimport torch.nn as nn\n" + prelude + "\n" + forward


def test_a_raw_kernel_from_source_text_is_a_launch():
    assert _rules(_cupy(f"K = cp.RawKernel({KERNEL}, 'scale')")) == []


@pytest.mark.parametrize(
    ("prelude", "rule"),
    [
        ("K = cp.RawKernel(open('k.cu').read(), 'scale')", "opaque_build"),
        ("K = cp.RawModule(path='k.cubin').get_function('scale')", "opaque_build"),
        ("K = cp.ElementwiseKernel('float32 x', 'float32 y', 'y = 2 * x')", "codegen_call"),
        (f"S = {KERNEL}\nK = cp.RawKernel(S, 'scale')\ns = cp.cuda.Stream()", "timing_tamper"),
    ],
    ids=["source_read_from_a_file", "prebuilt_cubin", "elementwise_builder", "cupy_side_stream"],
)
def test_what_a_raw_kernel_program_may_not_do(prelude, rule):
    assert rule in _rules(_cupy(prelude))


def test_a_raw_kernel_built_but_never_launched_is_no_launch():
    forward = FORWARD.replace("K(((n", "print(((n")
    assert "no_kernel_launch" in _rules(_cupy(f"K = cp.RawKernel({KERNEL}, 'scale')", forward))


INLINE = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import {loader}

ext = {loader}("e", "torch::Tensor run(torch::Tensor x);", {cuda}functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x){tail}
"""
CUDA = (
    'cuda_sources="__global__ void k(const float* x, float* y) { y[0] = x[0] * 2.f; }\\n'
    'torch::Tensor run(torch::Tensor x) { auto y = torch::empty_like(x); return y; }", '
)


def _inline(loader: str = "load_inline", cuda: str = CUDA, tail: str = "") -> list[str]:
    return _rules(INLINE.format(loader=loader, cuda=cuda, tail=tail))


def test_load_inline_with_cuda_sources_is_a_launch_and_returns_a_tensor():
    assert _inline() == []
    assert "torch_compute" in _inline(tail=" * 2")  # its result is a tensor like any other


def test_load_inline_without_cuda_and_file_based_load_are_refused():
    assert "opaque_build" in _inline(cuda="")
    assert "codegen_call" in _inline(loader="load", cuda="sources=['k.cu'], ")


SUBPROCESS = """
import ctypes
import subprocess

import torch
import torch.nn as nn

SRC = "__global__ void k(float* y) {{ y[0] = y[0] * 2.f + 1.f; }}"
{build}
LIB = ctypes.CDLL("/tmp/k.so")


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        LIB.run(y.data_ptr())
        return y
"""


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (
            'subprocess.run(["nvcc", "-shared", "-x", "cu", "-", "-o", "/tmp/k.so"], '
            "input=SRC.encode(), check=True)",
            [],
        ),
        (
            'subprocess.run(["gcc", "-shared", "k.c", "-o", "/tmp/k.so"])',
            ["opaque_build", "timing_tamper"],
        ),
        ('subprocess.run(["nvcc", "k.cu"])\nsubprocess.Popen(["sleep", "1"])', ["timing_tamper"]),
    ],
    ids=["nvcc_build", "another_compiler", "nvcc_and_another_process"],
)
def test_subprocess_is_allowed_only_to_run_nvcc(build, expected):
    assert _rules(SUBPROCESS.format(build=build)) == expected


def test_open_may_write_a_build_file_but_not_read():
    write = "with open('/tmp/k.cu', 'w') as f:\n    f.write('x')\n"
    read = "with open('/tmp/k.cu') as f:\n    f.read()\n"
    base = _cupy(f"K = cp.RawKernel({KERNEL}, 'scale')\n")
    assert _rules(base + write) == []
    assert "reference_access" in _rules(base + read)


def test_a_cached_builder_of_a_kernel_is_not_an_output_cache():
    prelude = (
        "import functools\n\n\n@functools.cache\ndef K_():\n"
        f"    return cp.RawKernel({KERNEL}, 'scale')\n"
    )
    forward = FORWARD.replace("K(((n", "K_()(((n")
    assert _rules(_cupy(prelude, forward)) == []
    cached_forward = forward.replace("    def forward", "    @functools.cache\n    def forward")
    assert "output_cache" in _rules(_cupy(prelude, cached_forward))


def test_a_cuda_toolkit_library_may_be_loaded_to_call_it():
    source = SUBPROCESS.format(build="").replace('"/tmp/k.so"', '"libcublas.so.12"')
    source = source.replace("import subprocess\n", "")
    assert _rules(source) == []


def test_the_jiterator_is_another_generator():
    prelude = (
        "f = torch.cuda.jiterator._create_jit_fn('template <typename T> T f(T x) { return x; }')"
    )
    assert "codegen_call" in _rules(_cupy(prelude))
