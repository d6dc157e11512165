"""a * b + c / (1 + |a|) with c broadcast along rows: three operands, two of them full-size."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return a * b + c / (1.0 + torch.abs(a))


rows = 8192
cols = 2048


def get_inputs():
    return [torch.randn(rows, cols), torch.randn(rows, cols), torch.randn(1, cols)]


def get_init_inputs():
    return []
