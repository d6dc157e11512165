"""``ProgramIR.node`` finds nodes through a position index that passes may leave stale (they
insert, remove and replace nodes): every look-up must still name the node the list holds."""

from __future__ import annotations

import dataclasses

import pytest

from stitch_graph.codegen import capture_program
from stitch_graph.task import load_task

_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.relu(x) * 2.0
        z = torch.tanh(y) + x
        return torch.softmax(z, dim=1) - y


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
"""


def _check(ir) -> None:  # noqa: ANN001
    for i, n in enumerate(ir.nodes):
        assert ir.node(n.name) is n
        assert ir.position(n.name) == i


def test_look_ups_follow_nodes_removed_inserted_and_replaced() -> None:
    ir = capture_program(load_task(_PROBLEM))
    assert len(ir.nodes) >= 4
    _check(ir)
    removed = ir.nodes.pop(1)
    _check(ir)
    with pytest.raises(KeyError, match=removed.name):
        ir.node(removed.name)
    ir.nodes.insert(0, removed)
    _check(ir)
    ir.nodes[2] = dataclasses.replace(ir.nodes[2], shape=(1,))
    _check(ir)
    assert ir.node(ir.nodes[2].name).shape == (1,)
    ir.nodes.reverse()
    _check(ir)
