"""Run generated kernels on the CPU: g++ behind a small CUDA shim, a serial loop over threads.

Good for kernels whose threads do not talk to each other (grid-stride loops, per-thread
accumulators): shared memory, barriers and shuffles have no serial meaning, so kernels that use
them must not be launched here (the prelude that defines them still compiles). With
``cooperative=True`` every thread of a block runs as a coroutine (``ucontext``) instead: a
``__syncthreads()`` waits for the block's live threads, a shuffle for the live lanes of its warp
(each lane publishes its value, then reads its partner's), so warp- and block-level reductions
and scans run with CUDA's semantics, only serially.
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

from stitch_graph.codegen._cuda import ACTIVATIONS, PRELUDE
from stitch_graph.execution._common import load_module_state, module_state
from stitch_graph.runtime.kernels import KernelLibrary
from stitch_graph.runtime.problem_source import exec_problem

_SHIM = r"""
#include <math.h>
#include <algorithm>
struct sg_dim3 { unsigned x, y, z; };
static sg_dim3 blockIdx, threadIdx, gridDim, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline float __int_as_float(int v) { float f; __builtin_memcpy(&f, &v, 4); return f; }
static inline float __uint_as_float(unsigned v) { float f; __builtin_memcpy(&f, &v, 4); return f; }
static inline unsigned __float_as_uint(float v) { unsigned u; __builtin_memcpy(&u, &v, 4); return u; }
static inline float atomicAdd(float* p, float v) { const float old = *p; *p = old + v; return old; }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned old = *p; *p = old + v; return old; }
static inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) {
  const unsigned old = *p; if (old == cmp) *p = v; return old;
}
#define __shared__ static
using std::min;
using std::max;
static inline float rsqrtf(float v) { return 1.f / sqrtf(v); }
#define __expf expf  // glibc declares these names itself
#define __logf logf
static inline float __fdividef(float a, float b) { return a / b; }
// CUDA math functions the C library lacks, in double precision
static inline float normcdff(float x) { return (float)(0.5 * erfc(-(double)x / sqrt(2.0))); }
static inline float erfcxf(float x) { double d = x; return (float)(exp(d * d) * erfc(d)); }
static inline double sg_erfinv(double y) {
  if (y <= -1.0) return -INFINITY;
  if (y >= 1.0) return INFINITY;
  double w = -log((1.0 - y) * (1.0 + y)), x = copysign(sqrt(w), y) * 0.8;
  for (int i = 0; i < 60; ++i) x -= (erf(x) - y) / (2.0 / sqrt(M_PI) * exp(-x * x));
  return x;
}
static inline float erfinvf(float y) { return (float)sg_erfinv(y); }
static inline float normcdfinvf(float p) { return (float)(sqrt(2.0) * sg_erfinv(2.0 * p - 1.0)); }
static inline float cyl_bessel_i0f(float x) {
  double t = 1.0, s = 1.0, q = 0.25 * (double)x * x;
  for (int k = 1; k < 200; ++k) { t *= q / ((double)k * k); s += t; }
  return (float)s;
}
struct float2 { float x, y; };
struct float3 { float x, y, z; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float3 make_float3(float a, float b, float c) { return {a, b, c}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
"""
_SERIAL_SYNC = r"""
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
static inline void __syncthreads() {}
static inline void __syncwarp(unsigned = 0xffffffffu) {}
static inline int __syncthreads_or(int) { return 1; }  // no block to ask: nothing is skipped
"""
# block threads as coroutines: barriers and shuffles with CUDA's semantics (all lanes take part)
_COOPERATIVE_SYNC = r"""
#include <stdlib.h>
#include <ucontext.h>
#include <functional>
#include <vector>
struct SgThread { ucontext_t ctx; bool done; };
static ucontext_t sg_main;
static std::vector<SgThread> sg_threads;
// the threads' stacks: malloc'd, not zero-filled, so only the pages a thread touches become
// resident (a zero-filled vector made 256 MiB resident per library for 1024-thread blocks, and
// the loaded libraries of a test session stay)
static char* sg_stacks = nullptr;
static size_t sg_stacks_size = 0;
static const size_t sg_stack_size = 256 * 1024;
static int sg_cur = 0;
static std::function<void()> sg_body;
static unsigned long long sg_slots[1024];
static int sg_warp_count[32];
static unsigned sg_warp_gen[32];
static int sg_block_count;
static unsigned sg_block_gen;
static void sg_yield() { swapcontext(&sg_threads[sg_cur].ctx, &sg_main); }
static int sg_alive(int first, int count) {
  int n = 0;
  for (int t = first; t < first + count && t < (int)sg_threads.size(); ++t) n += !sg_threads[t].done;
  return n;
}
static void sg_wait(int* count, unsigned* gen, int alive) {
  const unsigned g = *gen;
  if (++*count >= alive) { *count = 0; ++*gen; return; }
  while (*gen == g) sg_yield();
}
static void sg_warp_sync() { const int w = sg_cur >> 5; sg_wait(&sg_warp_count[w], &sg_warp_gen[w], sg_alive(w * 32, 32)); }
static inline void __syncthreads() { sg_wait(&sg_block_count, &sg_block_gen, sg_alive(0, sg_threads.size())); }
static inline void __syncwarp(unsigned = 0xffffffffu) { sg_warp_sync(); }
static int sg_or_flag;
static inline int __syncthreads_or(int p) {  // thread 0 clears, every thread adds, all read
  __syncthreads();
  if (sg_cur == 0) sg_or_flag = 0;
  __syncthreads();
  if (p) sg_or_flag = 1;
  __syncthreads();
  return sg_or_flag;
}
template <class T> static T sg_exchange(T v, int lane) {
  __builtin_memcpy(&sg_slots[sg_cur], &v, sizeof(T));
  sg_warp_sync();
  T r;
  __builtin_memcpy(&r, &sg_slots[(sg_cur & ~31) + lane], sizeof(T));
  sg_warp_sync();
  return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) { return sg_exchange(v, (sg_cur & 31) ^ o); }
template <class T> static inline T __shfl_sync(unsigned, T v, int src) { return sg_exchange(v, src & 31); }
template <class T> static inline T __shfl_up_sync(unsigned, T v, int o) {
  const int lane = sg_cur & 31;
  return sg_exchange(v, lane >= o ? lane - o : lane);
}
static void sg_entry() { sg_body(); sg_threads[sg_cur].done = true; }
static void sg_run_block(unsigned threads) {
  sg_threads.assign(threads, SgThread());
  if (sg_stacks_size < threads * sg_stack_size) {
    free(sg_stacks);
    sg_stacks_size = threads * sg_stack_size;
    sg_stacks = static_cast<char*>(malloc(sg_stacks_size));
  }
  for (int w = 0; w < 32; ++w) { sg_warp_count[w] = 0; }
  sg_block_count = 0;
  for (unsigned t = 0; t < threads; ++t) {
    getcontext(&sg_threads[t].ctx);
    sg_threads[t].ctx.uc_stack.ss_sp = sg_stacks + t * sg_stack_size;
    sg_threads[t].ctx.uc_stack.ss_size = sg_stack_size;
    sg_threads[t].ctx.uc_link = &sg_main;
    sg_threads[t].done = false;
    makecontext(&sg_threads[t].ctx, sg_entry, 0);
  }
  for (bool left = true; left;) {
    left = false;
    for (unsigned t = 0; t < threads; ++t) {
      if (sg_threads[t].done) continue;
      sg_cur = t;
      threadIdx = {t, 0, 0};
      swapcontext(&sg_main, &sg_threads[t].ctx);
      if (!sg_threads[t].done) { left = true; continue; }
      // a finished thread no longer holds its warp or block back
      const int w = t >> 5;
      if (sg_warp_count[w] && sg_warp_count[w] >= sg_alive(w * 32, 32)) { sg_warp_count[w] = 0; ++sg_warp_gen[w]; }
      if (sg_block_count && sg_block_count >= sg_alive(0, threads)) { sg_block_count = 0; ++sg_block_gen; }
    }
  }
}
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

    def __init__(
        self,
        kernel_source: str,
        workdir: Path,
        *,
        with_prelude: bool = False,
        cooperative: bool = False,
    ) -> None:
        assert kernel_source.startswith(PRELUDE)
        body = kernel_source[len(PRELUDE) :]
        sync = _COOPERATIVE_SYNC if cooperative else _SERIAL_SYNC
        head = _SHIM + sync + (PRELUDE if with_prelude or cooperative else _PRELUDE_STANDINS + ACTIVATIONS)
        wrappers, self.params = [], {}
        for name, params in _KERNEL.findall(body):
            parts = [p.strip() for p in params.split(",")]
            names = [re.findall(r"\w+", p)[-1] for p in parts]
            types = [
                ctypes.c_void_p if "*" in p else _CTYPES[re.sub(r"\s*\w+$", "", p).strip()]
                for p in parts
            ]
            self.params[name] = types
            if cooperative:
                launch = (
                    "  for (unsigned bx = 0; bx < g; ++bx) {\n"
                    "    blockIdx = {bx, 0, 0};\n"
                    f"    sg_body = [&]() {{ {name}({', '.join(names)}); }};\n"
                    "    sg_run_block(b);\n"
                    "  }\n"
                )
            else:
                launch = (
                    "  for (unsigned bx = 0; bx < g; ++bx) for (unsigned tx = 0; tx < b; ++tx) {\n"
                    "    blockIdx = {bx, 0, 0}; threadIdx = {tx, 0, 0};\n"
                    f"    {name}({', '.join(names)});\n"
                    "  }\n"
                )
            wrappers.append(
                f'extern "C" void run_{name}(unsigned g, unsigned b, {params}) {{\n'
                "  gridDim = {g, 1, 1}; blockDim = {b, 1, 1};\n" + launch + "}"
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
        self.engines: list[int] = []

    def conv(self, x, w, y, stride, padding, dilation, groups=1, engine=0) -> None:  # noqa: ANN001
        """The runtime's cuDNN convolution, computed by PyTorch on the CPU (every engine
        computes the same convolution; the chosen one is recorded in ``engines``)."""
        self.engines.append(engine)
        self._library_conv(False, x, w, y, stride, padding, dilation, groups)

    def conv_transpose(self, x, w, y, stride, padding, dilation, groups=1, engine=0) -> None:  # noqa: ANN001
        """The runtime's cuDNN transposed convolution; ``y``'s shape gives the output padding."""
        self.engines.append(engine)
        self._library_conv(True, x, w, y, stride, padding, dilation, groups)

    def _library_conv(self, transposed, x, w, y, stride, padding, dilation, groups) -> None:  # noqa: ANN001
        nd = x.dim() - 2
        assert x.is_contiguous() and w.is_contiguous() and y.is_contiguous()
        assert len(stride) == len(padding) == len(dilation) == nd
        self.launched.append("conv_transpose" if transposed else "conv")
        if transposed:
            natural = [
                (i - 1) * s - 2 * p + d * (k - 1) + 1
                for i, k, s, p, d in zip(x.shape[2:], w.shape[2:], stride, padding, dilation)
            ]
            extra = [o - n for o, n in zip(y.shape[2:], natural, strict=True)]
            fn = getattr(torch.nn.functional, f"conv_transpose{nd}d")
            result = fn(x, w, None, stride, padding, extra, groups, dilation)
        else:
            fn = getattr(torch.nn.functional, f"conv{nd}d")
            result = fn(x, w, None, stride, padding, dilation, groups)
        assert result.shape == y.shape, (result.shape, y.shape)
        y.copy_(result)

    def graphed(self, module: Any, launch: Any, *args: Any) -> Any:
        """The runtime's CUDA-graph replay, here a plain call of the launch function."""
        return launch(*args)

    guard = staticmethod(KernelLibrary.guard)
    rnn_weights = staticmethod(KernelLibrary.rnn_weights)  # CPU weights: returned as they are

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
    """The column-major ``rows x cols`` matrices cuBLAS sees at ``t`` (``count`` of them).

    A strided view (a transposed operand) is read from its storage, as cuBLAS reads its pointer.
    """
    assert t.dtype == torch.float32
    if not t.is_contiguous():
        t = t.as_strided((t.untyped_storage().nbytes() // 4 - t.storage_offset(),), (1,))
    assert ld >= max(1, rows), (ld, rows)
    flat = t.detach().numpy().reshape(-1)
    last = (count - 1) * stride + (rows - 1) + (cols - 1) * ld
    assert last < flat.size, f"cuBLAS would touch element {last} of a {flat.size}-element tensor"
    return np.lib.stride_tricks.as_strided(
        flat, shape=(count, rows, cols), strides=(stride * 4, 4, ld * 4)
    )


def sgemm_cpu(  # noqa: ANN201
    ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch, algo=0, bias=None, relu=False  # noqa: ANN001
):
    """Every ``algo`` computes the same product: the emulation is exact for all of them.
    ``bias`` (one value a row of C, ``m`` of them) and ``relu`` as cuBLASLt's epilogue."""
    if batch == 1:
        sa = sb = sc = 0
    am = _matrices(a, *((k, m) if ta else (m, k)), lda, sa, batch)
    bm = _matrices(b, *((n, k) if tb else (k, n)), ldb, sb, batch)
    cm = _matrices(c, m, n, ldc, sc, batch)
    opa = am.transpose(0, 2, 1) if ta else am
    opb = bm.transpose(0, 2, 1) if tb else bm
    result = np.matmul(opa.astype(np.float64), opb.astype(np.float64))
    if bias is not None:
        assert bias.shape == (m,), (bias.shape, m)
        result = result + bias.detach().numpy().astype(np.float64)[:, None]
    if relu:
        result = np.maximum(result, 0.0)
    result = result.astype(np.float32)
    if sc == 0 and batch > 1:
        raise AssertionError("batched output with stride 0")
    cm[...] = result




def generate_checked(source: str, tuning: Any = None) -> tuple[Any, Any]:
    """The task of a problem's ``source`` and its generated program, after asserting that the
    static checks accept the program and, where nvcc is installed, that its kernels compile."""
    from stitch_graph.checks import check_candidate
    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task
    from stitch_graph.toolchain.nvcc import find_nvcc, nvcc_compile

    task = load_task(source)
    ir = capture_program(task)
    program = emit_candidate(ir, plan_program(ir), tuning=tuning)
    assert not check_candidate(program, reference_source=task.source).rejected
    if find_nvcc() is not None:
        assert nvcc_compile(program.kernel_source).ok
    return task, program


def load_on_cpu(
    task: Any, cand: Any, workdir: Path, *, cooperative: bool = False
) -> tuple[CpuKernels, dict[str, Any], dict[str, Any]]:
    """The generated program's kernels built for the CPU, its host module's namespace (with
    ``_sgemm`` emulated) and the reference's namespace, both executed."""
    kernels = CpuKernels(cand.kernel_source, workdir, cooperative=cooperative)
    host: dict[str, Any] = {"__name__": "candidate", "KERNELS": kernels}
    exec(compile(cand.host_source, "<candidate>", "exec"), host)
    host["_sgemm"] = sgemm_cpu
    ns = exec_problem(task.source, "<reference>", "reference")
    return kernels, host, ns


def check_on_cpu(
    task: Any,
    cand: Any,
    workdir: Path,
    *,
    cooperative: bool = False,
    rtol: float = 1e-4,
    atol: float = 1e-4,
) -> CpuKernels:
    """Run a generated ``ModelNew`` on the CPU and assert it matches the task's reference.

    Both models get the same weights: the reference's parameters and persistent floating buffers
    are perturbed first, so zero biases and identity batch-norm statistics cannot hide a wrong
    epilogue. ``_sgemm`` is replaced by :func:`sgemm_cpu`. Returns the kernels (what was
    launched is in ``kernels.launched``).
    """
    kernels, host, ns = load_on_cpu(task, cand, workdir, cooperative=cooperative)
    torch.manual_seed(0)
    reference = ns["Model"](*ns["get_init_inputs"]()).eval()
    state = reference.state_dict()
    with torch.no_grad():
        for prm in reference.parameters():
            prm.add_(0.1 * torch.randn_like(prm))
        for name, buf in reference.named_buffers():
            if name in state and buf.is_floating_point():
                buf.add_(0.1 * torch.rand_like(buf))
    model = host["ModelNew"](*ns["get_init_inputs"]())
    load_module_state(model, module_state(reference))
    torch.manual_seed(1)
    inputs = ns["get_inputs"]()
    with torch.no_grad():
        # copies for the candidate: a reference that writes into its inputs must not change them
        got = model(*[t.clone() if torch.is_tensor(t) else t for t in inputs])
        expected = reference(*inputs)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    return kernels


def planned_kernels(source: str) -> int:
    """How many kernels the plan of problem ``source`` has."""
    from stitch_graph.codegen import capture_program, plan_program
    from stitch_graph.task import load_task

    return len(plan_program(capture_program(load_task(source))).items)


def check_rewrite_saves_kernels(source: str, workdir: Path, monkeypatch: Any, rewrite: str) -> None:
    """Assert that the program of ``source`` is fully generated, matches PyTorch in the
    cooperative emulation, and has fewer kernels than with the capture rewrite ``rewrite`` (a
    name ``_capture_lower`` calls) left out."""
    from stitch_graph.codegen import _capture_lower

    task, program = generate_checked(source)
    assert not program.declared_torch_ops
    check_on_cpu(task, program, workdir, cooperative=True)
    fewer = planned_kernels(source)
    monkeypatch.setattr(_capture_lower, rewrite, lambda ir: None)
    assert fewer < planned_kernels(source)
