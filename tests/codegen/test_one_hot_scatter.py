"""A one-hot written by scattering one number into a constant (``zeros.scatter_(1, idx, 1.0)``)
is a comparison, computed on load by the loss that reads it; a scatter that leaves some lines
of its tensor as they were stays a scatter. Both checked against PyTorch in the CPU emulation."""

from __future__ import annotations

import re
from pathlib import Path

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, planned_kernels

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, logits, labels):
        {body}


def get_inputs():
    return [torch.randn(8, 10), torch.randint(0, 10, (8,))]


def get_init_inputs():
    return []
"""


def _kernels(program: object) -> list[str]:
    return re.findall(r"void (\w+)\(", program.kernel_source)  # type: ignore[attr-defined]


def test_a_one_hot_by_scatter_is_computed_on_load(tmp_path: Path) -> None:
    body = (
        "hot = torch.zeros_like(logits).scatter_(1, labels.unsqueeze(1), 0.9) + 0.01\n"
        "        return (hot * logits.log_softmax(-1)).sum(-1)"
    )
    source = _PROBLEM.format(body=body)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert planned_kernels(source) == 1  # the row's log-sum-exp, then the weighted sum: two stages
    assert not any("scatter" in k for k in _kernels(program))
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_scatter_into_some_lines_stays_a_scatter(tmp_path: Path) -> None:
    body = (
        "hot = torch.full_like(logits, 2.0).scatter_(1, labels[:4, None], 1.0)\n"
        "        return hot * logits"
    )
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert any("scatter" in k for k in _kernels(program))
    check_on_cpu(task, program, tmp_path, cooperative=True)
