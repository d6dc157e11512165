"""A pointwise value read through views is computed in the view's shape, its operands viewed
instead, where the scheduler's estimate falls: the view no longer separates it from its reader,
so the two fuse (fewer kernels), and the values stay the same (checked in the CPU emulation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import _capture_lower, capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import (
    check_on_cpu,
    check_rewrite_saves_kernels,
    generate_checked,
    planned_kernels,
)

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, n):
        {body}


def get_inputs():
    return [torch.randn(16, 96, 64), torch.randint(1, 97, (16,))]


def get_init_inputs():
    return []
"""

CASES = [
    # a padding mask built from lengths, viewed, then converted: two kernels were one apart
    """mask = (torch.arange(x.size(1), device=x.device)[None, :] < n[:, None]).unsqueeze(-1)
        w = mask.float()
        return (x * w).sum(1) / w.sum(1).clamp(min=1.0)""",
    # a gate computed in one layout and read transposed by the product
    """g = torch.sigmoid(x[:, :, :32])
        return (g.transpose(1, 2) * x[:, :, 32:].transpose(1, 2)).sum(-1)""",
    # chained views (an unsqueeze, then an expand) move as one
    """e = torch.exp(x - 1.0).unsqueeze(1).expand(16, 2, 96, 64)
        return e * torch.tensor([1.0, 2.0], device=x.device).view(1, 2, 1, 1)""",
    # heads of a pointwise value copied for a batched product: computed in the copy's layout
    """h = torch.tanh(x) * 2.0
        k = x.view(16, 96, 4, 16).permute(0, 2, 3, 1)
        return h.view(16, 96, 4, 16).permute(0, 2, 1, 3) @ k""",
]


@pytest.mark.parametrize("body", CASES)
def test_a_value_read_through_views_fuses_with_its_reader(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_rewrite_saves_kernels(_PROBLEM.format(body=body), tmp_path, monkeypatch, "compute_through_views")


def test_a_value_also_read_directly_stays_where_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value that a kernel reads as it is and another through a view keeps its one kernel:
    moving the view would compute it twice."""
    body = """s = torch.sigmoid(x)
        return s.sum(-1), s.transpose(1, 2).sum(-1)"""
    source = _PROBLEM.format(body=body)
    ir = capture_program(load_task(source))
    assert [n.op for n in ir.nodes].count("sigmoid") == 1


def test_a_reshape_the_expanded_operand_cannot_take_is_left_alone() -> None:
    """``(x + b).view(...)`` merging a broadcast dim with a full one has no strides on the
    expanded bias: the view stays, and the program is generated as before."""
    body = """y = (x + x[:, :1, :]).reshape(16, 96 * 64)
        return y * 2.0"""
    source = _PROBLEM.format(body=body)
    ir = capture_program(load_task(source))
    assert "add" in [n.op for n in ir.nodes]


_RESHAPED = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn({scale}))

    def forward(self, x):
        b, c, d, h, w = x.shape
        y = torch.softmax(x.view(b, {rows}, -1), dim=2).view(b, c, d, h, w)
        return y * self.scale


def get_inputs():
    return [torch.randn(4, 64, 4, 8, 8)]


def get_init_inputs():
    return []
"""


def test_a_product_of_a_reshaped_softmax_is_its_epilogue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A softmax over each channel's flattened pixels, read back as images and scaled per
    channel (KernelBench L2 38): the product is computed in the softmax's shape, the scale
    viewed the same way, and becomes the softmax's epilogue; the result is reshaped after."""
    source = _RESHAPED.format(scale="64, 1, 1, 1", rows="c")
    task, program = generate_checked(source)
    check_on_cpu(task, program, tmp_path, cooperative=True)
    assert planned_kernels(source) == 1
    monkeypatch.setattr(_capture_lower, "compute_through_views", lambda ir: None)
    assert planned_kernels(source) == 2


def test_an_operand_the_reshape_cannot_view_keeps_the_product_apart() -> None:
    """Two channels a softmax row (a group norm's grouping): the per-channel scale has no view
    in the rows' shape, so the product stays a kernel of its own."""
    assert planned_kernels(_RESHAPED.format(scale="64, 1, 1, 1", rows="c // 2")) == 2


def test_a_rewrite_that_fails_leaves_the_program_as_it_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rewrite adopts each change whole, so a failure on a program it was not written for
    costs only the rewrite: the capture goes on, and says so in its notes."""
    from stitch_graph.codegen import _capture_views

    def broken(ir: object, view: object) -> None:
        raise KeyError("a layout the rewrite did not expect")

    monkeypatch.setattr(_capture_views, "_move", broken)
    ir = capture_program(load_task(_PROBLEM.format(body=CASES[0])))
    assert any(note.startswith("compute_through_views left out: KeyError") for note in ir.notes)
    assert "lt" in [n.op for n in ir.nodes]  # the mask as it was written


_ECA = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 1, kernel_size=3, padding=1, bias=False)

    def forward(self, x):
        y = x.mean(dim=(2, 3), keepdim=True)
        y = self.conv(y.squeeze(-1).transpose(-1, -2)).transpose(-1, -2).unsqueeze(-1)
        return x * torch.sigmoid(y).expand_as(x)


def get_inputs():
    return [torch.randn(4, 32, 6, 6)]


def get_init_inputs():
    return []
"""


def test_a_gate_read_through_expand_as_joins_its_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ECA's channel gate, ``x * sigmoid(y).expand_as(x)``: ``expand_as`` reads only the other
    tensor's shape, so it is captured as the ``expand`` it is, which moves like any view; the
    sigmoid then joins the product's kernel instead of storing the gate."""
    assert "expand_as" not in [n.op for n in capture_program(load_task(_ECA)).nodes]
    check_rewrite_saves_kernels(_ECA, tmp_path, monkeypatch, "compute_through_views")
