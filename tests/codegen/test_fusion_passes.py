"""The fusion decisions made once grouping is done (``codegen/_fusion_passes.py``).

A pointwise result several ops read, all in one kernel, is computed in that kernel: a focal
loss's ``p = sigmoid(x)`` (read by ``p * t`` and ``1 - p``) in the mean's prologue, a shared
activation in one pointwise kernel. It is still written once where a reader sits elsewhere or
the program returns it. A one-op producer of ``cat``, ``stack`` or ``flip`` is computed as they
read it (rotate_half's ``cat((-x2, x1))`` is one kernel). Every case matches PyTorch in the CPU
emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program, plan_program
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x, t):
        {body}


def get_inputs():
    return [torch.randn(4, 64, 80), torch.randint(0, 2, (4, 64, 80)).float()]


def get_init_inputs():
    return []
"""

FOLDED = [
    # a focal loss: the sigmoid read twice inside the mean's prologue
    ("""p = torch.sigmoid(x)
        p_t = p * t + (1 - p) * (1 - t)
        return ((1 - p_t) ** 2 * torch.abs(x - t)).mean()""", 1),
    # a shared activation read by two branches of one pointwise kernel
    ("""a = torch.tanh(x) * 0.5
        return a * t + torch.exp(a)""", 1),
    # ...and by two ops in a row norm's prologue
    ("""g = torch.nn.functional.gelu(x)
        return torch.softmax(g * t - g, dim=-1)""", 1),
]
KEPT = [
    # returned as well: written once, read back by the next kernel
    ("""p = torch.sigmoid(x)
        return p, (p * t + (1 - p)).sum(-1)""", 2),
]
RECOMPUTED = [
    # read by a reduction and by the kernel that scales by its result: each computes it
    # (codegen/_capture_recompute), where the fold alone left it a kernel of its own; and at
    # this small size the reduction's kernel rewrites the rows itself (broadcast back)
    ("""p = torch.sigmoid(x)
        return p.sum(-1, keepdim=True) * p""", 1),
]


READ_THROUGH = [
    # rotate_half: the negation computed where the cat picks it, one kernel in all
    ("""x1, x2 = x.chunk(2, dim=-1)
        return x * t + torch.cat((-x2, x1), dim=-1) * (1 - t)""", 1),
    # the interleaved form: a stack of a negated strided view, then a product after a view,
    # which is computed in the stack's shape and joins its kernel (_capture_views)
    ("""x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2) * t""", 1),
    ("return torch.flip(torch.exp(x), [1]) + t", 1),
    # a producer of a transposed view: its element at the transposed coordinates
    ("return torch.stack([torch.relu(x.transpose(1, 2)), t.transpose(1, 2)], 0).sum(0)", 1),
    # box corners from centres and extents: each a difference of two operands, one broadcast
    ("""c, w = x[:, :, :40], t[:1, :, 40:]
        return torch.stack([c - w, c + w * 0.5, torch.maximum(c, w)], dim=-1).clamp(-1.0, 1.0)""", 1),
    # a product pooled through reflect padding (an SSIM's local second moments), a rolled
    # product (a periodic stencil's flux)
    ("return F.avg_pool1d(F.pad(x * t, (2, 2), mode='reflect'), 5, stride=1)", 1),
    ("return torch.roll(torch.exp(x) * t, 3, dims=-1) + torch.roll(x - t, -1, dims=1)", 1),
    # a chain of ops, each read once by the next
    ("return torch.cat([torch.exp(x[:, :1]) * 2.0 + t[:, :1], x], dim=1) * 2.0", 1),
]


@pytest.mark.parametrize(("body", "kernels"), FOLDED + KEPT + RECOMPUTED + READ_THROUGH)
def test_a_result_read_several_times_is_written_only_where_needed(
    body: str, kernels: int, tmp_path: Path
) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops
    assert len(plan_program(capture_program(task)).items) == kernels
    check_on_cpu(task, program, tmp_path, cooperative=True)
