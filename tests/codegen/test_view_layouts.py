"""Views that stand on a contiguous copy take the copy's strides, not the traced ones.

``nn.MultiheadAttention`` views a transposed projection (``q.view(bsz, heads, len, dim)``); the
capture gives the view a contiguous copy, and the batched GEMMs after it must read the copy
with its own strides. Both cases run the generated program on the CPU against PyTorch.
"""

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
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_views_of_copies_match_pytorch(case: str, tmp_path: Path) -> None:
    layer, call, shape = CASES[case]
    task, program = generate_checked(_PROBLEM.format(layer=layer, call=call, shape=shape))
    check_on_cpu(task, program, tmp_path, cooperative=True)
