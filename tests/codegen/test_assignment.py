"""Assignment into a tensor in ``forward`` (``y[:, 0] = 0``, ``y[..., ::2] = x``, ``y[m] = 0``,
``y[idx] += v``, ``y[:, 0].mul_(2)``): generated as a new tensor for ``y``, fully generated and
matching PyTorch in the CPU emulation; a read of a view taken before the write stays refused, and an index the
fx path does not lower goes to ``torch.export`` and stays in PyTorch, declared."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import CaptureError, capture_program
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x, y):
{body}


def get_inputs():
    return [torch.randn(3, 5, 6, 8), torch.randn(6, 8)]


def get_init_inputs():
    return []
"""

BODIES = {
    "scalar_into_a_column": "z = x.clone()\nz[:, 0] = 0.0\nreturn z * 2",
    "tensor_broadcast_into_a_slice": "z = torch.zeros_like(x)\nz[1:, :, 2:5] = y[2:5]\nreturn z + 1",
    "stepped_slices_and_ellipsis": "z = x * 1\nz[..., ::3] = -1.0\nz[0, 1::2, :, 1:7:2] = y[:, 1:7:2]\nreturn torch.relu(z)",  # noqa: E501
    "boolean_mask_with_a_scalar": "z = x.clone()\nz[z < 0] = 0.5\nreturn z.sum(-1)",
    # a sinusoidal table filled in a constant the forward builds
    "into_a_constant_of_the_forward": "pe = torch.zeros(6, 8, device=x.device)\npe[:, 0::2] = torch.sin(y[:, 0::2])\npe[:, 1::2] = torch.cos(y[:, 1::2])\nreturn x + pe",  # noqa: E501
    # padded positions of (B, T, D) zeroed by a mask of (B, T), then a slice written
    "mask_after_full_slices": "z = x.clone()\nz[:, :, y[:, 0] > 0] = 0.5\nreturn z * 2",
    # a selection by a mask copied under the same mask: a where at the tensor's own shape
    "copied_under_its_mask": "z = x * 2\nm = y > 0\nz[:, :, m] = x[:, :, m]\nk = x > 1\nw = x.exp()\nz[k] = w[k]\nreturn z",  # noqa: E501
    # sizes only torch.export traces (a Python min of sizes): its slice views, chained
    "exported_slices_of_slices": "n = min(x.shape[1] // 2, 2)\nz = x.clone()\nz[:, 1:1 + n, 2:-1, ::2] = z[:, :n, 2:-1, ::2] + 1.0\nz[0, 0].mul_(3.0)\nreturn z * 2",  # noqa: E501
    "exported_copy_under_its_mask": "n = min(x.shape[1] // 2, 2)\nz = x.clone()\nmed = x[:, :n].mean(1, keepdim=True).expand_as(x)\nm = (x - med).abs() > 1.0\nz[m] = med[m]\nreturn z * 2",  # noqa: E501
    "mask_of_the_leading_dims": "z = x * 2\nz[x[..., 0, 0] > 0] = 0.0\nz[:, 0] = 1.0\nreturn z + 1",
    "add_into_a_slice": "z = x.clone()\nz[..., 1:] += x[..., :-1]\nz[:, 2] *= 3.0\nreturn z",
    "into_the_input_itself": "x[:, :, 0] = y[0]\nreturn x * x",
    "chained_assignments": "z = x.clone()\nz[0] = 1.0\nz[:, 1] = z[:, 2]\nw = z.sum(1)\nreturn w",
    "in_place_op_on_a_view": "z = x + 1\nz[:, 0].mul_(2)\nv = z[..., 2:4]\nv.clamp_(min=0.5)\nreturn z + v.sum()",  # noqa: E501
    # a top-p filter keeps the first token: True into a mask, and an int into an index tensor
    "into_a_mask_and_an_index": "m = x > 0\nm[..., :1] = True\nn = (y * 3).long()\nn[:, 1:3] = 7\nreturn m.float() + n",  # noqa: E501
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_assignment_is_generated_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    body = "\n".join(f"        {line}" for line in BODIES[name].splitlines())
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


# (body, regions written in place): a buffer of the program that nothing reads after the
# assignment takes the region's stores alone; an input is copied, and an assignment its reader
# computes on load needs no kernel of its own
IN_PLACE = [
    ("z = x * 2\nz[:, 0] *= 3.0\nz[..., 1:7:2] = y[:, 1:7:2]\nreturn torch.relu(z)", 1),
    ("z = x * 2\nz[1:] = z[:-1] + 1\nreturn z", 1),  # the value is computed first, apart
    ("x[:, :, 0] = y[0]\nreturn x * x", 0),
    ("z = x * 2\nw = z.sum(1)\nz[:, 0] = 1.0\nreturn z + w.unsqueeze(1)", 0),
]


@pytest.mark.parametrize(("body", "in_place"), IN_PLACE)
def test_a_region_is_stored_in_place_where_nothing_reads_it_after(
    body: str, in_place: int, tmp_path: Path
) -> None:
    lines = "\n".join(f"        {line}" for line in body.splitlines())
    task, program = generate_checked(_PROBLEM.format(body=lines))
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert program.host_source.count("the region written in place") == in_place
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_a_view_read_after_the_write_is_refused() -> None:
    body = "        z = x.clone()\n        v = z[0]\n        z[0] = 1.0\n        return v + 1"
    with pytest.raises(CaptureError, match="in-place op"):
        capture_program(load_task(_PROBLEM.format(body=body)))


def test_an_integer_tensor_index_is_a_generated_scatter(tmp_path: Path) -> None:
    body = "        z = x.clone()\n        z[:, torch.tensor([1, 3])] = 5.0\n        return z * 2"
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_indices_apart_stay_in_pytorch() -> None:
    # PyTorch moves the indexed dims to the front when a slice separates them
    body = (
        "        z = x.clone()\n        z[torch.tensor([0, 2]), :, torch.tensor([1, 3])] = 5.0\n"
        "        return z * 2"
    )
    _, program = generate_checked(_PROBLEM.format(body=body))
    assert "index_put" in program.declared_torch_ops


def test_an_augmented_assignment_writes_its_region_once() -> None:
    # z[:, 0] *= 3: the in-place multiply writes the view back; the assignment that Python
    # adds after it stores the same values into the same region and is no node of its own
    body = "        z = x * 2\n        z[:, 0] *= 3.0\n        z[..., 1:] += x[..., :-1]\n        return z + 1"
    ir = capture_program(load_task(_PROBLEM.format(body=body)))
    assert [node.op for node in ir.nodes].count("setitem") == 2
