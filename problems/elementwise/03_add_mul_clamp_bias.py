"""(x + bias) * scale, clamped to [lo, hi], with a per-channel bias broadcast over (N, C, H, W)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int, lo: float, hi: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(1, channels, 1, 1) * 0.1)
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        y = (x + self.bias) * scale
        return torch.clamp(y, min=self.lo, max=self.hi)


batch = 32
channels = 128
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch, channels, height, width), 1.5]


def get_init_inputs():
    return [channels, -1.0, 2.0]
