"""Forms a program meets outside the benchmark levels, each generated whole and matching
PyTorch in the CPU emulation: a GEMM over broadcast rows (``x.expand`` into a linear: cuBLAS
was handed a leading dimension of the stride-0 rows and read past the tensor), a tuple-valued
call returned whole (``return torch.max(x, 1)``), an index that is a 0-dim tensor
(``x[s.argmax()]``), a recurrent layer over a transposed input and state, the largest and
smallest of integers, ``roll`` of the flattened tensor, ``fold`` (col2im), buckets of a
vector and of NaN (a binary search), calls as ``torch.export`` spells them (``aten.upsample_*``,
a ``no_grad`` block), a linear of a vector, and bags of embeddings that offsets start (empty bags
among them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen.ir import matrix_layout
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 6)
        self.gru = torch.nn.GRU(8, 6, num_layers=2, batch_first=True)

    def forward(self, x, h):
        {body}


def get_inputs():
    return [torch.randn(3, 5, 8), torch.randn(5, 2, 6)]


def get_init_inputs():
    return []
"""

BODIES = {
    "linear_of_broadcast_rows": "return self.lin(x[:, :1].expand(-1, 4, -1))",
    "matmul_of_broadcast_rows": "return x[:, :1].expand(-1, 6, -1) @ self.lin.weight.t()",
    "max_returned_whole": "return torch.max(x * 2, dim=1)",
    "chunks_returned_whole": "return torch.chunk(x + 1, 2, dim=-1)",
    "var_mean_returned_whole": "return torch.var_mean(x, dim=1)",
    "row_picked_by_argmax": "i = x.sum((1, 2)).argmax()\n        return x[i] * 2.0",
    "column_picked_by_argmax": "j = h.sum((0, 1)).argmin()\n        return h[:, :, j] + 1.0",
    "recurrent_over_transposed_input_and_state": (
        "return self.gru(x.transpose(0, 1) * 1.0, torch.tanh(h).transpose(0, 1))[0]"
    ),
    "largest_and_smallest_integers": (
        "n = (x * 1000).long()\n        return n.amax(dim=1) - (h * 10).int().min() + n.sum(-1).max()"
    ),
    "fold_of_unfolded_windows": (
        "c = torch.nn.functional.unfold(x.unsqueeze(1), 3, padding=1)\n        "
        "f = torch.nn.functional.fold(c * 2.0, (5, 8), 3, padding=1)\n        "
        "d = torch.nn.functional.unfold(x.unsqueeze(1), 2, dilation=2, stride=2)\n        "
        "return f + torch.nn.functional.fold(d, (5, 8), 2, dilation=2, stride=2)"
    ),
    "buckets_of_a_vector_and_of_nan": (
        "e = torch.linspace(-2.0, 2.0, 9, device=x.device)\n        "
        "v = torch.where(x > 1.5, float('nan'), x)\n        "
        "return torch.bucketize(x.sum((1, 2)) / 8, e) * 2 + torch.bucketize(v, e, right=True).sum((1, 2))"
    ),
    # a Python min of sizes: only torch.export traces it, with aten's names for these calls
    "exported_resize_under_no_grad_and_a_vector_linear": (
        "n = min(x.shape[1] // 2, 2)\n        "
        "with torch.no_grad():\n            s = x[:, :n].norm(dim=1, keepdim=True)\n        "
        "up = torch.nn.functional.interpolate(x.unsqueeze(1) / s.unsqueeze(1), scale_factor=2, "
        "mode='bilinear', align_corners=False)\n        "
        "return up.sum(1)[:, :, :8] + self.lin(x[0, 0, :])[:1] + torch.nn.functional.interpolate("
        "x, scale_factor=1.5).sum()"
    ),
    "roll_of_the_flattened_tensor": "return torch.roll(x * 2.0, 7).sum(-1) + torch.roll(h, -3).sum((1, 2))[:3, None]",
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_form_is_generated_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=BODIES[name]))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_overlapping_rows_have_no_matrix_layout() -> None:
    assert matrix_layout((4, 8), (0, 1)) is None  # broadcast rows
    assert matrix_layout((8, 4), (1, 0)) is None  # broadcast columns, transposed
    assert matrix_layout((4, 8), (3, 1)) is None  # rows that overlap
    assert matrix_layout((4, 8), (8, 1)) == (False, 8, 0)
    assert matrix_layout((3, 4, 8), (0, 8, 1)) == (False, 8, 0)  # a broadcast batch is fine


_BAGS = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mean = torch.nn.EmbeddingBag(50, 6, mode="mean")
        self.sum = torch.nn.EmbeddingBag(50, 6, mode="sum", include_last_offset=True)
        self.max = torch.nn.EmbeddingBag(50, 6, mode="max")

    def forward(self, ids, offsets, weights):
        last = torch.cat([offsets, offsets[-1:] + 2])
        return self.mean(ids, offsets), self.sum(ids, last, weights), self.max(ids, offsets)


def get_inputs():
    # bags of 3, 0 (empty), 4, 1 and 2 rows
    return [torch.randint(0, 50, (10,)), torch.tensor([0, 3, 3, 7, 8]), torch.rand(10)]


def get_init_inputs():
    return []
"""


def test_bags_that_offsets_start_are_generated(tmp_path: Path) -> None:
    task, program = generate_checked(_BAGS)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
