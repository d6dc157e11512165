"""Views that stand on a contiguous copy take the copy's strides, not the traced ones.

``nn.MultiheadAttention`` views a transposed projection (``q.view(bsz, heads, len, dim)``); the
capture gives the view a contiguous copy, and the batched GEMMs after it must read the copy
with its own strides. Both cases run the generated program on the CPU against PyTorch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = {layer}

    def forward(self, x):
        return {call}


def get_inputs():
    return [torch.rand({shape})]


def get_init_inputs():
    return []
"""

CASES = {
    "attention": (
        "nn.MultiheadAttention(32, 4, dropout=0.0, batch_first=True)",
        "self.layer(x, x, x, need_weights=False)[0]",
        "3, 5, 32",
    ),
    "encoder_layer": (
        "nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)",
        "self.layer(x)",
        "3, 2, 32",
    ),
    # cross-attention splits its packed projection with split_with_sizes
    "decoder_layer": (
        "nn.TransformerDecoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)",
        "self.layer(x, x * 0.5)",
        "3, 2, 32",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_views_of_copies_match_pytorch(case: str, tmp_path: Path) -> None:
    layer, call, shape = CASES[case]
    task, program = generate_checked(_PROBLEM.format(layer=layer, call=call, shape=shape))
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)


_HEADS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, 4, 8).transpose(1, 2)
        k = k.view(b, t, 4, 8).transpose(1, 2)
        v = v.reshape(b, t, 4, 8).transpose(1, 2)
        y = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return y.transpose(1, 2).reshape(b, t, c)


def get_inputs():
    return [torch.rand(3, 5, 32)]


def get_init_inputs():
    return []
"""


def test_a_view_that_strides_allow_takes_no_copy(tmp_path: Path) -> None:
    """``q.view(b, t, heads, dim)`` of a column slice is a view in PyTorch (only the last
    dimension splits), so it needs no copy of its own; the final ``reshape`` of a transposed
    tensor is not a view and keeps its copy."""
    from stitch_graph.codegen import capture_program, plan_program

    task, program = generate_checked(_HEADS)
    copies = [
        op for item in plan_program(capture_program(task)).items for op in item.ops if "_input" in op
    ]
    assert not {"view_input", "view_1_input", "reshape_input"} & set(copies), copies
    assert "reshape_1_input" in copies  # y.transpose(1, 2).reshape(...) must copy
    check_on_cpu(task, program, tmp_path, cooperative=True)


@pytest.mark.parametrize(("call", "shape", "batch"), [
    ("self.layer(x.transpose(1, 2))", "3, 24, 10", 3),  # token mixing: three batched products
    ("self.layer(x.t())", "24, 10", 1),  # one column-major matrix
    ("self.layer(x.permute(1, 0, 3, 2))", "5, 3, 24, 10", None),  # no one batch
])
def test_a_linear_reads_a_transposed_input_as_it_lies(
    call: str, shape: str, batch: int | None, tmp_path: Path
) -> None:
    """cuBLAS takes a column-major matrix, and a batch of them one stride apart, as they lie:
    a linear over the tokens of (B, T, C) is a batched GEMM of the transposed view, not a copy
    and then a GEMM. A view whose batches are not one stride apart still gets its copy."""
    width = shape.split(", ")[-2]
    source = _PROBLEM.format(layer=f"nn.Linear({width}, 7)", call=call, shape=shape)
    task, program = generate_checked(source)
    copies = "linear_input" in program.host_source
    assert copies == (batch is None)
    if batch is not None:
        call = next(
            line for line in program.host_source.splitlines() if line.lstrip().startswith("_sgemm(")
        )
        assert ast.literal_eval(ast.parse(call.strip()).body[0].value.args[14]) == batch, call
    check_on_cpu(task, program, tmp_path, cooperative=True)
