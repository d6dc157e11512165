"""Calls lowered to registry ops at capture: ``prelu``, ``var_mean`` (a tuple) and the
``nn.GRUCell`` / ``nn.LSTMCell`` steps, each generated whole and checked in the CPU emulation
against PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.cpu_emulation import check_on_cpu, generate_checked

_PRELU = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1)
        self.per_channel = nn.PReLU(6, init=0.2)
        self.shared = nn.PReLU(init=0.3)

    def forward(self, x):
        return self.shared(self.per_channel(self.conv(x)) - 0.1)

def get_inputs():
    return [torch.randn(2, 4, 8, 8)]

def get_init_inputs():
    return []
"""

_VAR_MEAN = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, unbiased=False)
        spread, centre = torch.var_mean(x, 1)
        return (x - mean) / torch.sqrt(var + 1e-5) + (spread * centre).unsqueeze(1)

def get_inputs():
    return [torch.randn(2, 6, 5, 7) * 2 + 1]

def get_init_inputs():
    return []
"""

_CELLS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRUCell(12, 16)
        self.lstm = nn.LSTMCell(16, 8)

    def forward(self, x, h, g, c):
        for t in range(x.size(0)):
            h = self.gru(x[t], h)
            g, c = self.lstm(h, (g, c))
        return torch.cat((g, c), dim=1)

def get_inputs():
    return [torch.randn(3, 5, 12), torch.randn(5, 16), torch.randn(5, 8), torch.randn(5, 8)]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("source", [_PRELU, _VAR_MEAN, _CELLS], ids=["prelu", "var_mean", "cells"])
def test_the_call_is_generated_whole_and_matches_pytorch(source: str, tmp_path: Path) -> None:
    task, program = generate_checked(source)
    assert program.declared_torch_ops == []
    check_on_cpu(task, program, tmp_path, cooperative=True)
