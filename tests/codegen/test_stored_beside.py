"""A pointwise result that later kernels read too (or the program returns) is stored by the
kernel of its same-shape pointwise reader, beside that kernel's own result: an optimizer step's
new moments and new parameter come out of one pass over the four tensors, and a recurrent
loop's state is stored by the kernel that computes the step's output from it. Each checked
against PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, planned_kernels

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, p, g, m, v):
        {body}


def get_inputs():
    return [torch.randn(4, 64), torch.randn(4, 64), torch.randn(4, 64), torch.rand(4, 64)]


def get_init_inputs():
    return []
"""

_ADAM = """m = m * 0.9 + g * 0.1
        v = v * 0.999 + g * g * 0.001
        p = p - 0.01 * m / (v.sqrt() + 1e-8)
        return p, m, v"""

_LOOP = """h = torch.zeros_like(p[:, :16])
        outs = []
        for t in range(4):
            h = torch.tanh(p[:, t * 16:(t + 1) * 16] * 0.5 + h * g[:, :16])
            outs.append(h * 2.0)
        return torch.stack(outs, 1).sum(-1) + h.sum(-1, keepdim=True)"""


def test_an_optimizer_step_is_one_kernel(tmp_path: Path) -> None:
    source = _PROBLEM.format(body=_ADAM)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert planned_kernels(source) == 1
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_recurrent_state_is_stored_beside_the_step_output(tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=_LOOP))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "out0[i] = " in program.kernel_source  # the state, stored beside the output
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_mask_is_stored_beside_a_float_result(tmp_path: Path) -> None:
    body = "k = p > 0\n        y = torch.where(k, p * g, m)\n        return y, k"
    source = _PROBLEM.format(body=body)
    task, program = generate_checked(source)
    assert planned_kernels(source) == 1
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_results_read_only_by_one_reduction_are_computed_on_its_load(tmp_path: Path) -> None:
    # 1 - p_t is read by the focal term and by the poly term: the kernel that would store it
    # beside the focal term folds into the sum, which reads neither from memory
    body = """q = torch.sigmoid(p)
        pt = q * m + (1 - q) * (1 - m)
        focal = (g - m) * (1 - pt) ** 2
        return (focal + 0.5 * (1 - pt) ** 3).sum() / m.sum().clamp_min(1.0)"""
    source = _PROBLEM.format(body=body)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert planned_kernels(source) == 1
    check_on_cpu(task, program, tmp_path, cooperative=True)
