"""hardswish(leaky_relu(x)): two piecewise activations back to back, 16M elements."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(F.leaky_relu(x, self.negative_slope))


def get_inputs():
    return [torch.randn(16, 1024, 1024)]


def get_init_inputs():
    return [0.01]
