"""softmax(q @ k^T / sqrt(d)) @ v with batched matmuls: unfused attention, 32 x 1024 x 64."""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        probs = torch.softmax(scores, dim=-1)
        return torch.bmm(probs, v)


batch = 32
seq = 1024
head_dim = 64


def get_inputs():
    return [
        torch.randn(batch, seq, head_dim),
        torch.randn(batch, seq, head_dim),
        torch.randn(batch, seq, head_dim),
    ]


def get_init_inputs():
    return []
