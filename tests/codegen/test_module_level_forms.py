"""Problems whose module-level code needs what an import gives: a ``@dataclass`` config (looked
up in ``sys.modules`` as it is decorated) and a ``@torch.jit.script`` helper (compiled from its
source lines, read through ``linecache``). Problems are run from strings, not imported; both
must load, generate whole and match PyTorch in the CPU emulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.task import load_task
from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PROBLEM = """
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class Config:
    width: int = 32
    scale: float = 0.5


@torch.jit.script
def swish(x: torch.Tensor, beta: float) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.config = Config(width=width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return swish(self.proj(x), 1.5) * self.config.scale


def get_inputs():
    return [torch.randn(4, 32)]


def get_init_inputs():
    return [32]
"""


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_dataclass_and_a_scripted_helper_load_and_are_generated(tmp_path: Path) -> None:
    load_task(_PROBLEM, name="module_level_forms")
    task, program = generate_checked(_PROBLEM)
    assert not program.declared_torch_ops, program.declared_torch_ops
    check_on_cpu(task, program, tmp_path, cooperative=True)
