"""A tiny problem and host-code template for running the verify path without a GPU."""

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return [16]
"""

HOST = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
{body}
"""

HONEST = "        return torch.relu(self.lin(x))"
