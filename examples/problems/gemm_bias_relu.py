"""relu(x @ W^T + b): a 1024 x 1024 x 1024 FP32 linear layer with a ReLU epilogue."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return [1024, 1024]
