"""The kernel launcher on a real GPU: every scalar type arrives intact, on PyTorch's stream."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

SOURCE = r"""
extern "C" __global__ void pack(double* out, float a, int b, long long c, unsigned int d,
                                double e, bool f, short g) {
  out[0] = a; out[1] = b; out[2] = (double)c; out[3] = d; out[4] = e; out[5] = f; out[6] = g;
}
extern "C" __global__ void fill(float* out, float value, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = value;
}
"""


def test_scalars_of_every_type_arrive_intact() -> None:
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    library = KernelLibrary(SOURCE)
    out = torch.zeros(7, dtype=torch.float64, device="cuda")
    library.pack(1, 1, out, 1.5, -7, 2**40 + 3, 4_000_000_000, 0.125, True, -300)
    torch.cuda.synchronize()
    assert out.tolist() == [1.5, -7.0, float(2**40 + 3), 4e9, 0.125, 1.0, -300.0]


def test_launch_follows_the_current_stream_and_is_cheap() -> None:
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    library = KernelLibrary(SOURCE)
    n = 1 << 24
    out = torch.zeros(n, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy for tens of milliseconds
        library.fill(1024, 256, out, 3.0, n)
    assert not side.query()  # queued behind the sleep: it was launched on the side stream
    side.synchronize()
    assert float(out.min()) == float(out.max()) == 3.0

    for _ in range(100):
        library.fill(1, 32, out, 1.0, 32)
    torch.cuda.synchronize()
    costs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(1000):
            library.fill(1, 32, out, 1.0, 32)
        costs.append((time.perf_counter() - start) / 1000 * 1e6)
        torch.cuda.synchronize()
    per_launch_us = statistics.median(costs)
    print(f"host cost per launch: {per_launch_us:.1f} us")
    assert per_launch_us < 20.0


def test_graphed_forward_recomputes_on_every_call() -> None:
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    library = KernelLibrary(
        SOURCE
        + r"""
extern "C" __global__ void add_one(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + 1.f;
}
"""
    )

    class Chain(torch.nn.Module):
        def forward(self, x):
            return library.graphed(self, self._launch, x)

        def _launch(self, x):
            y = x
            for _ in range(6):  # six dependent launches, replayed as one graph
                out = torch.empty_like(y)
                library.add_one((y.numel() + 255) // 256, 256, y, out, y.numel())
                y = out
            return y

    def expected(x):
        for _ in range(6):  # the same six float additions, in the same order
            x = x + 1
        return x

    model = Chain()
    x = torch.randn(1000, device="cuda")
    first = model(x)
    assert torch.equal(first, expected(x))
    x.copy_(torch.randn(1000, device="cuda"))  # same address, new contents
    second = model(x)
    assert torch.equal(second, expected(x))
    assert first.data_ptr() != second.data_ptr()  # fresh outputs: the first one still holds
    assert not torch.equal(first, second)
    fresh = torch.randn(1000, device="cuda")  # same shape, new address: copied in, replayed
    assert torch.equal(model(fresh), expected(fresh))
    assert len(library._graphs) == 1
    other = torch.randn(500, device="cuda")  # a new shape: captured again
    assert torch.equal(model(other), expected(other))
    assert len(library._graphs) == 2
    assert torch.equal(model(x), expected(x))  # the first signature's graph still replays
    assert len(library._graphs) == 2


def test_generated_launch_bound_program_with_cublas_replays_correctly() -> None:
    import torch

    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.runtime.kernels import KernelLibrary
    from stitch_graph.task import load_task

    problem = ROOT / "tests" / "fixtures" / "codegen_problems" / "launch_bound_chain.py"
    task = load_task(problem)
    ir = capture_program(task)
    plan = plan_program(ir)
    assert plan.host.cuda_graph
    program = emit_candidate(ir, plan)
    library = KernelLibrary(program.kernel_source)
    host = {"KERNELS": library, "__name__": "candidate"}
    exec(compile(program.host_source, "<host>", "exec"), host)
    model = host["ModelNew"]().cuda()
    torch.backends.cuda.matmul.allow_tf32 = False

    def reference(x, w):
        return torch.softmax(torch.relu(x @ w).sum(dim=0, keepdim=True) * x, dim=1).mean(dim=0)

    x, w = torch.randn(8, 16, device="cuda"), torch.randn(16, 16, device="cuda")
    for _ in range(3):
        got = model(x, w)
        torch.testing.assert_close(got, reference(x, w), rtol=1e-5, atol=1e-5)
        x.copy_(torch.randn_like(x))
        w.copy_(torch.randn_like(w))
    entries = list(library._graphs.values())
    assert len(entries) == 1 and not isinstance(entries[0], str), entries  # captured, not refused


@pytest.mark.parametrize(
    ("transposed", "x_shape", "w_shape", "stride", "padding", "dilation", "groups", "extra"),
    [
        (False, (4, 8, 33, 17), (16, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, 0),
        (False, (2, 6, 40), (9, 2, 5), (2,), (1,), (2,), 3, 0),
        (False, (2, 4, 9, 10, 11), (8, 4, 3, 2, 3), (2, 1, 1), (1, 0, 1), (1, 2, 1), 1, 0),
        (True, (4, 8, 15, 16), (8, 6, 3, 3), (2, 2), (1, 1), (1, 1), 1, 1),
        (True, (2, 8, 6, 7, 5), (8, 2, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 4, 0),
        (True, (3, 5, 21), (5, 7, 4), (3,), (0,), (2,), 1, 2),
    ],
)
@pytest.mark.parametrize("graph_api", [True, False], ids=["graph-api", "legacy-api"])
def test_cudnn_convolutions_match_pytorch(
    transposed: bool, x_shape: tuple, w_shape: tuple, stride: tuple, padding: tuple,
    dilation: tuple, groups: int, extra: int, graph_api: bool,
) -> None:
    """``KERNELS.conv`` / ``conv_transpose`` agree with PyTorch (FP32, no TF32) on a side stream
    and inside a CUDA graph, through cuDNN's graph API and through its legacy API."""
    import torch
    import torch.nn.functional as F

    from stitch_graph.runtime.cudnn import Cudnn, _GraphPlan
    from stitch_graph.runtime.kernels import KernelLibrary

    torch.backends.cudnn.allow_tf32 = False
    nd = len(x_shape) - 2
    x = torch.randn(x_shape, device="cuda")
    w = torch.randn(w_shape, device="cuda")
    if transposed:
        fn = getattr(F, f"conv_transpose{nd}d")
        expected = fn(x, w, None, stride, padding, (extra,) * nd, groups, dilation)
    else:
        expected = getattr(F, f"conv{nd}d")(x, w, None, stride, padding, dilation, groups)
    library = KernelLibrary("")
    library._dnn = dnn = Cudnn(graph_api=graph_api)
    call = library.conv_transpose if transposed else library.conv
    y = torch.full_like(expected, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(x, w, y, stride, padding, dilation, groups)
    side.synchronize()
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    kinds = {type(plan) is _GraphPlan for plan in dnn._plans.values()}
    assert kinds == {graph_api}, "the convolution did not run through the API under test"

    graph_out = torch.full_like(expected, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(x, w, graph_out, stride, padding, dilation, groups)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    if transposed:
        again = fn(x, w, None, stride, padding, (extra,) * nd, groups, dilation)
    else:
        again = getattr(F, f"conv{nd}d")(x, w, None, stride, padding, dilation, groups)
    torch.testing.assert_close(graph_out, again, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("graph_api", [True, False], ids=["graph-api", "legacy-api"])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv-transpose"])
def test_every_cudnn_engine_rank_computes_the_same_convolution(
    transposed: bool, graph_api: bool
) -> None:
    """Each of the first FP32 engines the tuner may pick agrees with PyTorch, and a rank past the
    last engine falls back to the last one instead of failing."""
    import torch
    import torch.nn.functional as F

    from stitch_graph.runtime.cudnn import Cudnn
    from stitch_graph.runtime.kernels import KernelLibrary

    torch.backends.cudnn.allow_tf32 = False
    x = torch.randn(8, 16, 32, 32, device="cuda")
    w = torch.randn(16, 16, 3, 3, device="cuda")
    if transposed:
        expected = F.conv_transpose2d(x, w, None, 1, 1)
    else:
        expected = F.conv2d(x, w, None, 1, 1)
    library = KernelLibrary("")
    library._dnn = dnn = Cudnn(graph_api=graph_api)
    call = library.conv_transpose if transposed else library.conv
    for engine in (0, 1, 2, 3, 50):
        y = torch.full_like(expected, float("nan"))
        call(x, w, y, (1, 1), (1, 1), (1, 1), 1, engine=engine)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    assert len(dnn._plans) == 5  # one plan per engine rank


@pytest.mark.parametrize(
    ("ta", "tb", "m", "n", "k", "batch"),
    [(0, 0, 256, 192, 128, 1), (1, 0, 4096, 64, 1024, 1), (0, 1, 33, 17, 65, 1),
     (1, 1, 64, 48, 32, 6)],
)
def test_every_cublaslt_algorithm_computes_the_same_gemm(ta, tb, m, n, k, batch) -> None:
    """Each algo the tuner may pick (cuBLASLt's ranked ones, and past their end cuBLAS again)
    matches PyTorch's true-FP32 matmul, batched and transposed included."""
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    torch.backends.cuda.matmul.allow_tf32 = False
    library = KernelLibrary(SOURCE)
    # column-major op(A) m x k, op(B) k x n, C m x n: row-major tensors of the transposed shapes
    a = torch.randn(batch, *((m, k) if ta else (k, m)), device="cuda")
    b = torch.randn(batch, *((k, n) if tb else (n, k)), device="cuda")
    lda, ldb = a.shape[-1], b.shape[-1]
    # row-major C^T (n x m) = op(B)^T (n x k) @ op(A)^T (k x m)
    expected = (b.transpose(-1, -2) if tb else b) @ (a.transpose(-1, -2) if ta else a)
    for algo in range(5):
        c = torch.zeros(batch, n, m, device="cuda")
        library.sgemm(ta, tb, m, n, k, a, lda, a[0].numel(), b, ldb, b[0].numel(), c, m,
                      m * n, batch, algo)
        torch.cuda.synchronize()
        torch.testing.assert_close(c, expected, rtol=1e-4, atol=1e-4)
    lt = library._lt_handle
    assert lt and lt.algorithms((ta, tb, m, n, k, lda, a[0].numel(), ldb, b[0].numel(), m,
                                 m * n, batch)) >= 1


@pytest.mark.parametrize("relu", [False, True])
def test_cublaslt_epilogue_adds_a_linear_layers_bias(relu: bool) -> None:
    """A linear layer's GEMM with its bias (and ReLU) in cuBLASLt's epilogue, for every ranked
    algorithm, matches ``F.linear``; the plans asked for carry the epilogue."""
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    torch.backends.cuda.matmul.allow_tf32 = False
    library = KernelLibrary(SOURCE)
    x, w, b = (torch.randn(*s, device="cuda") for s in ((300, 96), (130, 96), (130,)))
    expected = torch.nn.functional.linear(x, w, b)
    expected = expected.relu() if relu else expected
    for algo in range(4):
        y = torch.full((300, 130), float("nan"), device="cuda")
        library.sgemm(1, 0, 130, 300, 96, w, 96, 0, x, 96, 0, y, 130, 300 * 130, 1, algo, b, relu)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    lt = library._lt_handle
    assert lt and any(key[-1] == ("relu_bias" if relu else "bias") for key in lt.plans)


def test_a_split_source_builds_in_parts_and_every_kernel_launches() -> None:
    """Twenty kernels built as four NVRTC parts at once: each kernel runs from its own part."""
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary
    from tests.runtime.test_split import source

    library = KernelLibrary(source(20), parts=4)
    assert len({id(m) for m in library._modules.values()}) > 1
    x = torch.arange(256, dtype=torch.float32, device="cuda")
    for i in range(20):
        out = torch.empty_like(x)
        getattr(library, f"k{i}_scale")(1, 256, x, out, 256)
        torch.testing.assert_close(out, 2 * x + i, rtol=0, atol=0)


def test_a_failed_capture_leaves_random_ops_working() -> None:
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    library = KernelLibrary(SOURCE)

    class Synchronising(torch.nn.Module):
        def forward(self, x):
            return library.graphed(self, self._body, x)

        def _body(self, x):
            scale = float(x.abs().max().item())  # a synchronising read invalidates the capture
            return x / scale

    x = torch.randn(1000, device="cuda")
    with pytest.warns(RuntimeWarning, match="capture failed"):
        out = Synchronising()(x)
    torch.testing.assert_close(out, x / x.abs().max())
    torch.randn(1000, device="cuda")  # raised "Offset increment outside graph capture" before
    torch.nn.functional.dropout(x, 0.5, training=True)


def test_inputs_at_the_same_addresses_are_read_in_place() -> None:
    """A refilled input buffer a second time: replayed from a graph that reads it where it is
    (no copy in), still recomputed from its new values; a 64 MiB input is then faster than
    with its copy in."""
    import itertools
    import statistics
    import time

    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    library = KernelLibrary(
        SOURCE
        + r"""
extern "C" __global__ void row_sum(const float* x, float* out, int rows, int n) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.f;
  for (int k = 0; k < n; ++k) s += x[(long long)k * rows + r];
  out[r] = s;
}
"""
    )

    class Sums(torch.nn.Module):
        def forward(self, x):
            return library.graphed(self, self._launch, x)

        def _launch(self, x):
            out = torch.empty(x.shape[1], device=x.device)
            library.row_sum((x.shape[1] + 255) // 256, 256, x, out, x.shape[1], x.shape[0])
            return out

    model = Sums()
    x = torch.randn(256, 65536, device="cuda")
    for _ in range(3):
        x.copy_(torch.randn_like(x))  # same address, new values
        torch.testing.assert_close(model(x), x.sum(0), rtol=1e-4, atol=1e-3)
    assert len(library._bound) == 1

    def per_call_ms(make_input) -> float:  # noqa: ANN001
        times = []
        for _ in range(20):
            value = make_input()
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(value)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    alternating = itertools.cycle([torch.randn_like(x), torch.randn_like(x)])  # never twice
    in_place = per_call_ms(lambda: x)
    copied = per_call_ms(lambda: next(alternating))
    print(f"64 MiB input read in place {in_place:.3f} ms, copied in {copied:.3f} ms")
    assert in_place < copied
