"""An index by a list of ints in steps (``x[:, [-1]]``, ``x[:, [0, 2, 4]]``) is read as a slice:
the same values, a view instead of a copy whose index PyTorch sends to the GPU on every call (a
synchronising host copy no CUDA graph captures). Other lists, and results written in place,
keep PyTorch's copy. Every case matches PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        {body}


def get_inputs():
    return [torch.randn(6, 10, 5)]


def get_init_inputs():
    return []
"""

CASES = [
    ("return x[:, [-1]] * 2", "x[:, 9:10:1]"),
    ("return torch.relu(x[:, [0, 3, 6, 9], 1:])", "x[:, 0:10:3, 1:]"),
    ("return x[:, [2, 1]] + 1", "[2, 1]"),  # descending: PyTorch's copy
    ("return x[0, [1, 2]] + 1", "[1, 2]"),  # beside an int index, which moves the dim
    (
        """y = x[:, [0]]
        y.mul_(3)
        return x + y""",
        "[0]",
    ),  # written in place: a view would write x
    (
        """y = x[:, [4]]
        y += 1
        return x * y""",
        "[4]",
    ),
]


@pytest.mark.parametrize(("body", "index"), CASES, ids=[c[1] for c in CASES])
def test_an_index_list_in_steps_is_read_as_a_slice(body: str, index: str, tmp_path: Path) -> None:
    task, program = generate_checked(_PROBLEM.format(body=body))
    assert index in program.host_source, program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
