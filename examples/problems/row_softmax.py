"""Softmax over the last dimension of a 4096 x 1024 matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(4096, 1024) * 3.0]


def get_init_inputs():
    return []
