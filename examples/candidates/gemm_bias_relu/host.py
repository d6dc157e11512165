import cupy
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """GEMM by cuBLAS (through CuPy, FP32, on PyTorch's stream), then a bias + ReLU kernel."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # parameter storage only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w = self.linear.weight.detach()
        rows, cols = x.shape[0], w.shape[0]
        y = torch.empty((rows, cols), device=x.device, dtype=x.dtype)
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            cupy.matmul(cupy.asarray(x), cupy.asarray(w).T, out=cupy.asarray(y))
        n = rows * cols
        KERNELS.bias_relu(min((n + 255) // 256, 132 * 8), 256, y, self.linear.bias, n, cols)  # noqa: F821
        return y
