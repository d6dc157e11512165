"""Kernels that differ only in their names (repeated layers of one shape) are built once."""

from __future__ import annotations

import re
from pathlib import Path

from stitch_graph.codegen._kernel_merge import merge_identical, relaunch
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_RELU = """// {id}: relu of {node}
extern "C" __global__ __launch_bounds__(256) void {name}(const float* a0, float* out) {{
  for (int i = blockIdx.x * 256 + threadIdx.x; i < {n}; i += gridDim.x * 256) {{
    const float v_{node} = fmaxf(a0[i], 0.f);
    out[i] = v_{node};
  }}
}}"""


def test_repeats_are_dropped_and_launch_the_first() -> None:
    kernels = [
        _RELU.format(id="k0", node="relu", name="k0_relu", n=64),
        _RELU.format(id="k1", node="relu_1", name="k1_relu", n=64),  # a repeat
        _RELU.format(id="k2", node="relu_2", name="k2_relu", n=128),  # another size
    ]
    kept, renamed = merge_identical(kernels)
    assert kept == [kernels[0], kernels[2]] and renamed == {"k1_relu": "k0_relu"}
    host = "KERNELS.k1_relu(1, 256, x, y)\nKERNELS.k2_relu(1, 256, y, z)\nKERNELS.conv(a)"
    assert relaunch(host, renamed) == host.replace("k1_relu(", "k0_relu(")


_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(4)])
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        return self.head(self.layers(x))


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
"""


def test_repeated_layers_run_one_kernel_and_match_pytorch(tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM)
    launches = re.findall(r"KERNELS\.(k\w+)\(", program.host_source)
    defined = re.findall(r"void (k\w+)\(", program.kernel_source)
    assert len(set(launches)) < len([k for k in launches if not k.endswith("_v4")])
    assert set(launches) <= set(defined)
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(kernels.launched) >= 4  # four layers' epilogues, whatever their names
    assert "bias=_get(self, 'head.bias')" in program.host_source  # the head's in cuBLASLt
