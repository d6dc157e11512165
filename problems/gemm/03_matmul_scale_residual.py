"""(a @ b) * alpha + c: a square matmul with a scaled-residual epilogue, 2048^3."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b) * self.alpha + c


n = 2048


def get_inputs():
    return [torch.randn(n, n), torch.randn(n, n), torch.randn(n, n)]


def get_init_inputs():
    return [0.125]
