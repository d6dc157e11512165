import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)  # parameter storage only; the kernel does the work

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        KERNELS.layer_norm(  # noqa: F821
            rows, 256, x, self.norm.weight, self.norm.bias, y, cols, self.norm.eps
        )
        return y
