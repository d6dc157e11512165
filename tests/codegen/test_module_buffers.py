"""Buffers read in ``forward`` stay buffers, and every buffer reaches the program.

Traced as constants, ``self.alibi.unsqueeze(0)`` and ``~self.causal`` became new tensors; above
65,536 elements such a constant is not baked into the host code, and the program read zeros (an
attention that silently lost its mask and bias). Read as buffers, their values come with the
weights. A non-persistent buffer of that size is not in ``state_dict``: ``module_state`` and
``load_module_state`` carry it all the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stitch_graph.codegen import CaptureError, capture_program
from stitch_graph.execution._common import load_module_state, module_state
from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_ATTENTION = """
import math
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, heads, length):
        super().__init__()
        rel = (torch.arange(length)[None, :] - torch.arange(length)[:, None]).float()
        slopes = torch.linspace(0.5, 0.01, heads)
        self.register_buffer("alibi", slopes[:, None, None] * rel[None], persistent={persistent})
        self.register_buffer("causal", torch.ones(length, length).tril().bool())

    def forward(self, q, k):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        scores = (scores + self.alibi.unsqueeze(0)).masked_fill(~self.causal, float("-inf"))
        return torch.softmax(scores, dim=-1)


def get_inputs():
    return [torch.randn(1, 2, 260, 8), torch.randn(1, 2, 260, 8)]


def get_init_inputs():
    return [2, 260]
"""


def test_buffers_read_in_forward_are_not_folded_into_constants() -> None:
    ir = capture_program(load_task(_ATTENTION.format(persistent=True)))
    params = {p.name for p in ir.params}
    assert {"alibi", "causal"} <= params
    assert not [p for p in params if p.startswith("_tensor_constant")]
    assert "logical_not" in [n.op for n in ir.nodes]  # computed each call, from the buffer


def test_large_buffers_reach_the_program(tmp_path: Path) -> None:
    """260 x 260 keys: a mask of 67,600 elements, too large to bake, as both kinds of buffer."""
    for persistent in (True, False):
        task, program = generate_checked(_ATTENTION.format(persistent=persistent))
        check_on_cpu(task, program, tmp_path, cooperative=True)


def test_module_state_carries_non_persistent_buffers() -> None:
    source = torch.nn.Module()
    source.register_buffer("table", torch.randn(3, 4), persistent=False)
    source.weight = torch.nn.Parameter(torch.randn(2))
    target = torch.nn.Module()
    target.register_buffer("table", torch.zeros(3, 4), persistent=False)
    target.weight = torch.nn.Parameter(torch.zeros(2))
    target.register_buffer("other", torch.zeros(5))
    assert "table" not in source.state_dict()
    loaded = load_module_state(target, module_state(source))
    assert sorted(loaded) == ["table", "weight"]
    assert torch.equal(target.table, source.table) and torch.equal(target.weight, source.weight)


_SLICED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

    def forward(self, att):
        t = att.size(-1)
        return torch.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), -1)


def get_inputs():
    return [torch.randn(2, 3, 10, 10)]


def get_init_inputs():
    return []
"""


def test_a_buffer_sliced_by_an_input_size(tmp_path: Path) -> None:
    """MinGPT's mask: the slice's bounds come from ``size()``, a value known at capture."""
    task, program = generate_checked(_SLICED)
    assert ":10" in program.host_source or "10, None" in program.host_source
    check_on_cpu(task, program, tmp_path, cooperative=True)


_FACTORY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + torch.tril(torch.ones(300, 300{device}))


def get_inputs():
    return [torch.randn(2, 300, 300)]


def get_init_inputs():
    return []
"""


def test_a_large_constant_built_from_nothing_is_refused_with_a_fix(tmp_path: Path) -> None:
    """Traced from no input, ``torch.ones(300, 300)`` is a value of the trace, too large to
    bake: the program would read zeros, so the capture says what to change instead."""
    with pytest.raises(CaptureError, match="device=x.device"):
        capture_program(load_task(_FACTORY.format(device="")))
    task, program = generate_checked(_FACTORY.format(device=", device=x.device"))
    check_on_cpu(task, program, tmp_path, cooperative=True)
