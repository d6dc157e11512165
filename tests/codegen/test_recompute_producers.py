"""A cheap pointwise value of stored tensors that several kernels read is computed by each of
them instead of stored, where the scheduler's estimate falls: fewer kernels, the same values
(checked in the CPU emulation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program, plan_program
from tests.codegen.cpu_emulation import (
    check_on_cpu,
    check_rewrite_saves_kernels,
    generate_checked,
    planned_kernels,
)

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 64, 3)

    def forward(self, x, t):
        {body}


def get_inputs():
    return [torch.randn(64, 48), torch.randint(0, 3, (64,))]


def get_init_inputs():
    return []
"""

CASES = [
    # the mask of counted targets, read by the logsumexp's pass and by the count (a plain
    # cross entropy reaches its three kernels through _capture_views' reshape rewrite already)
    "return F.cross_entropy(x, t, label_smoothing=0.1)",
    # pairwise displacements wrapped into a periodic box (a chain reading one value twice),
    # read by the distance's sum and by the force's: each sum computes them as it loads
    "d = x[:, None, :8] - x[None, :, :8]\n        d = d - 2.0 * torch.round(d / 2.0)\n        "
    "r = (d * d).sum(-1, keepdim=True) + 0.1\n        return (d * r.pow(-1.5)).sum(1)",
]


@pytest.mark.parametrize("body", CASES)
def test_a_cheap_value_read_by_several_kernels_is_computed_by_each(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_rewrite_saves_kernels(_PROBLEM.format(body=body), tmp_path, monkeypatch, "recompute_cheap_producers")


def test_a_convolutions_relu_read_twice_is_computed_by_the_kernel_that_reads_it() -> None:
    """A hard-swish of a convolution's ReLU (KernelBench L2 57's shapes): the ReLU, read by
    the product and by the clamp, was the epilogue kernel's result after the convolution; each
    reader computing it leaves the convolution alone and one kernel after it, a pass fewer."""
    from stitch_graph.task import load_task

    body = """r = torch.relu(self.conv(x))
        return r * torch.clamp(r + 3, 0, 6) / 6"""
    source = _PROBLEM.format(body=body).replace(
        "torch.randn(64, 48)", "torch.randn(128, 8, 128, 128)"
    )
    items = plan_program(capture_program(load_task(source))).items
    assert [item.ops for item in items if item.kind == "conv"] == [["conv2d"]], items


_MASKED_MEAN = """
import torch


class Model(torch.nn.Module):
    def forward(self, hidden, lengths):
        mask = torch.arange(hidden.size(1), device=hidden.device)[None, :] < lengths[:, None]
        mask = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def get_inputs():
    return [torch.randn(8, 32, 16), torch.randint(1, 33, (8,))]


def get_init_inputs():
    return []
"""


def test_a_padding_mask_of_two_ops_is_computed_by_each_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A padding mask is a chain (positions compared with lengths, then cast to float) read by
    the masked sum and by the count: each computes the whole chain as it loads, and the kernel
    that stored the mask goes; copying one op only would not remove it."""
    from stitch_graph.codegen import _capture_recompute

    chained = planned_kernels(_MASKED_MEAN)
    with monkeypatch.context() as patched:
        patched.setattr(_capture_recompute, "_LONGEST_CHAIN", 1)
        assert chained < planned_kernels(_MASKED_MEAN)
    check_rewrite_saves_kernels(_MASKED_MEAN, tmp_path, monkeypatch, "recompute_cheap_producers")


def test_copies_of_chains_that_share_a_member_take_names_of_their_own(tmp_path: Path) -> None:
    # the chain (sub) copied for one reader, then (sub, exp) for another: two copies of sub
    body = (
        "lp = x - torch.logsumexp(x, dim=1, keepdim=True)\n        p = lp.exp()\n"
        "        return (p * x.flip(1)).sum(dim=1), (p * lp).sum(dim=1)"
    )
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
