"""``einsum`` of any number of operands generated as pairwise contractions (``matmul`` or a
broadcast ``mul``), checked against PyTorch in the CPU emulation; equations outside what the
lowering reproduces stay in PyTorch, declared."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.codegen import capture_program
from stitch_graph.codegen._capture_einsum import _pairs, _smallest_pair
from stitch_graph.codegen.ir import numel
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_R = "torch.randn"
CASES = {
    "chain_of_three": ("ij,jk,kl->il", f"{_R}(5, 6), {_R}(6, 7), {_R}(7, 3)"),
    # Mamba2's chunked scan (KernelBench level 3, 48/49), small sizes
    "four_operands": (
        "bclhn,bcshn,bhcls,bcshp->bclhp",
        f"{_R}(2, 3, 4, 2, 5), {_R}(2, 3, 4, 2, 5), {_R}(2, 2, 3, 4, 4), {_R}(2, 3, 4, 2, 6)",
    ),
    "batched_and_permuted": ("bhzc,bchpn->bzhpn", f"{_R}(2, 3, 4, 5), {_R}(2, 5, 3, 6, 7)"),
    "outer_product": ("i,j->ij", f"{_R}(5), {_R}(7)"),
    "one_operand_sum_and_permute": ("ijk->ki", f"{_R}(3, 4, 5)"),
    "elementwise_then_transposed": ("ij,ij->ji", f"{_R}(4, 6), {_R}(4, 6)"),
    "letter_summed_before_the_product": ("ijk,jl->il", f"{_R}(3, 4, 5), {_R}(4, 2)"),
    # a letter an operand repeats: its diagonal (a batch of traces; a product with one)
    "batch_of_traces": ("bii->b", f"{_R}(3, 5, 5)"),
    "product_with_a_diagonal": ("bij,bjj->bi", f"{_R}(2, 4, 5), {_R}(2, 5, 5)"),
    "a_diagonal": ("ii->i", f"{_R}(4, 4)"),
    # an ellipsis spelled out in letters: leading, inside, of different spans, implicit output
    "ellipsis_leading": ("...nd,de->...ne", f"{_R}(2, 3, 5, 4), {_R}(4, 6)"),
    "ellipsis_inside": ("b...d,de->b...e", f"{_R}(2, 3, 5, 4), {_R}(4, 6)"),
    "ellipsis_spans_differ": ("...ij,...jk->...ik", f"{_R}(2, 3, 4, 5), {_R}(3, 5, 6)"),
    "ellipsis_implicit_output": ("...ij,jk", f"{_R}(2, 3, 4), {_R}(4, 5)"),
    "ellipsis_broadcast_matmul": ("...ij,...jk->...ik", f"{_R}(1, 3, 4), {_R}(2, 4, 5)"),
}


def _problem(equation: str, inputs: str) -> str:
    count = inputs.count(_R)
    params = ", ".join("abcd"[:count])
    return f"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, {params}):
        return torch.relu(torch.einsum({equation!r}, {params})) * 2.0


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("case", sorted(CASES), ids=str)
def test_einsum_is_generated_and_matches_pytorch(case: str, tmp_path: Path) -> None:
    task, program = generate_checked(_problem(*CASES[case]))
    assert "einsum" not in program.declared_torch_ops
    assert "torch.einsum" not in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


def test_equations_it_does_not_reproduce_stay_in_pytorch() -> None:
    for equation, inputs in [
        ("iii->i", f"{_R}(3, 3, 3)"),  # a letter repeated three times
        ("ij,ij->ij", f"{_R}(1, 4), {_R}(3, 4)"),  # sizes that broadcast
    ]:
        _, program = generate_checked(_problem(equation, inputs))
        assert "einsum" in program.declared_torch_ops, equation


def test_atens_contraction_path_orders_the_pairs_when_it_is_valid() -> None:
    assert _pairs([0, 2, 0, 1], 3) == [(0, 2), (0, 1)]
    assert _pairs(None, 3) is None
    assert _pairs([0, 3, 0, 1], 3) is None  # operand 3 does not exist
    assert _pairs([0, 1], 3) is None  # too short for three operands


def test_without_a_path_the_smallest_result_is_paired_first() -> None:
    """Mamba2's four operands: C with B first (b c l s h), then L, then X; pairing first to
    last would broadcast L against X into all six letters."""
    sizes = {"b": 4, "c": 2, "l": 64, "s": 64, "h": 8, "n": 16, "p": 64}
    subs = ["bclhn", "bcshn", "bhcls", "bcshp"]
    assert _smallest_pair(subs, "bclhp", sizes) == (0, 1)
    assert _smallest_pair(["bhcls", "bcshp", "bclsh"], "bclhp", sizes) == (0, 2)
    program = capture_program(load_task(_problem(*CASES["four_operands"])))
    largest = max(numel(node.shape) for node in program.nodes)
    assert largest <= 2 * 3 * 4 * 2 * 6  # none larger than the result (b c l h p)
