import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty(rows, device=x.device, dtype=x.dtype)
        KERNELS.row_sum(rows, 256, x, y, cols)  # noqa: F821
        return y
