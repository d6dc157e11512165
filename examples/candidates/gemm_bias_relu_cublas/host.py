import ctypes

import torch
import torch.nn as nn

_gemm = LIB.gemm_bias_relu  # noqa: F821
_gemm.restype = ctypes.c_int
_gemm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + [ctypes.c_void_p]


class ModelNew(nn.Module):
    """cuBLAS SGEMM + bias/ReLU epilogue from a library built with nvcc -shared."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # parameter storage only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w, b = self.linear.weight, self.linear.bias
        rows, inner, cols = x.shape[0], x.shape[1], w.shape[0]
        y = torch.empty((rows, cols), device=x.device, dtype=x.dtype)
        status = _gemm(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), rows, cols, inner,
                       torch.cuda.current_stream().cuda_stream)
        if status != 0:
            raise RuntimeError(f"gemm_bias_relu failed with status {status}")
        return y
