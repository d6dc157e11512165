"""int32 tensors (``.int()``, ``.to(torch.int32)``, int32 inputs): cast, computed with and
counted like int64, and a mask's first set position found by ``argmax`` of its int cast, as a
sequence classifier finds its last real token. Each generated whole and checked against
PyTorch in the CPU emulation; ``argmax`` over other integers in an integer accumulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, n):
        return {expr}


def get_inputs():
    return [torch.randn(4, 6, 40), torch.randint(-50, 50, (4, 6, 40), dtype=torch.int32)]


def get_init_inputs():
    return []
"""

EXPRS = [
    # the last set position of a mask, as an index
    "x.gather(2, ((x > 0.5).int().argmax(-1, keepdim=True) - 1) % 40)",
    "x + (x < -1).long().argmin(-1, keepdim=True).float() + (x > 1).int().argmax(1, keepdim=True)",
    # int32 arithmetic, a count of int32 values, a float truncated to int32
    "x * (n % 7 + 1).float() + (n > 0).int().sum(-1, keepdim=True).float()",
    "(x * 10).to(torch.int32).float() + n.sum(-1, keepdim=True).float()",
]


@pytest.mark.parametrize("expr", EXPRS)
def test_int32_is_generated_and_matches_pytorch(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_argmax_over_wide_integers_is_exact(tmp_path: Path) -> None:
    """Integers past 2**24 would tie in the float accumulator: an int64 one takes them."""
    task, program = generate_checked(
        _PROBLEM.format(expr="x + n.argmax(-1, keepdim=True).float() - n.argmin(1, keepdim=True)")
    )
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "SgArgMaxI" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
