"""Scatters: ``scatter_add``, ``index_add`` (repeated indices, ``alpha``), ``scatter`` of a
value or a tensor (float or bool) and ``scatter_reduce`` by sum, amax or amin, as a copy of the
input and a thread per source element; each fully generated and matching PyTorch in the CPU
emulation, ``include_self=False`` too (the reached positions start from the reduction's
identity). Indices may be int64 or int32. A scatter's ``reduce`` argument, ``scatter_reduce``'s
mean and ``include_self=False`` on integers stay in PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked, planned_kernels

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, y):
        return {expr}


def get_inputs():
    return [torch.randn(3, 5, 6, 8), torch.randn(3, 5, 6, 8)]


def get_init_inputs():
    return []
"""
_INDEX = "(y.abs() * 5).long().clamp(max=7)"

EXPRS = [
    f"x.scatter_add(3, {_INDEX}, torch.relu(y)) * 2",  # repeated indices add up
    f"torch.scatter_add(x, 1, {_INDEX}.clamp(max=4)[:, :3, :4], y)",  # an index smaller than src
    "x.index_add(3, torch.tensor([0, 5, 5]), y[..., :3], alpha=0.5) + 1",
    "x.index_add(0, torch.tensor([2, 0]), y[:2])",
    f"x.scatter(2, {_INDEX}.clamp(max=5), 1.5) + x.scatter(3, {_INDEX}, value=-2.0)",
    # unique indices along the dim (a permutation, topk's): every order of stores agrees
    "torch.zeros_like(x).scatter(3, y.argsort(dim=3), x) - 1",
    "torch.zeros_like(x).scatter(-1, y.topk(3, dim=-1)[1], y.topk(3, dim=-1)[0].softmax(-1))",
    # repeated indices whose values agree: a gather, changed, and scattered back
    f"x.scatter(3, {_INDEX}, x.gather(3, {_INDEX}) * 2)",
    # a bool mask scattered, and a bool value
    "x.masked_fill((x > 0).scatter(1, y.argsort(dim=1), y > 0.5), 0.0)",
    f"x.masked_fill((x > 0).scatter(3, {_INDEX}, False), -1.0)",
    # scatter_reduce: repeated indices meet by sum, amax and amin (a voxel's max of its points)
    f"x.scatter_reduce(3, {_INDEX}, y, 'amax')"
    f" + x.scatter_reduce(1, {_INDEX}.clamp(max=4)[:, :3], y, 'amin')",
    f"torch.zeros_like(x).scatter_reduce(3, {_INDEX}, torch.relu(y), reduce='sum')",
    # without the input: reached positions reduce the sources alone, the rest keep the input
    f"x.scatter_reduce(3, {_INDEX}.clamp(max=3), y, 'amax', include_self=False)",
    f"x.scatter_reduce(3, {_INDEX}.clamp(max=3), y, 'amin', include_self=False)"
    f" + x.scatter_reduce(3, {_INDEX}.clamp(max=3), y, 'sum', include_self=False)",
    f"x.scatter_add(3, {_INDEX}.int(), y)",  # int32 indices
    "x.index_add(0, torch.tensor([2, 0], dtype=torch.int32), y[:2])",
]


@pytest.mark.parametrize("expr", EXPRS)
def test_the_scatter_is_generated_and_matches_pytorch(expr: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "_copy(" in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(
    "expr", [
        f"x.scatter(3, {_INDEX}, y, reduce='add')",
        f"x.scatter_reduce(3, {_INDEX}, y, 'mean')",
        f"(x > 0).long().scatter_reduce(3, {_INDEX}, (y > 0).long(), 'amax', include_self=False)",
    ]
)
def test_a_scatter_it_cannot_reproduce_stays_in_pytorch(expr: str) -> None:
    _, program = generate_checked(_PROBLEM.format(expr=expr))
    assert {"scatter", "scatter_add", "scatter_reduce"} & set(program.declared_torch_ops)


@pytest.mark.parametrize(("expr", "kernels"), [
    (f"torch.zeros_like(x).scatter_add(3, {_INDEX}, torch.relu(y) * 2)", 2),  # and the index's
    ("torch.zeros_like(x).index_add(0, torch.tensor([2, 0, 2]), torch.sigmoid(y[:3]) * 3)", 1),
])
def test_the_scatter_computes_its_zeros_and_its_source(
    expr: str, kernels: int, tmp_path: Path
) -> None:
    """The zeros a scatter starts from are written by the kernel that would copy them, and a
    source computed element by element (messages gathered and weighted) by the scattering
    kernel, instead of each by a kernel of its own and read back."""
    source = _PROBLEM.format(expr=expr)
    task, program = generate_checked(source)
    assert planned_kernels(source) == kernels
    check_on_cpu(task, program, tmp_path, cooperative=True)


_READOUT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)

    def forward(self, ids, graph):
        h = self.embed(ids)
        sums = torch.zeros(7, 16, dtype=h.dtype, device=h.device)
        sums.index_add_(0, graph, h)
        return sums * 2.0


def get_inputs():
    return [torch.randint(0, 50, (40,), dtype=torch.int32), torch.randint(0, 7, (40,), dtype=torch.int32)]


def get_init_inputs():
    return []
"""


def test_an_in_place_readout_into_fresh_zeros_with_int32_indices(tmp_path: Path) -> None:
    """``zeros.index_add_(...)`` whose result goes unused was taken for a buffer's update and
    dropped (the read after it was refused), and int32 token and graph ids left the embedding
    and the index_add to PyTorch."""
    task, program = generate_checked(_READOUT)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
