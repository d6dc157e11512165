"""Host code for what stays in PyTorch, and the ``torch.export`` path's spellings.
Assignments with tensor indices are written on a copy: ``y = x.clone(); y[rows, cols] = 0``
leaves ``x`` (the caller's input) as it was, and a full slice before the index
(``y[:, :, cols] = 0``), which ``Tensor.index_put_`` refuses, is basic indexing; any other
in-place call left to PyTorch writes a copy too. On the export path, matrix transposes as
properties (``w.mT``, ``w.T``) are views, not calls, a gather by two index tensors is
generated, and index factories (``tril_indices``) are baked. Each run on the CPU against
PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, load_on_cpu

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("rows", torch.tensor([0, 3, 5]))
        self.register_buffer("cols", torch.tensor([1, 2, 7]))
        self.weight = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        {body}


def get_inputs():
    return [torch.randn(4, 6, 8)]


def get_init_inputs():
    return []
"""

BODIES = [
    """y = x.clone()
        y[:, self.rows, self.cols] = 0.0
        return y * 2.0 + x""",
    """y = x.clone()
        y[:, :, self.cols] = 1.0
        return y - x""",
    # any in-place call left to PyTorch writes a copy: the clone before it is an alias
    """y = x.clone()
        y.masked_scatter_(x > 0, torch.ones_like(x) * 3.0)
        return y * 2.0 + x""",
    # a loop over a traced size sends the capture to torch.export
    """acc = x[:, 0]
        for t in range(1, x.shape[1]):
            acc = acc + x[:, t]
        return acc @ self.weight.mT + acc @ self.weight.T""",
]


@pytest.mark.parametrize("body", BODIES)
def test_the_program_matches_and_leaves_its_input(body: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert ".mT()" not in program.host_source and ".T()" not in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
    again = tmp_path / "again"
    again.mkdir()
    _, host, _ = load_on_cpu(task, program, again, cooperative=True)
    model = host["ModelNew"]()
    x = torch.randn(4, 6, 8)
    before = x.clone()
    model(x)
    assert torch.equal(x, before)


def test_an_exported_gather_by_two_index_tensors_is_generated(tmp_path: Path) -> None:
    body = """acc = x[:, 0]
        for t in range(1, x.shape[1]):
            acc = acc + x[:, t]
        return x[:, self.rows, self.cols] * acc[:, :3]"""
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_exported_index_factories_are_baked(tmp_path: Path) -> None:
    body = """r, c = torch.tril_indices(6, 8)
        acc = x[:, 0]
        for t in range(1, x.shape[1]):
            acc = acc + x[:, t]
        return x[:, r, c] * acc[:, :1]"""
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_views_left_to_pytorch_are_written_as_subscripts(tmp_path: Path) -> None:
    body = """d = (x[:, 1:, ::2] - x[:, :-1, ::2]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean()
        return x[1:3] * d"""
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert "operator" not in program.host_source
    assert "x[:, 1:, ::2]" in program.host_source and "x[..., 1:]" in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
