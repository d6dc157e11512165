"""A concatenation whose operands are all stored by generated pointwise kernels is written in
place: each kernel stores into its slice of the result, and no cat kernel reads them back; the
other operands (inputs, views, values read elsewhere, a library's own output) are copied into
their slices by one kernel. Pointwise chains of inputs beside inputs, in a stack or a flip are
computed by the one kernel that reads them. Checked in the CPU emulation against PyTorch, with
float4 slices, odd ones, and the cases that must keep the cat kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 12)
        self.b = nn.Linear(16, 20)
        self.w = nn.Parameter(torch.randn(16, 8))

    def forward(self, x, y):
        return {expr}


def get_inputs():
    return [torch.randn({x}), torch.randn({y})]


def get_init_inputs():
    return []
"""

IN_PLACE = {
    "float4_slices": ("torch.cat((torch.relu(x) * 2, torch.sigmoid(y)), dim=1)", "2, 8, 16", "2, 4, 16"),
    "odd_slices": ("torch.cat([torch.tanh(x), y + 1, x * 3], dim=1)", "3, 5, 7", "3, 4, 7"),
    "last_dim": ("torch.cat((x.exp(), -y), dim=-1)", "6, 5", "6, 3"),
    "gemm_epilogues": ("torch.cat((torch.relu(self.a(x)), torch.tanh(self.b(y))), 1)", "9, 16", "9, 16"),
}


@pytest.mark.parametrize("case", sorted(IN_PLACE))
def test_operands_store_into_the_concatenation(case: str, tmp_path: Path) -> None:
    expr, x, y = IN_PLACE[case]
    task, program = generate_checked(_PROBLEM.format(expr=expr, x=x, y=y))
    assert "written in place by its operands' kernels" in program.host_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert not any("cat" in name or "stack" in name for name in kernels.launched)


PARTLY = {
    # an operand no indexed op computes as it reads it: a library's output
    "library_writes_its_own": ("torch.cat((x @ self.w, torch.relu(y)), dim=1)", "5, 16", "5, 3"),
}


@pytest.mark.parametrize("case", sorted(PARTLY))
def test_the_other_operands_are_copied_into_their_slices(case: str, tmp_path: Path) -> None:
    """An input, a view of one (a partial rotary embedding's pass-through half), a value read
    elsewhere too or a library's own output: one kernel copies those into their slices, and
    the computed operand's kernel stores into its own."""
    expr, x, y = PARTLY[case]
    task, program = generate_checked(_PROBLEM.format(expr=expr, x=x, y=y))
    assert "written in place by its operands' kernels" in program.host_source
    assert "copied into their slices" in program.kernel_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


READ_THROUGH = {  # pointwise chains of inputs beside an input: one kernel, nothing in place
    "stacked_in_the_middle": ("torch.stack((torch.relu(x) * 2, torch.sigmoid(y) - 1), dim=1)", "3, 5, 8", "3, 5, 8"),
    "stacked_last": ("torch.stack([x.exp() + 1, torch.tanh(y) * 2], dim=-1)", "4, 6", "4, 6"),
    "an_input_as_operand": ("torch.cat((x, torch.relu(y) * 2), dim=0)", "4, 6", "2, 6"),
    "a_view_of_an_input": ("torch.cat((torch.tanh(x[..., :3]) * 2, x[..., 3:]), dim=-1)", "4, 5, 7", "1"),
    "a_flipped_chain": ("torch.flip(torch.relu(x) * 2 - y, dims=(0, 2))", "3, 5, 8", "3, 5, 8"),
}


@pytest.mark.parametrize("case", sorted(READ_THROUGH))
def test_chains_of_inputs_are_computed_where_the_indexed_op_reads(
    case: str, tmp_path: Path
) -> None:
    """A stack, a cat beside an input (a partial rotary embedding's pass-through half) or a
    flip computes its operands' pointwise chains as it reads them: one launch, where each chain
    was a kernel storing into its slice."""
    expr, x, y = READ_THROUGH[case]
    task, program = generate_checked(_PROBLEM.format(expr=expr, x=x, y=y))
    assert "written in place" not in program.host_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert len(kernels.launched) == 1, kernels.launched


KEPT = {
    # the concatenation read by a pointwise op: one kernel computes both
    "operand_read_twice": ("torch.cat((torch.relu(x), y * 2 + 1), dim=1) + torch.relu(x).sum()", "2, 4, 8", "2, 4, 8"),
    "all_inputs": ("torch.cat((x, y), dim=1)", "2, 4, 8", "2, 4, 8"),
    "the_library_writes_every_operand": ("torch.cat((x @ self.w, y @ self.w), dim=1)", "5, 16", "5, 16"),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_other_concatenations_keep_their_kernel(case: str, tmp_path: Path) -> None:
    expr, x, y = KEPT[case]
    task, program = generate_checked(_PROBLEM.format(expr=expr, x=x, y=y))
    assert "written in place" not in program.host_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert any("cat" in name for name in kernels.launched)


def test_an_exclusive_cumsum_writes_its_scan_and_its_zeros_in_place(tmp_path: Path) -> None:
    """KernelBench's exclusive cumsum: a zero column, then the scan of all but the last
    element; both kernels store into the result."""
    source = _PROBLEM.format(
        expr="torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), "
        "torch.cumsum(x.narrow(1, 0, x.size(1) - 1), dim=1)), dim=1)",
        x="6, 40",
        y="1",
    )
    task, program = generate_checked(source)
    assert program.kernel_source.count("out[(i / 39) * 40 + 1 + i % 39] = ") == 1
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert not any(name.endswith("_cat") for name in kernels.launched)


FLIPPED = {  # a flip of a kernel's result, its only reader: the kernel stores mirrored
    "reverse_cumsum_warp_a_line": "torch.cumsum(x.flip(1), 1).flip(1), y * 2",
    "reverse_cumsum_in_chunks": "torch.cumsum(x.flip(1), 1).flip(1), y * 2",
}
_FLIP_SHAPES = {
    "reverse_cumsum_warp_a_line": ("3, 70", "1"),
    "reverse_cumsum_in_chunks": ("2, 130, 40", "1"),
}


@pytest.mark.parametrize("case", sorted(FLIPPED))
def test_a_flipped_result_is_stored_mirrored(case: str, tmp_path: Path) -> None:
    x, y = _FLIP_SHAPES[case]
    task, program = generate_checked(_PROBLEM.format(expr=FLIPPED[case], x=x, y=y))
    assert "written in place by its operands' kernels" in program.host_source
    kernels = check_on_cpu(task, program, tmp_path, cooperative=True)
    assert not any(name.endswith("_flip") for name in kernels.launched)


def test_a_flip_of_a_value_read_elsewhere_keeps_its_kernel(tmp_path: Path) -> None:
    expr = "torch.flip(torch.relu(x) * 2, dims=(1,)) + torch.relu(x) * 2 + 0 * y.sum()"
    task, program = generate_checked(_PROBLEM.format(expr=expr, x="4, 9", y="1"))
    assert "written in place" not in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)
