"""LayerNorm over the last dimension (1024) of a 4096 x 1024 input, with affine parameters."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(4096, 1024) * 2.0 + 0.5]


def get_init_inputs():
    return [1024]
