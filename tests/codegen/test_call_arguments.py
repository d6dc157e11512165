"""What a call's arguments say, honoured: inputs in any layout (a transposed input was read as if
it were dense), ``round``'s ``decimals`` (dropped by the expression once), an element of a
``max(dim)`` pair left to PyTorch (its host line named a tuple no line computed), a factory
given a tensor only for its dtype (``h.new_zeros``), whose producer need not run for it, and a
slice of a tuple left to PyTorch (``parts[:1]`` was made contiguous, as if it were a tensor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 16)

    def forward(self, x, y, ids):
        {body}


def get_inputs():
    return [
        torch.randn(8, 4).t(),
        torch.randn(4, 5, 6).transpose(1, 2),
        torch.randint(-9, 9, (4, 10)),
    ]


def get_init_inputs():
    return []
"""


def _checked(body: str, tmp_path: Path) -> object:
    task, program = generate_checked(_PROBLEM.format(body=body))
    check_on_cpu(task, program, tmp_path, cooperative=True)
    return program


@pytest.mark.parametrize(
    "body",
    [
        "return torch.sigmoid(self.lin(x)).sum(1, keepdim=True) + y.sum(-1)",
        "return y * 2 + x[:, :6, None]",
    ],
)
def test_inputs_in_any_layout(body: str, tmp_path: Path) -> None:
    program = _checked(body, tmp_path)
    assert not program.declared_torch_ops, program.declared_torch_ops


@pytest.mark.parametrize("decimals", [0, 2, -1])
def test_round_keeps_its_decimals(decimals: int, tmp_path: Path) -> None:
    program = _checked(f"return torch.round(y * 37.0, decimals={decimals})", tmp_path)
    assert not program.declared_torch_ops, program.declared_torch_ops


def test_an_element_of_an_integer_pair_left_to_pytorch(tmp_path: Path) -> None:
    program = _checked(
        "return ids.kthvalue(2, dim=-1).values + ids.sort(1)[1][:, 0] + y.sum((1, 2))", tmp_path
    )
    # an integer kthvalue and sort's indices stay in PyTorch, and run
    assert set(program.declared_torch_ops) == {"kthvalue", "sort"}


def test_an_integer_max_and_argmin_are_generated(tmp_path: Path) -> None:
    program = _checked("return ids.max(dim=-1).values + ids.min(1)[1] + y.sum((1, 2))", tmp_path)
    assert not program.declared_torch_ops, program.declared_torch_ops


def test_a_factory_does_not_keep_its_tensor_alive(tmp_path: Path) -> None:
    program = _checked("h = y.exp() * 3\n        return h.new_zeros(4, 6) + x[:, :6]", tmp_path)
    assert not program.declared_torch_ops, program.declared_torch_ops
    assert "exp" not in program.kernel_source.split("extern", 1)[1]


def test_a_number_made_a_tensor_is_generated(tmp_path: Path) -> None:
    """``one = scores.new_tensor(1)`` (SuperGlue's optimal transport): a number of y's dtype."""
    program = _checked("one = y.new_tensor(3)\n        return (y.shape[1] * one).log() + y", tmp_path)
    assert not program.declared_torch_ops, program.declared_torch_ops


def test_a_slice_of_a_tuple_left_to_pytorch_stays_a_tuple(tmp_path: Path) -> None:
    _checked("return torch.cat(y.split([2, 4], dim=1)[:1] * 2, 1) + 1.0", tmp_path)
