"""Slices of a concatenation read from its operands (``_capture_narrow_cat``): ``torch.diff``
with ``append`` or ``prepend``, a shift written as a concatenation and a slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_rewrite_saves_kernels

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, u, v):
        return {expr}


def get_inputs():
    return [torch.randn(2, 3, 40, 36), torch.randn(2, 3, 40, 36)]


def get_init_inputs():
    return []
"""

EXPRS = [
    # a periodic forward difference along each spatial dim
    "torch.diff(u, dim=-1, append=u[..., :1]) * v + torch.diff(u, dim=-2, append=u[..., :1, :])",
    "torch.diff(u, dim=-1, prepend=u[..., -2:]) * torch.cat([v, v[..., :1]], dim=-1)",  # two prepended
    "torch.cat([u, v], dim=-1)[..., 20:56] * 2.0 + torch.cat([u, v], dim=-1)[..., :36]",  # across
    "torch.narrow(torch.cat([v, u.exp(), v], dim=2), 2, 30, 60).sum(dim=2)",  # a computed operand
]


@pytest.mark.parametrize("expr", EXPRS)
def test_a_slice_of_a_concatenation_reads_its_operands(
    expr: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _PROBLEM.format(expr=expr)
    check_rewrite_saves_kernels(source, tmp_path, monkeypatch, "narrows_from_operands")
