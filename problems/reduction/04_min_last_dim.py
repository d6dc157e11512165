"""Min over the last dimension of a (64, 256, 1024) tensor, values only."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amin(x, dim=-1)


def get_inputs():
    return [torch.randn(64, 256, 1024)]


def get_init_inputs():
    return []
