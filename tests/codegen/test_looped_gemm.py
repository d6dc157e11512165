"""Batched products whose operands' batches are not one stride apart (attention's heads split
from one projection) loop over one batch dim instead of copying the operands first."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import _capture_passes, capture_program
from stitch_graph.codegen.ir import looped_batch_dim
from stitch_graph.codegen.tuning import KernelTuning, Tuning
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_ATTENTION = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(24, 72)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, 3, 8).transpose(1, 2)
        k = k.view(b, t, 3, 8).transpose(1, 2)
        v = v.view(b, t, 3, 8).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) * 0.35, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, c)


def get_inputs():
    return [torch.randn(5, 7, 24)]


def get_init_inputs():
    return []
"""


# the attention as its GEMMs and softmax (a causal one is one kernel by default)
_THREE_KERNELS = Tuning(default=KernelTuning(fused_attention=False))


def test_heads_split_from_one_projection_loop_over_the_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_capture_passes, "_LOOPED_FLOPS", 0)  # these products are small
    task, program = generate_checked(_ATTENTION, _THREE_KERNELS)
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert program.host_source.count("for _i in range(3):") == 2
    assert "matmul_input" not in program.host_source  # q, k and v are read as they lie
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_small_operands_are_copied_as_before(tmp_path: Path) -> None:
    task, program = generate_checked(_ATTENTION)
    assert "for _i in range(" not in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_the_loop_takes_the_shortest_dim_that_leaves_one_stride() -> None:
    # q of (B, H, T, D) = (4, 3, 7, 8) viewed from (B, T, 3 * 3 * 8): batches 168 * 3 and 8 apart
    q = ((4, 3, 7, 8), (504, 8, 72, 1))
    out = ((4, 3, 7, 7), (147, 49, 7, 1))
    assert looped_batch_dim((4, 3), [q, out]) == 1  # H: each call batches B, 504 apart
    assert looped_batch_dim((4, 3), [out, out]) == 1  # one stride either way: the shorter
    torn = ((4, 3, 7, 8), (504, 8, 16, 2))  # matrices neither row- nor column-major
    assert looped_batch_dim((4, 3), [torn, out]) is None
    assert looped_batch_dim((40, 30), [q, out]) is None  # over GEMM_LOOP_MOST calls


_RELU_ATTENTION = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear({c}, {c3})
        self.register_buffer("bias", torch.tril(torch.ones({t}, {t})).view(1, 1, {t}, {t}))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        k = k.view(b, t, {h}, c // {h}).transpose(1, 2)
        q = q.view(b, t, {h}, c // {h}).transpose(1, 2)
        v = v.view(b, t, {h}, c // {h}).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * 0.35
        att = torch.relu(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")))
        return (att @ v).transpose(1, 2).contiguous().view(b, t, c)


def get_inputs():
    return [torch.randn({b}, {t}, {c})]


def get_init_inputs():
    return []
"""


def test_a_scaled_product_of_split_heads_keeps_its_scale_off_the_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KernelBench L3 50's shape: the scale of q @ k.T has no tensor to move onto through the
    views of a split (the pieces' tuple), and the products loop over the heads."""
    monkeypatch.setattr(_capture_passes, "_LOOPED_FLOPS", 0)  # every product loops
    sizes = {"b": 16, "t": 1024, "c": 768, "c3": 2304, "h": 12}  # L3 50's: captured on meta
    big = capture_program(load_task(_RELU_ATTENTION.format(**sizes)))
    split = next(n.name for n in big.nodes if n.op == "split")
    assert {big.node(u).op for u in big.users()[split]} == {"getitem"}
    small = {"b": 5, "t": 7, "c": 24, "c3": 72, "h": 3}
    task, program = generate_checked(_RELU_ATTENTION.format(**small), _THREE_KERNELS)
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert program.host_source.count("for _i in range(3):") == 2
    check_on_cpu(task, program, tmp_path, cooperative=True)
