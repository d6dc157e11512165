"""Mean over the middle dimension with keepdim: a strided reduction of a (B, R, C) tensor."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(16, 1024, 1024)]


def get_init_inputs():
    return [1]
