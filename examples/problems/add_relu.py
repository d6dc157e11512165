"""relu(x + bias): a pointwise add with a broadcast parameter, 4M elements."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bias)


def get_inputs():
    return [torch.randn(1024, 4096)]


def get_init_inputs():
    return [4096]
