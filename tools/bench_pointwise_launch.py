"""How a pointwise kernel's launch shape moves its bandwidth: ReLU on the GPU against torch.relu.

Each variant reads float4s and writes float4s; they differ in how many float4s a thread handles
per step of its grid-stride loop (U), whether loads and stores carry streaming hints, and
whether the grid is capped at 32 blocks per SM or covers the data with one step per thread
(``waves=0``). Medians of 15 CUDA-event timings per variant, after three warm-up calls; every
variant's output is compared with torch.relu's. The code generator's default launch and its
tuning space follow from this table.

Usage: ``PYTHONPATH=src python tools/bench_pointwise_launch.py``
"""

from __future__ import annotations

import torch

from stitch_graph.runtime.kernels import KernelLibrary

_SMS = 132  # the H200's SMs, as the code generator assumes
_VARIANTS = [(1, "", ""), (2, "", ""), (4, "", ""), (8, "", ""), (1, "__ldcs", "__stcs"),
             (2, "__ldcs", "__stcs"), (4, "__ldcs", "__stcs"), (2, "__ldg", "")]
_SHAPES = [(4096, 393216), (16, 1024, 1024), (128, 4096, 128)]


def _source(unroll: int, load: str, store: str) -> str:
    read = f"{load}(reinterpret_cast<const float4*>(a0) + j)" if load else (
        "reinterpret_cast<const float4*>(a0)[j]")
    write = f"{store}(reinterpret_cast<float4*>(out) + j, r);" if store else (
        "reinterpret_cast<float4*>(out)[j] = r;")
    tile = 256 * unroll
    return f"""
extern "C" __global__ __launch_bounds__(256) void k_u{unroll}{load}{store}(
    const float* __restrict__ a0, float* __restrict__ out, long long n4) {{
  for (long long j0 = (long long)blockIdx.x * {tile} + threadIdx.x; j0 < n4;
       j0 += (long long)gridDim.x * {tile}) {{
    float4 v[{unroll}];
#pragma unroll
    for (int u = 0; u < {unroll}; ++u) {{ long long j = j0 + u * 256; if (j < n4) v[u] = {read}; }}
#pragma unroll
    for (int u = 0; u < {unroll}; ++u) {{
      long long j = j0 + u * 256;
      if (j < n4) {{
        float4 r = make_float4(fmaxf(v[u].x, 0.f), fmaxf(v[u].y, 0.f), fmaxf(v[u].z, 0.f),
                               fmaxf(v[u].w, 0.f));
        {write}
      }}
    }}
  }}
}}
"""


def _median_ms(fn, runs: int = 15) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[runs // 2]


def main() -> None:
    lib = KernelLibrary("".join(_source(*v) for v in _VARIANTS))
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__}")
    for shape in _SHAPES:
        x = torch.randn(shape, device="cuda")
        y = torch.empty_like(x)
        n4 = x.numel() // 4
        base = _median_ms(lambda: torch.relu(x))  # noqa: B023 - timed at once
        gbs = 2 * x.numel() * 4 / 1e6 / base
        print(f"shape {shape}: torch.relu {base:.3f} ms ({gbs:.0f} GB/s)")
        for unroll, load, store in _VARIANTS:
            name = f"k_u{unroll}{load}{store}"
            kernel = getattr(lib, name)
            for waves in (32, 0):
                tiles = -(-n4 // (256 * unroll))
                grid = min(tiles, _SMS * waves) if waves else tiles
                ms = _median_ms(lambda: kernel(grid, 256, x, y, n4))  # noqa: B023
                ok = torch.equal(y, torch.relu(x))
                print(f"  {name:22s} waves={waves:3d} grid={grid:8d}: {ms:.3f} ms  "
                      f"{base / ms:.3f}x torch  ok={ok}")


if __name__ == "__main__":
    main()
