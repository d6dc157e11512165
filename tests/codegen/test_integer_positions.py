"""Where a sequence ends, as CLIP finds it: ``text.argmax(-1)`` over int64 token ids picks the
row of the end-of-text token, and the causal mask is a plain tensor attribute moved with
``.to(dtype=x.dtype, device=x.device)``. Both must be generated and match PyTorch."""

from __future__ import annotations

from pathlib import Path

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

# ids past 2**24, where neighbours round to one float32: a float accumulator would tie them
_POSITIONS = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, ids):
        last = ids.argmax(dim=-1)
        first = ids.argmin(dim=-1)
        rows = torch.arange(x.shape[0])
        return x[rows, last] * 2.0 + x[rows, first]


def get_inputs():
    ids = torch.randint(0, 6, (4, 37)) + 2 ** 25
    ids[1] = 2 ** 25 + 3  # a row of ties: the first position wins
    return [torch.randn(4, 37, 16), ids]


def get_init_inputs():
    return []
"""

_MOVED_MASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4)
        mask = torch.empty(12, 12).fill_(float("-inf")).triu_(1)
        self.attn_mask = mask  # a plain attribute, as CLIP keeps it

    def forward(self, x):
        mask = self.attn_mask.to(dtype=x.dtype, device=x.device)
        return self.attn(x, x, x, need_weights=False, attn_mask=mask)[0]


def get_inputs():
    return [torch.randn(12, 3, 32)]


def get_init_inputs():
    return []
"""


def test_argmax_and_argmin_of_large_integer_ids_are_exact(tmp_path: Path) -> None:
    task, program = generate_checked(_POSITIONS)
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "SgArgMaxI" in program.kernel_source and "SgArgMinI" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_constant_moved_to_the_inputs_device_and_dtype_is_captured(tmp_path: Path) -> None:
    task, program = generate_checked(_MOVED_MASK)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
