"""A VGG-style conv block: (conv3x3-BN-ReLU) x 2 then 2x2 max-pool; batch norm in eval mode."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.body.eval()  # use running statistics, as at inference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


batch = 32
in_channels = 3
channels = 64
size = 128


def get_inputs():
    return [torch.randn(batch, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, channels]
