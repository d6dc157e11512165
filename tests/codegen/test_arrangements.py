"""Views and the ops written as views of their input: ``diagonal``, ``trace``, ``diag`` of a
matrix (and a vector's diagonal matrix, ``diag_embed``: a ``where`` of row and column numbers), ``F.unfold`` (im2col), ``kron``, ``meshgrid``, ``cartesian_prod`` and ``renorm``. Each
must be fully generated (nothing left to PyTorch) and match PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x, y):
        return {expr}


def get_inputs():
    return [torch.randn(3, 5, 6, 8), torch.randn(3, 5, 6, 8)]


def get_init_inputs():
    return []
"""

EXPRS = [
    "torch.diagonal(x, dim1=2, dim2=3)[..., 1:] + torch.diagonal(y, offset=1, dim1=-1, dim2=-2)",
    "torch.trace(x[0, 0]).reshape(1) + x.diagonal(0, 0, 1).sum()",
    "F.unfold(x, 3)",
    "F.unfold(torch.relu(x), (2, 3), dilation=(1, 2), padding=1, stride=(2, 1))",
    "torch.kron(x[0, 0, :4, :3], y[0, 0, :2, :5]) + 1",
    "torch.kron(x[0, :2], y[1, :3, :2])",
    "torch.meshgrid(x.flatten()[:4], y.flatten()[:5], indexing='ij')[0] + torch.meshgrid(x.flatten()[:4], y.flatten()[:5], indexing='ij')[1]",  # noqa: E501
    "torch.meshgrid(x.flatten()[:4], y.flatten()[:5], x.flatten()[7:10], indexing='xy')[2] * 2",
    "torch.cartesian_prod(x.flatten()[:4], y.flatten()[:3], y.flatten()[5:7])",
    "torch.renorm(x, 2, 1, 3.0) + torch.renorm(y, 1, 0, 20.0)",
    # a matrix's diagonal (a ranking loss's matching pairs), as a function and as methods
    "torch.diag(x[0, 0] @ y[0, 0].t()).view(-1, 1) + x[1, 1].diag(1).sum() + x[2, 2].trace()",
    # a vector's diagonal matrix, and a batch of them
    "torch.diag(x[0, 0, 0]) + 1 + torch.diag_embed(y[:, :, 0]).sum(0)[0]",
    "x[0, 0].sum(0).diag() @ y[0, 0, 0].diag_embed() + torch.diag_embed(x[1, 1])[2]",
]


@pytest.mark.parametrize("expr", EXPRS)
def test_the_arrangement_is_generated_and_matches_pytorch(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_an_exported_tensor_unfold_stays_a_view(tmp_path: Path) -> None:
    """``Tensor.unfold`` in an exported graph is ATen's ``unfold``, which shares F.unfold's name:
    it must stay the windows view, not become an im2col of the wrong arguments."""
    from stitch_graph.codegen import capture_program

    source = _PROBLEM.replace(
        "def forward(self, x, y):", "def forward(self, x, y, p=2):"
    ).format(expr="x.unfold(2, p, p).unfold(3, p, p).contiguous().sum((-1, -2)) * y[..., ::2, ::2]")
    task, program = generate_checked(source)
    assert capture_program(task).method == "export"  # forward's default argument forces it
    assert not program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
