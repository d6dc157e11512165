"""Sum over the rows of an 8192 x 1024 matrix (a reduction to one value per row)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=1)


def get_inputs():
    return [torch.randn(8192, 1024)]


def get_init_inputs():
    return []
