"""gelu(x @ W^T + b) on a (batch, seq, d) activation: an MLP up-projection, 1024 -> 4096."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, d_model: int, d_hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, d_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.up(x))


batch = 8
seq = 512
d_model = 1024
d_hidden = 4096


def get_inputs():
    return [torch.randn(batch, seq, d_model)]


def get_init_inputs():
    return [d_model, d_hidden]
