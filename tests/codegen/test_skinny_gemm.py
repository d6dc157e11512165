"""The generated GEMM for a few rows (``gemm_kernel``): a warp per output column, the epilogue
fused, run in the cooperative CPU emulation (warp shuffles keep their meaning) against PyTorch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import KernelTuning, Tuning, capture_program, emit_candidate, plan_program
from stitch_graph.codegen.space import tuning_space
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_LINEAR = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear({k}, 72)

    def forward(self, x):
        return torch.tanh(self.fc(x)) * 2.0 - 0.5

def get_inputs():
    return [torch.randn({rows}, {k})]

def get_init_inputs():
    return []
"""

# an RNN cell loop: each step's GEMM reads a concatenation and writes into a stack
_STEPS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(24 + 16, 16)
        self.h2o = nn.Linear(16, 8)

    def forward(self, x, h):
        outputs = []
        for t in range(x.shape[0]):
            h = torch.tanh(self.i2h(torch.cat((x[t], h), dim=1)))
            outputs.append(self.h2o(h))
        return torch.stack(outputs, dim=0)

def get_inputs():
    return [torch.randn(3, 5, 24), torch.randn(5, 16)]

def get_init_inputs():
    return []
"""


def _skinny(source: str) -> tuple[object, object]:
    task = load_task(source)
    plan = plan_program(capture_program(task))
    gemms = [i.id for i in plan.items if i.kind == "gemm"]
    assert gemms
    tuning = Tuning(kernels={g: KernelTuning(gemm_kernel=True) for g in gemms})
    return generate_checked(source, tuning)


@pytest.mark.parametrize("k", [256, 130])  # the float4 loop and the scalar one
def test_a_few_rows_get_one_fused_kernel_and_match_pytorch(k: int, tmp_path: Path) -> None:
    task, program = _skinny(_LINEAR.format(k=k, rows=6))
    forward = program.host_source.split("def forward")[1]
    assert "_sgemm(" not in forward  # no library call, and no separate epilogue kernel
    assert forward.count("KERNELS.") == 1
    assert "__shfl_xor_sync" in program.kernel_source
    assert ("float4" in program.kernel_source) == (k % 4 == 0)
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_steps_read_a_concatenation_and_store_into_a_stack(tmp_path: Path) -> None:
    task, program = _skinny(_STEPS)
    assert "_sgemm(" not in program.host_source.split("def forward")[1]
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_more_rows_than_registers_hold_leave_the_item_to_pytorch_and_say_why() -> None:
    """The tuner skips a setting that leaves more to PyTorch, so this one is never timed."""
    ir = capture_program(load_task(_LINEAR.format(k=64, rows=17)))
    plan = plan_program(ir)
    tuning = Tuning(kernels={plan.items[0].id: KernelTuning(gemm_kernel=True)})
    program = emit_candidate(ir, plan, tuning=tuning)
    assert "linear" in program.declared_torch_ops
    assert "takes at most 16 rows" in program.notes
    assert tuning_space("gemm")[1].gemm_kernel  # timed first, where it applies
