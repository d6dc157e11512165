"""Operands constant along a row are indexed from the row alone in row kernels.

``logsumexp(x / tau)`` with a per-channel ``tau`` read ``tau[(i / 1024) % 512]`` for every
element, an integer division and a load nvcc cannot hoist; from ``r`` the load is the same for
the whole row. Checked on the index arithmetic and on the CPU emulation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import schedule
from stitch_graph.codegen._emit_base import _row_offset
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked


@pytest.mark.parametrize(
    ("shape", "strides", "space", "length", "expected"),
    [
        ((512, 1), (1, 1), (64, 512, 1024), 1024, "(r % 512)"),  # a per-channel operand
        ((64, 512, 1), (512, 1, 1), (64, 512, 1024), 1024, "r"),  # a keepdim row statistic
        ((1,), (1,), (64, 512, 1024), 1024, "0"),  # a scalar tensor
        ((8, 1, 1), (1, 1, 1), (64, 8, 16, 16), 256, "(r % 8)"),  # two trailing dims
        ((1024,), (1,), (64, 512, 1024), 1024, None),  # varies along the row
        ((64, 1, 16), (16, 16, 1), (64, 8, 16, 16), 256, None),
        ((512, 1), (1, 1), (64, 512, 1024), 1000, None),  # no trailing dims hold the row
    ],
)
def test_row_offset(
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    space: tuple[int, ...],
    length: int,
    expected: str | None,
) -> None:
    assert _row_offset(shape, strides, space, length) == expected


_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_tau = nn.Parameter(torch.randn(6, 1) * 0.1)
        self.gain = nn.Parameter(torch.randn(6))

    def forward(self, x):
        tau = torch.exp(self.log_tau)
        {body}


def get_inputs():
    return [torch.randn(3, 6, 40)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    "body",
    [
        "return torch.logsumexp(x / tau, dim=-1) * tau.squeeze(-1)",
        "return torch.softmax(x * tau, dim=-1)",
        "return x - (x * tau).mean(-1, keepdim=True)",
    ],
    ids=["logsumexp", "softmax", "broadcast_back"],
)
def test_per_row_operands_load_from_the_row(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule, "_BROADCAST_BACK_ROWS", 1)  # fuse at the CPU's small sizes
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert "% 6)]" in program.kernel_source  # tau[(r % 6)], not tau[((i / 40) % 6)]
    assert "/ 40) % 6)" not in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


_EMBEDDING = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(50, 40)
        self.norm = nn.LayerNorm(40)

    def forward(self, ids):
        return self.norm(self.tokens(ids))


def get_inputs():
    return [torch.randint(0, 50, (3, 5))]


def get_init_inputs():
    return []
"""


def test_a_gathered_row_reads_its_index_once_per_row(tmp_path: Path) -> None:
    """The embedding's token id is a coordinate outside the row: taken from ``r``."""
    task, program = generate_checked(_EMBEDDING)
    assert "layer_norm" in program.kernel_source
    assert "a0[(int)((r / 5) % 3) * 5 + (int)((r) % 5)" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
