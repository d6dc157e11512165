"""Run generated kernels on the CPU: g++ behind a small CUDA shim, a serial loop over threads.

Good for kernels whose threads do not talk to each other (grid-stride loops, per-thread
accumulators): shared memory, barriers and shuffles have no serial meaning, so kernels that use
them must not be launched here (the prelude that defines them still compiles).
``_sgemm_cpu`` stands in for the host's cuBLAS helper with the same column-major arguments.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stitch_graph.codegen._cuda import PRELUDE

_SHIM = r"""
#include <math.h>
#include <algorithm>
struct sg_dim3 { unsigned x, y, z; };
static sg_dim3 blockIdx, threadIdx, gridDim, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
static inline float __int_as_float(int v) { float f; __builtin_memcpy(&f, &v, 4); return f; }
static inline void __syncthreads() {}
#define __shared__ static
using std::min;
using std::max;
static inline float rsqrtf(float v) { return 1.f / sqrtf(v); }
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
"""
# what the prelude would have defined, for bodies compiled without it
_PRELUDE_STANDINS = r"""
#define SG_INF INFINITY
#define SG_NAN NAN
static inline float sg_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
static inline float sg_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
"""
_KERNEL = re.compile(r'extern "C" __global__ __launch_bounds__\(\d+\) void (\w+)\(([^)]*)\)', re.S)
_CTYPES = {"long long": ctypes.c_longlong, "int": ctypes.c_int, "float": ctypes.c_float}


class CpuKernels:
    """``KERNELS`` for CPU tensors: each kernel runs serially over grid x block threads."""

    def __init__(self, kernel_source: str, workdir: Path, *, with_prelude: bool = False) -> None:
        assert kernel_source.startswith(PRELUDE)
        body = kernel_source[len(PRELUDE) :]
        head = _SHIM + (PRELUDE if with_prelude else _PRELUDE_STANDINS)
        wrappers, self.params = [], {}
        for name, params in _KERNEL.findall(body):
            parts = [p.strip() for p in params.split(",")]
            names = [re.findall(r"\w+", p)[-1] for p in parts]
            types = [
                ctypes.c_void_p if "*" in p else _CTYPES[re.sub(r"\s*\w+$", "", p).strip()]
                for p in parts
            ]
            self.params[name] = types
            wrappers.append(
                f'extern "C" void run_{name}(unsigned g, unsigned b, {params}) {{\n'
                "  gridDim = {g, 1, 1}; blockDim = {b, 1, 1};\n"
                "  for (unsigned bx = 0; bx < g; ++bx) for (unsigned tx = 0; tx < b; ++tx) {\n"
                "    blockIdx = {bx, 0, 0}; threadIdx = {tx, 0, 0};\n"
                f"    {name}({', '.join(names)});\n"
                "  }\n}"
            )
        src = workdir / "kernels.cpp"
        src.write_text(head + body + "\n" + "\n".join(wrappers) + "\n")
        lib = workdir / "kernels.so"
        subprocess.run(
            ["g++", "-O1", "-w", "-shared", "-fPIC", "-o", str(lib), str(src)],
            check=True,
            capture_output=True,
            text=True,
        )
        self.lib = ctypes.CDLL(str(lib))
        self.launched: list[str] = []

    def __getattr__(self, name: str) -> Any:
        types = self.params[name]
        fn = getattr(self.lib, f"run_{name}")

        def launch(grid: int, block: int, *args: Any) -> None:
            assert len(args) == len(types), name
            values = [
                ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else t(a)
                for a, t in zip(args, types, strict=True)
            ]
            self.launched.append(name)
            fn(ctypes.c_uint(grid), ctypes.c_uint(block), *values)

        return launch


def _matrices(
    t: torch.Tensor, rows: int, cols: int, ld: int, stride: int, count: int
) -> np.ndarray:
    """The column-major ``rows x cols`` matrices cuBLAS sees at ``t`` (``count`` of them)."""
    assert t.is_contiguous() and t.dtype == torch.float32
    assert ld >= max(1, rows), (ld, rows)
    flat = t.detach().numpy().reshape(-1)
    last = (count - 1) * stride + (rows - 1) + (cols - 1) * ld
    assert last < flat.size, f"cuBLAS would touch element {last} of a {flat.size}-element tensor"
    return np.lib.stride_tricks.as_strided(
        flat, shape=(count, rows, cols), strides=(stride * 4, 4, ld * 4)
    )


def sgemm_cpu(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch):  # noqa: ANN001
    if batch == 1:
        sa = sb = sc = 0
    am = _matrices(a, *((k, m) if ta else (m, k)), lda, sa, batch)
    bm = _matrices(b, *((n, k) if tb else (k, n)), ldb, sb, batch)
    cm = _matrices(c, m, n, ldc, sc, batch)
    opa = am.transpose(0, 2, 1) if ta else am
    opb = bm.transpose(0, 2, 1) if tb else bm
    result = np.matmul(opa.astype(np.float64), opb.astype(np.float64)).astype(np.float32)
    if sc == 0 and batch > 1:
        raise AssertionError("batched output with stride 0")
    cm[...] = result


