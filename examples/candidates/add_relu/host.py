import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        if features % 4:
            raise ValueError("features must be a multiple of 4 for the float4 kernel")
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n4 = x.numel() // 4
        threads = 256
        blocks = min((n4 + threads - 1) // threads, 132 * 8)
        KERNELS.add_relu4(blocks, threads, x, self.bias, out, n4, self.bias.numel() // 4)  # noqa: F821
        return out
