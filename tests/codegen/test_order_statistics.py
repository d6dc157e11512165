"""Sorting and the order statistics read from it (``topk``, ``kthvalue``, ``median``,
``quantile``, ``msort``, ``argsort``): generated as one bitonic sort per line and matching
PyTorch's values and indices in the CPU emulation, NaN, infinities and signed zeros included.
``topk`` of lines too long to sort in a block is a radix select of the k-th key. ``median``'s
indices, and other lines too long for one block's shared memory, stay in PyTorch, declared."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen.tuning import KernelTuning, Tuning
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return {expr}


def get_inputs():
    x = torch.randn({shape})
    x.view(-1)[:4] = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0])
    x.view(-1)[40] = float("nan")
    return [x]


def get_init_inputs():
    return []
"""

EXPRS = [
    ("torch.sort(x, dim=-1)[0]", "3, 5, 37"),  # a line padded from 37 to 64 keys
    ("torch.sort(torch.relu(x) - 0.5, dim=1, descending=True).values * 2", "3, 5, 37"),
    ("x.sort(dim=0)[0] + torch.msort(x)", "6, 4, 9"),  # lines strided across the outer dim
    ("torch.topk(x, 5, dim=-1)[0] + torch.topk(x, 5, dim=-1, largest=False).values", "4, 3, 50"),
    ("torch.kthvalue(x, 7, dim=1)[0]", "4, 19, 6"),
    ("torch.median(x, dim=-1)[0] + torch.median(x, dim=1, keepdim=True).values.sum(-1)", "4, 9, 20"),  # noqa: E501
    ("torch.median(x) * torch.ones(3)", "4, 9, 20"),
    # a loop over a traced size sends the capture to torch.export, whose graph picks the
    # unused indices of the pair too
    ("torch.median(x, dim=1).values + sum(x[:, i] for i in range(x.shape[1]))", "4, 9, 20"),
    ("torch.quantile(x, 0.3, dim=-1, keepdim=True) + torch.quantile(x, 1.0, dim=-1, keepdim=True)", "5, 2, 33"),  # noqa: E501
    ("torch.quantile(x.flatten(1), 0.75, dim=1)", "6, 3, 2000"),  # 6000 keys: 8192 padded
    # ties (the two zeros) in the order a stable sort keeps; an unstable one may swap them
    ("torch.argsort(x, dim=-1, stable=True).float() + torch.sort(x, dim=0, descending=True)[1].float()", "3, 5, 37"),  # noqa: E501
    ("torch.topk(x, 4, dim=1).indices.float() * torch.topk(x, 4, dim=1).values", "4, 19, 6"),  # noqa: E501
    ("torch.kthvalue(x, 5, dim=-1, keepdim=True)[1].float()", "4, 3, 50"),
    ("torch.argsort(x.flatten(1), dim=1, descending=True, stable=True).float()", "6, 3, 1300"),  # noqa: E501
    # ranks: the positions of a sort sorted again (distinct, exact as floats)
    ("x * x.argsort(dim=-1).argsort(dim=-1) + x.argsort(dim=1).argsort(dim=1).float()", "3, 5, 40"),  # noqa: E501
]


@pytest.mark.parametrize(("expr", "shape"), EXPRS)
def test_the_order_statistic_is_generated_and_matches_pytorch(
    expr: str, shape: str, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr, shape=shape))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "bitonic" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


WIDE_TOPK = [
    # a sampler's top-k filter over a vocabulary: the k-th value of 32000, a prologue fused
    ("torch.softmax(x.masked_fill(x < torch.topk(x / 0.8, 50, dim=-1)[0][:, [-1]] * 0.8, -float('inf')), -1)", "4, 32000"),  # noqa: E501
    # values and positions (positions above 4096 keys): NaN and infinities rank as in PyTorch
    ("torch.topk(x, 7, dim=1)[0] * 2 + torch.topk(x, 7, dim=1)[1].float()", "4, 9000"),
    ("torch.topk(x, 5, dim=0, largest=False)[0] - 1", "9000, 3"),  # strided lines, the smallest
    ("torch.topk(torch.relu(x).round(), 40, dim=-1)[0]", "3, 10000"),  # thousands of ties
    ("torch.topk(x.reshape(2, -1), 2048, dim=1).values.sum(1)", "2, 5, 1700"),  # the most k
    ("torch.topk(x, 1, dim=-1).indices + 1", "3, 70000"),  # a line of 17 position bits
    ("torch.topk(x, 5, dim=-1)[1].float() + 1", "1, 4097"),  # a last chunk shorter than k
]


@pytest.mark.parametrize(("expr", "shape"), WIDE_TOPK)
def test_topk_of_a_long_line_is_a_radix_select_and_matches_pytorch(
    expr: str, shape: str, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(expr=expr, shape=shape))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "radix select" in program.kernel_source
    assert "bitonic" not in program.kernel_source  # the line itself is never sorted
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_few_long_lines_are_cut_into_chunks_of_a_block_each(tmp_path: Path) -> None:
    # 8 lines of 672,000 held 8 SMs of 132 (a detector's top 300 of its class scores: 0.14x
    # torch.compile on an H100)
    source = _PROBLEM.format(expr="torch.topk(x, 30, dim=-1)[1].float() * 2", shape="2, 20000")
    task, split = generate_checked(source)
    assert split.kernel_source.count("radix select") == 1 and "first stage" in split.kernel_source
    assert "_ws_k0" in split.host_source
    check_on_cpu(task, split, tmp_path, cooperative=True)
    task, whole = generate_checked(source, Tuning(default=KernelTuning(split_reduction=False)))
    assert "first stage" not in whole.kernel_source
    (tmp_path / "whole").mkdir()
    check_on_cpu(task, whole, tmp_path / "whole", cooperative=True)


@pytest.mark.parametrize(
    ("expr", "left"),
    [
        ("torch.median(x, dim=-1)[1].float()", "median"),  # its indices
        ("torch.topk(x, 3, dim=-1, sorted=False)[0]", "topk"),  # an order PyTorch leaves open
        ("torch.sort(x.flatten(), dim=0)[0]", "sort"),  # 12000 keys: more than a block holds
        ("torch.argsort(x.reshape(2, 6000), dim=1).float() * 2", "argsort"),  # 6000 with positions
        ("torch.topk(x.flatten(), 3000)[0]", "topk"),  # k over MAX_TOPK
        # a sort's positions sorted for their values: int64 values, which the sort does not keep
        ("torch.sort(x.argsort(dim=-1), dim=-1)[0].float()", "sort"),
    ],
)
def test_what_the_sort_cannot_reproduce_stays_in_pytorch(expr: str, left: str) -> None:
    _, program = generate_checked(_PROBLEM.format(expr=expr, shape="4, 3, 1000"))
    assert left in program.declared_torch_ops
