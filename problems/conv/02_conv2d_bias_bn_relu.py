"""conv2d (no bias) + an extra bias + batch norm with running statistics + relu."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bias = nn.Parameter(0.1 * torch.randn(out_channels, 1, 1))
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(out_channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(out_channels))
        self.register_buffer("running_var", 1.0 + 0.1 * torch.rand(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) + self.bias
        y = F.batch_norm(
            y, self.running_mean, self.running_var, self.bn_weight, self.bn_bias,
            training=False, eps=1e-5,
        )
        return F.relu(y)


batch = 16
in_channels = 32
out_channels = 64
size = 128


def get_inputs():
    return [torch.randn(batch, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, out_channels]
