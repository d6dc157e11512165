"""Integer arithmetic is exact: a hash of token ids (``ids * 1000003 % buckets``), Python's
floor division and remainder of negative integers, ``abs``, ``clamp`` and ``maximum`` of int64
and int32 values, ``fmod``, rounding, ``fmax``, integer powers and bits, cumulative sums of
integers and booleans, each past float32's 2**24, and integer grids (``meshgrid``,
``cartesian_prod``), generated and compared with PyTorch in the CPU emulation (float32
arithmetic would be thousands off)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, a, b, n):
        return {expr}


def get_inputs():
    return [
        torch.randint(-50000, 50000, (3, 64)),
        torch.randint(1, 50000, (3, 64)),
        torch.randint(-40000, 40000, (3, 64), dtype=torch.int32),
    ]


def get_init_inputs():
    return []
"""

EXPRS = [
    "(a * 1000003 + b) % 100003",
    "(a * 1000003 - b) // 7 + (a * 1000003) % -9",
    "(a * 4099 - b * 8191).abs().clamp(max=150000000) + torch.maximum(a * 3001, n.long() * 5003)",
    "(n * 50021) // 13 + (n * 50021) % 11",
    # scans of integers and booleans: int64 sums, position ids from a mask
    "(a * 1000).cumsum(-1) + (a > 0).cumsum(1) - 1",
    # integer coordinates from meshgrid and cartesian_prod
    "torch.meshgrid(a[0], b[1], indexing='ij')[0] * 3 + torch.meshgrid(a[1], b[2], indexing='xy')[1]",
    "torch.cartesian_prod(a[0, :8], b[1, :5]).sum(-1)",
    # fmod, rounding, fmax and powers of integers: integers, not float32 values
    "torch.fmod(a * 1000003, 7) + torch.floor(a * 4099) - torch.trunc(b * 8191) + torch.round(n * 3)",
    # bits: masks, shifts past the width (0 to the left, the sign to the right), int32 too
    "((a * 1000003) & 0xFFFF) | (b << 3) ^ (~n).long() + (a * 4099 >> (b % 70)) + ((n << (b % 40).int()) >> 2)",  # noqa: E501
    "torch.fmax(a * 3001, b * 4001) - torch.fmin(n * 50021, a) + torch.pow(b % 600, 3) + torch.pow(n % 9, b % 5)",
]


@pytest.mark.parametrize("expr", EXPRS)
def test_integers_are_computed_exactly(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True, rtol=0, atol=0)


# integers meeting float results: a true division of two int64 tensors, and int64 values compared
# with or clamped by floats, which C would divide as integers or find ambiguous
MIXED = [
    "a / b + n / 7",
    "torch.maximum(a, b * 1.5 - 4e4) + torch.clamp(n, -2.5e4, 3.5e4)",
    "torch.where(a > 0, a, b) / 3 + (a - b).float() * 0.5",
]


@pytest.mark.parametrize("expr", MIXED)
def test_integers_promote_to_float_as_pytorch_does(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
