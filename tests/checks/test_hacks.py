"""Static hack checks: an honest program passes, each known trick is caught by its rule."""

from __future__ import annotations

import textwrap

import pytest

from stitch_graph.artifacts import Candidate
from stitch_graph.checks import HACK_RULES, HackReport, check_candidate

ADD_RELU_KERNEL = """
extern "C" __global__ void add_relu(const float* __restrict__ x, const float* __restrict__ b,
                                    float* __restrict__ out, int n) {
    // one thread per element, bounds-checked
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] + b[i];
        out[i] = v > 0.f ? v : 0.f;
    }
}
"""

HONEST_HOST = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = 256

    def _grid(self, n: int) -> int:
        return (n + self.block - 1) // self.block

    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        b = b.expand_as(x).contiguous()
        n = x.numel()
        if x.shape[0] > 1024 and x.dim() == 2:
            pass
        out = torch.empty_like(x)
        flat = out.view(-1)
        KERNELS.add_relu(self._grid(n), self.block, x.view(-1), b.view(-1), flat, n)
        return out.reshape(x.shape)
"""

REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, b):
        \"\"\"Add then clamp at zero.\"\"\"
        y = torch.add(x, b)
        return torch.relu(y)


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
"""


def _host(*parts: str, header: str = "import torch\nimport torch.nn as nn\n") -> str:
    """A ModelNew whose forward body is ``parts`` joined (each dedented, indented for you)."""
    body = "\n".join(textwrap.dedent(p).strip("\n") for p in parts) + "\n"
    return header + textwrap.dedent(
        """

        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x, b):
        """
    ) + textwrap.indent(textwrap.dedent(body), " " * 8)


def _candidate(host: str, kernel: str = ADD_RELU_KERNEL, **kwargs: object) -> Candidate:
    return Candidate(kernel_source=kernel, host_source=host, **kwargs)


LAUNCH = """
n = x.numel()
out = torch.empty_like(x)
KERNELS.add_relu((n + 255) // 256, 256, x, b, out, n)
"""

HACKS: list[tuple[str, str, str, str]] = [
    # (id, host, kernel, expected rule)
    (
        "torch_functional_call",
        _host("import torch.nn.functional as F\nreturn F.relu(x + b)"),
        ADD_RELU_KERNEL,
        "torch_compute",
    ),
    (
        "tensor_method_after_launch",
        _host(LAUNCH + "return out.sum(dim=0).exp()"),
        ADD_RELU_KERNEL,
        "torch_compute",
    ),
    (
        "matmul_operator",
        _host(LAUNCH + "return out @ b"),
        ADD_RELU_KERNEL,
        "torch_compute",
    ),
    (
        "torch_op_in_a_callback_handed_to_the_graph_runner",
        textwrap.dedent(
            """
            import torch
            import torch.nn as nn

            class ModelNew(nn.Module):
                def forward(self, x, b):
                    return KERNELS.graphed(self, self._launch, x, b)

                def _launch(self, x, b):
                    return torch.relu(x + b)
            """
        ),
        ADD_RELU_KERNEL,
        "torch_compute",
    ),
    (
        "submodule_call",
        textwrap.dedent(
            """
            import torch
            import torch.nn as nn

            class ModelNew(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.linear = nn.Linear(16, 16)

                def forward(self, x, b):
                    y = self.linear(x)
                    out = torch.empty_like(y)
                    KERNELS.add_relu(1, 256, y, b, out, y.numel())
                    return out
            """
        ),
        ADD_RELU_KERNEL,
        "torch_compute",
    ),
    (
        "subset_rows_then_torch_fills_rest",
        _host(
            """
            n = x.numel()
            half = x.shape[0] // 2
            out = torch.empty_like(x)
            KERNELS.add_relu((n // 2 + 255) // 256, 256, x, b, out, n // 2)
            out[half:] = torch.relu(x[half:] + b[half:])
            return out
            """
        ),
        ADD_RELU_KERNEL,
        "torch_compute",
    ),
    (
        "helper_function_computes",
        textwrap.dedent(
            """
            import torch
            import torch.nn as nn

            def _finish(t, bias):
                return t.clamp(min=0) * 1.0 + bias

            class ModelNew(nn.Module):
                def forward(self, x, b):
                    out = torch.empty_like(x)
                    KERNELS.add_relu(1, 256, x, b, out, x.numel())
                    return _finish(out, b)
            """
        ),
        ADD_RELU_KERNEL,
        "torch_compute",
    ),
    (
        "cache_on_self",
        _host(
            """
            if getattr(self, "_out", None) is not None:
                return self._out
            n = x.numel()
            out = torch.empty_like(x)
            KERNELS.add_relu((n + 255) // 256, 256, x, b, out, n)
            self._out = out
            return out
            """
        ),
        ADD_RELU_KERNEL,
        "output_cache",
    ),
    (
        "pointer_keyed_cache",
        _host(
            """
            key = (x.data_ptr(), b.data_ptr())
            cache = self.__dict__.setdefault("cache", {})
            if key in cache:
                return cache[key]
            n = x.numel()
            out = torch.empty_like(x)
            KERNELS.add_relu((n + 255) // 256, 256, x, b, out, n)
            cache[key] = out
            return out
            """
        ),
        ADD_RELU_KERNEL,
        "output_cache",
    ),
    (
        "lru_cache_decorator",
        textwrap.dedent(
            """
            import functools
            import torch
            import torch.nn as nn

            class ModelNew(nn.Module):
                @functools.lru_cache(maxsize=None)
                def forward(self, x, b):
                    out = torch.empty_like(x)
                    KERNELS.add_relu(1, 256, x, b, out, x.numel())
                    return out
            """
        ),
        ADD_RELU_KERNEL,
        "output_cache",
    ),
    (
        "global_last_result",
        textwrap.dedent(
            """
            import torch
            import torch.nn as nn

            _LAST = []

            class ModelNew(nn.Module):
                def forward(self, x, b):
                    if _LAST:
                        return _LAST[0]
                    out = torch.empty_like(x)
                    KERNELS.add_relu(1, 256, x, b, out, x.numel())
                    _LAST.append(out)
                    return out
            """
        ),
        ADD_RELU_KERNEL,
        "output_cache",
    ),
    (
        "constant_inside_tolerance",
        _host(
            """
            scratch = torch.empty_like(x)
            KERNELS.add_relu(1, 256, x, b, scratch, 1)
            return torch.zeros_like(x) + 1e-5
            """
        ),
        ADD_RELU_KERNEL,
        "constant_output",
    ),
    (
        "unwritten_allocation",
        _host(
            """
            scratch = torch.empty_like(x)
            out = torch.full_like(x, 0.5)
            KERNELS.add_relu(1, 256, x, b, scratch, 1)
            return out
            """
        ),
        ADD_RELU_KERNEL,
        "constant_output",
    ),
    (
        "item_branch",
        _host(
            """
            if x.max().item() < 0:
                return torch.zeros_like(x)
            """,
            LAUNCH,
            "return out",
        ),
        ADD_RELU_KERNEL,
        "input_branch",
    ),
    (
        "tensor_compare_branch",
        _host(LAUNCH + "return out if (x > 0).all() else b\n"),
        ADD_RELU_KERNEL,
        "input_branch",
    ),
    (
        "torch_compile",
        _host(LAUNCH + "return torch.compile(lambda t: t)(out)"),
        ADD_RELU_KERNEL,
        "codegen_call",
    ),
    (
        "compile_in_disguise",
        _host(LAUNCH + 'fast = getattr(torch, "comp" + "ile")\nreturn fast(lambda t: t)(out)'),
        ADD_RELU_KERNEL,
        "codegen_call",
    ),
    (
        "triton_import",
        _host(LAUNCH + "return out", header="import torch\nimport torch.nn as nn\nimport triton\n"),
        ADD_RELU_KERNEL,
        "codegen_call",
    ),
    (
        "cupy_elementwise",
        _host(
            """
            import cupy
            k = cupy.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = max(a + b, 0.f)")
            """,
            LAUNCH,
            "return out",
        ),
        ADD_RELU_KERNEL,
        "codegen_call",
    ),
    (
        "aten_direct",
        _host(LAUNCH + "return torch.ops.aten.relu.default(out)"),
        ADD_RELU_KERNEL,
        "codegen_call",
    ),
    (
        "imports_reference_model",
        _host(
            LAUNCH + "return out",
            header="import torch\nimport torch.nn as nn\nfrom problem import Model\n",
        ),
        ADD_RELU_KERNEL,
        "reference_access",
    ),
    (
        "inspects_modules",
        _host("import sys\nref = sys.modules['__main__']\n" + LAUNCH + "return out"),
        ADD_RELU_KERNEL,
        "reference_access",
    ),
    (
        "torch_patched_at_import",
        _host(
            LAUNCH + "return out",
            header="import torch\nimport torch.nn as nn\ntorch.cuda.synchronize = lambda: None\n",
        ),
        ADD_RELU_KERNEL,
        "timing_tamper",
    ),
    (
        "background_thread",
        _host(
            LAUNCH + "return out",
            header="import threading\nimport torch\nimport torch.nn as nn\n",
        ),
        ADD_RELU_KERNEL,
        "timing_tamper",
    ),
    (
        "fp16_cast",
        _host(
            """
            n = x.numel()
            xh = x.half()
            bh = b.to(torch.float16)
            out = torch.empty_like(xh)
            KERNELS.add_relu((n + 255) // 256, 256, xh, bh, out, n)
            return out
            """
        ),
        ADD_RELU_KERNEL,
        "precision_downgrade",
    ),
    (
        "tf32_switch",
        _host(
            LAUNCH + "return out",
            header="import torch\nimport torch.nn as nn\n"
            "torch.backends.cuda.matmul.allow_tf32 = True\n",
        ),
        ADD_RELU_KERNEL,
        "precision_downgrade",
    ),
    (
        "half_in_kernel",
        _host(LAUNCH + "return out"),
        ADD_RELU_KERNEL.replace(
            "float v = x[i] + b[i];", "float v = __half2float(__float2half(x[i]) + b[i]);"
        ),
        "precision_downgrade",
    ),
    (
        "copy_kernel",
        _host(LAUNCH + "return out"),
        """
        extern "C" __global__ void add_relu(const float* __restrict__ x, const float* b,
                                            float* out, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) {
                float v = x[i];
                out[i] = v;
            }
        }
        """,
        "trivial_kernel",
    ),
    (
        "copy_kernel_through_shared_memory",
        _host(LAUNCH + "return out"),
        """
        extern "C" __global__ void add_relu(const float* __restrict__ x, const float* b,
                                            float* out, int n) {
            __shared__ float staged[256];
            float* const st = staged;
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            st[threadIdx.x] = x[i];
            __syncthreads();
            if (i < n) {
                out[i] = st[threadIdx.x];
            }
        }
        """,
        "trivial_kernel",
    ),
    (
        "empty_kernel",
        _host(LAUNCH + "return out"),
        'extern "C" __global__ void add_relu(const float* x, const float* b, float* out, int n)'
        " { }",
        "trivial_kernel",
    ),
    (
        "no_launch",
        _host("out = torch.empty_like(x)\nreturn out"),
        ADD_RELU_KERNEL,
        "no_kernel_launch",
    ),
    (
        "cupy_module_from_a_prebuilt_binary",
        _host(
            LAUNCH + "return out",
            header="import cupy\nimport torch\nimport torch.nn as nn\n"
            "_MOD = cupy.RawModule(path='fast.cubin')\n",
        ),
        ADD_RELU_KERNEL,
        "opaque_build",
    ),
    (
        "load_inline_cpp_calls_aten",
        textwrap.dedent(
            '''
            import torch
            import torch.nn as nn
            from torch.utils.cpp_extension import load_inline

            CUDA = """
            __global__ void unused(float* y) { y[0] = y[0] * 2.f + 1.f; }
            torch::Tensor run(torch::Tensor x, torch::Tensor b) { return at::relu(x + b); }
            """
            ext = load_inline("e", "torch::Tensor run(torch::Tensor x, torch::Tensor b);",
                              cuda_sources=CUDA, functions=["run"])

            class ModelNew(nn.Module):
                def forward(self, x, b):
                    return ext.run(x, b)
            '''
        ),
        "",
        "extension_torch_compute",
    ),
    (
        "cupy_routine_computes",
        _host(
            LAUNCH + "return torch.as_tensor(cupy.maximum(cupy.asarray(out), 0), device='cuda')",
            header="import cupy\nimport torch\nimport torch.nn as nn\n",
        ),
        ADD_RELU_KERNEL,
        "library_compute",
    ),
]


def test_rules_documented() -> None:
    expected = {rule for _, _, _, rule in HACKS}
    assert expected <= set(HACK_RULES)
    assert all(text.strip() for text in HACK_RULES.values())


def test_honest_candidate_is_clean() -> None:
    report = check_candidate(_candidate(HONEST_HOST), reference_source=REFERENCE)
    assert isinstance(report, HackReport)
    assert report.findings == [], report.findings
    assert not report.rejected
    assert report.declared_uses == []


def test_honest_candidate_with_workspace_on_self() -> None:
    host = textwrap.dedent(
        """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.out = None

            def forward(self, x, b):
                n = x.numel()
                if self.out is None or self.out.shape != x.shape:
                    self.out = torch.empty_like(x)
                KERNELS.add_relu((n + 255) // 256, 256, x, b, self.out, n)
                return self.out
        """
    )
    assert check_candidate(_candidate(host)).findings == []


def test_honest_candidate_replayed_from_a_cuda_graph() -> None:
    host = textwrap.dedent(
        """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def forward(self, x, b):
                return KERNELS.graphed(self, self._launch, x, b)

            def _launch(self, x, b):
                n = x.numel()
                out = torch.empty_like(x)
                KERNELS.add_relu((n + 255) // 256, 256, x, b, out, n)
                return out
        """
    )
    assert check_candidate(_candidate(host), reference_source=REFERENCE).findings == []


@pytest.mark.parametrize(
    ("host", "kernel", "rule"),
    [pytest.param(h, k, r, id=i) for i, h, k, r in HACKS],
)
def test_hack_is_flagged(host: str, kernel: str, rule: str) -> None:
    report = check_candidate(_candidate(host, kernel), reference_source=REFERENCE)
    assert report.rejected
    assert rule in report.rules, report.findings


def test_at_least_eighteen_hacks_cover_every_rule() -> None:
    assert len(HACKS) >= 18
    covered = {rule for _, _, _, rule in HACKS}
    hack_rules = set(HACK_RULES) - {"declared_torch_op", "host_syntax_error", "missing_model_new"}
    assert hack_rules <= covered


def test_copied_reference_forward() -> None:
    host = _host(
        """
        out = torch.empty_like(x)
        KERNELS.add_relu(1, 256, x, b, out, 1)
        y = torch.add(x, b)
        return torch.relu(y)
        """
    )
    report = check_candidate(_candidate(host), reference_source=REFERENCE)
    assert "reference_access" in report.rules
    assert "torch_compute" in report.rules


def test_declared_partial_program_is_allowed() -> None:
    host = _host(
        """
        y = torch.nn.functional.conv2d(x, b)
        n = y.numel()
        out = torch.empty_like(y)
        KERNELS.add_relu((n + 255) // 256, 256, y, y, out, n)
        return out
        """
    )
    report = check_candidate(_candidate(host, declared_torch_ops=["conv2d"]))
    assert not report.rejected, report.findings
    assert "conv2d" in report.declared_uses
    assert [n.rule for n in report.notes] == ["declared_torch_op"]


def test_declared_op_matches_other_spellings() -> None:
    host = _host(
        """
        y = torch.nn.functional.conv2d(x, b)
        out = torch.empty_like(y)
        KERNELS.add_relu(1, 256, y, y, out, y.numel())
        return out
        """
    )
    report = check_candidate(_candidate(host, declared_torch_ops=["aten.convolution"]))
    assert not report.rejected
    assert report.declared_uses == ["conv2d"]


def test_undeclared_conv_is_rejected() -> None:
    host = _host(
        """
        y = torch.nn.functional.conv2d(x, b)
        out = torch.empty_like(y)
        KERNELS.add_relu(1, 256, y, y, out, y.numel())
        return out
        """
    )
    report = check_candidate(_candidate(host))
    assert report.rejected
    assert "torch_compute" in report.rules
    assert report.declared_uses == []


def test_half_kernel_allowed_for_fp16_reference() -> None:
    kernel = ADD_RELU_KERNEL.replace("float v = x[i] + b[i];", "float v = __half2float(h[i]);")
    host = _host(LAUNCH + "return out")
    fp32 = check_candidate(_candidate(host, kernel))
    fp16 = check_candidate(_candidate(host, kernel), reference_dtype="float16")
    assert "precision_downgrade" in fp32.rules
    assert "precision_downgrade" not in fp16.rules


def test_shape_branches_and_int_arithmetic_are_fine() -> None:
    host = _host(
        """
        rows, cols = x.shape
        block = 128 if cols < 1024 else 256
        grid = (rows * cols + block - 1) // block
        out = torch.empty((rows, cols), device=x.device, dtype=x.dtype)
        while grid > 65535:
            grid = grid // 2
        KERNELS.add_relu(grid, block, x, b, out, rows * cols)
        return out
        """
    )
    assert check_candidate(_candidate(host)).findings == []


def test_syntax_error_and_missing_model() -> None:
    broken = check_candidate(_candidate("def forward(:\n"))
    assert broken.rules == ["host_syntax_error"]
    missing = check_candidate(_candidate("import torch\n"))
    assert missing.rules == ["missing_model_new"]


ONE_LINERS: list[tuple[str, str, str, str]] = [
    # (id, module-level prefix, forward statement(s), expected rule)
    ("bool_of_tensor", "", "if bool(x.max()):\n    pass", "input_branch"),
    ("torch_equal", "", "if torch.equal(x, b):\n    pass", "input_branch"),
    ("while_any", "", "while (x < 0).any():\n    break", "input_branch"),
    ("setattr_torch", "setattr(torch, 'mm', None)\n", "", "timing_tamper"),
    ("sleep", "import time\n", "time.sleep(0.01)", "timing_tamper"),
    ("os_system", "import os\n", "os.system('true')", "timing_tamper"),
    ("cuda_event", "", "e = torch.cuda.Event(enable_timing=True)", "timing_tamper"),
    ("exec", "", "exec('y = 1')", "codegen_call"),
    ("dunder_import", "", "m = __import__('tor' + 'ch')", "codegen_call"),
    ("jit_script", "@torch.jit.script\ndef f(a):\n    return a\n", "", "codegen_call"),
    ("gc_objects", "import gc\n", "objs = gc.get_objects()", "reference_access"),
    ("open_file", "", "src = open('problem.py').read()", "reference_access"),
    ("get_inputs", "", "ins = get_inputs()", "reference_access"),
    ("gelu_import", "from torch.nn.functional import gelu\n", "x = gelu(x)", "torch_compute"),
    ("copy_into_out", "", "tmp = torch.empty_like(x)\ntmp.copy_(x)", "torch_compute"),
    ("set_precision", "torch.set_float32_matmul_precision('high')\n", "", "precision_downgrade"),
]


@pytest.mark.parametrize(
    ("prefix", "statements", "rule"),
    [pytest.param(p, s, r, id=i) for i, p, s, r in ONE_LINERS],
)
def test_one_line_tricks(prefix: str, statements: str, rule: str) -> None:
    host = _host(statements, LAUNCH, "return out", header="import torch\nimport torch.nn as nn\n"
                 + prefix)
    report = check_candidate(_candidate(host))
    assert rule in report.rules, report.findings


def test_a_cublas_call_in_a_helper_counts_as_writing_the_output():
    host = '''
import torch
from cupy.cuda import cublas


def _gemm(a, b, c):
    handle = 0
    cublas.sgemm(handle, 0, 0, 4, 4, 4, 1, a.data_ptr(), 4, b.data_ptr(), 4, 0, c.data_ptr(), 4)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty(4, 4, device=a.device)
        _gemm(a, b, out)
        relu = torch.empty_like(out)
        KERNELS.relu(1, 16, out, relu, 16)
        return relu
'''
    kernel = 'extern "C" __global__ void relu(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = fmaxf(x[i], 0.f); }'
    report = check_candidate(Candidate(kernel_source=kernel, host_source=host))
    assert not report.rejected, report.findings


FUNCTIONAL_VIEWS = [
    "torch.flatten(out, 1)",
    "torch.reshape(out, (-1,))",
    "torch.transpose(out, 0, 1)",
    "torch.squeeze(torch.unsqueeze(out, 0), 0)",
    "torch.permute(out, (1, 0))",
    "torch.narrow(out, 0, 0, 2)",
    "torch.select(out, 0, 1)",
    "torch.chunk(out, 2)[0]",
    "torch.split(out, 2)[1]",
    "torch.unbind(out)[0]",
    "torch.t(out)",
    "torch.movedim(out, 0, 1)",
    "torch.swapaxes(out, 0, 1)",
    "torch.Tensor.view(out, -1)",
    "torch.Tensor.contiguous(torch.t(out))",
]


@pytest.mark.parametrize("expr", FUNCTIONAL_VIEWS)
def test_functional_views_pass_like_methods(expr: str) -> None:
    """``torch.flatten(x, 1)`` is the same view as ``x.flatten(1)``: neither is compute."""
    report = check_candidate(_candidate(_host(LAUNCH, f"return {expr}")))
    assert report.findings == [], report.findings


@pytest.mark.parametrize(
    ("statements", "rule"),
    [
        ("return torch.flatten(torch.zeros_like(x) + 1e-5)", "constant_output"),
        ("return torch.Tensor.add(out, b)", "torch_compute"),
        ("return torch.flatten(out.exp(), 1)", "torch_compute"),
    ],
)
def test_functional_views_do_not_hide_work_or_constants(statements: str, rule: str) -> None:
    report = check_candidate(_candidate(_host(LAUNCH, statements)))
    assert rule in report.rules, report.findings


ADVANCED_INDEXING = [
    "return out[b > 0]",
    "return out[b]",
    "idx = torch.arange(2, device=x.device)\nreturn out[:, idx]",
    "return out[[0, 2]]",
    "out[b > 0] = 0.0\nreturn out",
    "idx = torch.nonzero(b)\nout[idx] = 1.0\nreturn out",
    "mask = x < b\nout[mask] = 1.0\nreturn out",
]


@pytest.mark.parametrize("statements", ADVANCED_INDEXING)
def test_advanced_indexing_is_torch_compute(statements: str) -> None:
    """A tensor, a mask or a list of positions as an index makes PyTorch gather or scatter."""
    report = check_candidate(_candidate(_host(LAUNCH, statements)))
    assert "torch_compute" in report.rules, report.findings
    assert any("advanced indexing" in f.detail for f in report.findings), report.findings


@pytest.mark.parametrize(
    "statements",
    [
        "return out[0]",
        "return out[:, 1:3]",
        "return out[None, ..., ::2]",
        "i = x.shape[0] - 1\nreturn out[i]",
        "half = n // 2\nreturn out[half:, 0]",
        "k = 2\nreturn out[k:k + 1, -1]",
    ],
)
def test_basic_indexing_stays_allowed(statements: str) -> None:
    report = check_candidate(_candidate(_host(LAUNCH, statements)))
    assert report.findings == [], report.findings


def test_declared_index_is_a_declared_use() -> None:
    host = _host(LAUNCH, "return out[b]")
    report = check_candidate(_candidate(host, declared_torch_ops=["index"]))
    assert not report.rejected, report.findings
    assert "index" in report.declared_uses


def test_a_value_computed_into_shared_memory_and_stored_from_it_is_work() -> None:
    """Results staged in shared memory so that consecutive lanes store them (the sliding
    pooling kernel) are computed there: the kernel is not a copy."""
    from stitch_graph.checks.kernels import _kernel_kind

    params = "const float* __restrict__ x, float* __restrict__ out"
    body = """
        __shared__ float staged[1024];
        float* const st = staged + (threadIdx.x & ~31) * 4;
        const int i = blockIdx.x * blockDim.x + threadIdx.x;
        const float acc = x[i] + x[i + 1];
        st[threadIdx.x & 31] = acc / 2.f;
        __syncwarp();
        out[i] = st[threadIdx.x & 31];
    """
    assert _kernel_kind(params, body) == "work"
    assert _kernel_kind(params, body.replace("acc / 2.f", "x[i]")) == "copy"
