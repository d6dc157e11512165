"""A linear layer's bias, and a ReLU that is all its epilogue, go to cuBLASLt's epilogue.

The programs run in the CPU emulation, whose GEMM applies the bias and the ReLU as cuBLASLt
does; anything else after the layer keeps the generated epilogue kernel.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stitch_graph.codegen import KernelTuning, Tuning
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 40)

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(6, 24)]


def get_init_inputs():
    return []
"""

CASES = {  # expression -> the options the GEMM takes, generated kernels after it
    "self.fc(x)": (", bias=_get(self, 'fc.bias'))", 0),
    "torch.relu(self.fc(x))": (", bias=_get(self, 'fc.bias'), relu=True)", 0),
    "torch.nn.functional.gelu(self.fc(x))": (None, 1),
    "torch.relu(self.fc(x)) * 2": (None, 1),
}


def _kernels(source: str) -> int:
    """Generated kernels, a float4 twin not counted apart."""
    return len(
        {name.removesuffix("_v4") for name in re.findall(r"__global__ .*?void (\w+)\(", source)}
    )


@pytest.mark.parametrize("expr", sorted(CASES))
def test_bias_and_relu_in_the_library_epilogue_match_pytorch(expr: str, tmp_path: Path) -> None:
    options, kernels = CASES[expr]
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    call = next(line for line in program.host_source.splitlines() if "_sgemm(1, 0" in line)
    if options is None:
        assert "bias=" not in call
    else:
        assert call.endswith(options), call
    assert _kernels(program.kernel_source) == kernels
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_tuning_can_keep_the_bias_in_a_generated_kernel() -> None:
    off = Tuning(default=KernelTuning(gemm_epilogue=False))
    _, program = generate_checked(_PROBLEM.format(expr="torch.relu(self.fc(x))"), off)
    call = next(line for line in program.host_source.splitlines() if "_sgemm(1, 0" in line)
    assert "bias=" not in call
    assert _kernels(program.kernel_source) == 1


@pytest.mark.parametrize("expr", sorted(CASES))
def test_the_plan_says_who_applies_the_bias(expr: str) -> None:
    """The plan's fusion text agrees with the program: cuBLASLt's epilogue where the GEMM call
    takes the bias, a following kernel where one is generated."""
    from stitch_graph.codegen import capture_program, plan_program
    from stitch_graph.task import load_task

    (item,) = plan_program(capture_program(load_task(_PROBLEM.format(expr=expr)))).items
    in_library = CASES[expr][0] is not None
    assert ("cuBLASLt's epilogue adds the bias" in item.fusion) == in_library
    assert ("one following kernel" in item.fusion) == (not in_library)
