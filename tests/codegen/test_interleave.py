"""Operands' elements in turn along a dim (``interleave``): GPT-J's rotate_every_two and
``repeat_interleave`` are computed by their readers, and match PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stitch_graph.codegen import capture_program
from stitch_graph.codegen._capture_interleave import interleave
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(40, 6), persistent=False)

    def forward(self, x, pos):
        {body}


def get_inputs():
    return [torch.randn(3, 10, 4, 12), torch.randint(0, 40, (3, 10))]


def get_init_inputs():
    return []
"""

CASES = {
    # GPT-J's rotary: rotate_every_two and sin/cos spread over pairs of features
    "gptj_rotary": (
        "sin = self.table[pos].repeat_interleave(2, dim=-1).unsqueeze(2)\n"
        "        rot = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)\n"
        "        return x * sin.cos() + rot * sin"
    ),
    "three_in_turn": "return torch.stack((x, 2 * x, x.exp()), dim=2).flatten(1, 2).sum(-1)",
    "repeated_rows": "return torch.repeat_interleave(x, 3, dim=1) + 1.0",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_interleaved_values_match_pytorch(case: str, tmp_path: Path) -> None:
    source = _PROBLEM.format(body=CASES[case])
    ir = capture_program(load_task(source))
    assert any(n.op == "interleave" for n in ir.nodes)
    assert not any(n.op in ("stack", "expand") for n in ir.nodes)
    task, program = generate_checked(source)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_the_rotary_tables_are_computed_where_they_are_read() -> None:
    """No kernel stores the repeated table or the rotated pairs: the gather, then one kernel."""
    source = _PROBLEM.format(body=CASES["gptj_rotary"])
    _, program = generate_checked(source)
    launched = [
        line for line in program.host_source.splitlines() if line.lstrip().startswith("# k")
    ]
    assert len(launched) == 2, launched


def test_the_host_spelling_is_the_op() -> None:
    """Where the op is left to PyTorch, its host call computes what the capture meant."""
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    spelled = eval(interleave.host_call, {"torch": torch})  # noqa: S307 - the module's own text
    torch.testing.assert_close(spelled([a, b], 1), torch.stack((a, b), 2).flatten(1, 2))
    torch.testing.assert_close(spelled([a, a], 2), torch.repeat_interleave(a, 2, dim=2))
    torch.testing.assert_close(interleave([a, b], 0), spelled([a, b], 0))
