"""nvcc_compile against the real local nvcc, and its parsers against captured nvcc output."""

from __future__ import annotations

import ctypes
import os
import time
import uuid
from pathlib import Path

import pytest

from stitch_graph.toolchain.nvcc import (
    find_nvcc,
    nvcc_compile,
    nvcc_version,
    parse_diagnostics,
    parse_ptxas_resources,
)

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) not installed")

GOOD = r"""
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void block_sum(const float* x, float* out, int n) {
  __shared__ float buf[1024];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? x[i] : 0.f;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int k = 0; k < 1024; ++k) s += buf[k];
    out[blockIdx.x] = s;
  }
}

template <typename T>
__global__ void scale(T* x, T s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
template __global__ void scale<float>(float*, float, int);
"""

BAD = r"""extern "C" __global__ void bad(float* y, int n) {
  int i = threadIdx.x;
  int unused;
  y[i] = x[i] + 1.0f;
}
"""

SPILL = r"""
extern "C" __global__ void __launch_bounds__(1024, 2) spill(const float* x, float* y, int k) {
  float loc[256];
  for (int j = 0; j < 256; ++j) loc[j] = x[j * 7 + threadIdx.x];
  float s = 0.f;
  for (int j = 0; j < 256; ++j) s += loc[(j * k) & 255] * loc[j];
  y[threadIdx.x] = s;
}
"""

HOST_KERNEL = r"""
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" void axpy_launch(float a, const float* x, float* y, int n, cudaStream_t s) {
  axpy<<<(n + 255) / 256, 256, 0, s>>>(a, x, y, n);
}
"""

HOST_CPP = r"""
#include <cuda_runtime.h>
extern "C" void axpy_launch(float a, const float* x, float* y, int n, cudaStream_t s);
extern "C" int candidate_abi_version() { return 7; }
extern "C" int run_axpy(float a, const float* x, float* y, int n) {
  axpy_launch(a, x, y, n, 0);
  return static_cast<int>(cudaGetLastError());
}
"""


def _unique(source: str) -> str:
    """A source that no earlier test (or run) has cached."""
    return f"{source}\n// {uuid.uuid4().hex}\n"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("builds")


@pytest.fixture(scope="module")
def good(build_dir: Path):
    return nvcc_compile(GOOD, work_dir=build_dir)


# --------------------------------------------------------------------------------------------
# Real compiles


@needs_nvcc
def test_version_and_location() -> None:
    version = nvcc_version()
    assert version is not None
    assert version.split(".")[0].isdigit()
    assert os.access(find_nvcc() or "", os.X_OK)


@needs_nvcc
def test_good_kernel_compiles_with_resources(good, build_dir: Path) -> None:
    assert good.ok, good.log
    assert not good.errors
    assert good.cached is False
    assert good.artifact is not None and good.artifact.endswith("kernel.cubin")
    assert Path(good.artifact).stat().st_size > 0
    assert Path(good.artifact).is_relative_to(build_dir)
    assert "-cubin" in good.command and "-arch=sm_90a" in good.command
    by_name = {r.kernel: r for r in good.resources}
    assert set(by_name) == {"axpy", "block_sum", "scale<float>(float*, float, int)"}
    assert all(r.registers > 0 for r in good.resources)
    assert by_name["block_sum"].shared_bytes == 4096
    assert by_name["axpy"].shared_bytes == 0
    assert by_name["axpy"].spill_stores_bytes == 0


@needs_nvcc
def test_second_call_is_cached_and_faster(good, build_dir: Path) -> None:
    again = nvcc_compile(GOOD, work_dir=build_dir)
    assert again.ok and again.cached
    assert again.artifact == good.artifact
    assert again.resources == good.resources
    assert again.diagnostics == good.diagnostics
    assert again.seconds < good.seconds / 5


@needs_nvcc
def test_different_flags_are_a_different_build(good, build_dir: Path) -> None:
    other = nvcc_compile(GOOD, work_dir=build_dir, extra_flags=["-DVARIANT=1"])
    assert other.ok and not other.cached
    assert other.artifact != good.artifact


@needs_nvcc
def test_type_error_reports_line_and_message(build_dir: Path) -> None:
    result = nvcc_compile(_unique(BAD), work_dir=build_dir)
    assert not result.ok
    assert result.artifact is None
    [error] = result.errors
    assert error.file == "kernel.cu"
    assert error.line == 4
    assert 'identifier "x" is undefined' in error.message
    warnings = [d for d in result.diagnostics if d.severity == "warning"]
    assert [(w.line, "unused" in w.message) for w in warnings] == [(3, True)]
    assert str(build_dir) not in result.log
    assert all(str(build_dir) not in d.file for d in result.diagnostics)


@needs_nvcc
def test_failed_build_is_not_cached(build_dir: Path) -> None:
    source = _unique(BAD)
    first = nvcc_compile(source, work_dir=build_dir)
    second = nvcc_compile(source, work_dir=build_dir)
    assert not first.ok and not second.ok
    assert second.cached is False
    assert second.errors[0].line == 4


@needs_nvcc
def test_forced_spill_is_reported(build_dir: Path) -> None:
    result = nvcc_compile(SPILL, work_dir=build_dir, extra_flags=["-maxrregcount=16"])
    assert result.ok, result.log
    [res] = result.resources
    assert res.kernel == "spill"
    assert res.spill_stores_bytes > 0
    assert res.spill_loads_bytes > 0
    assert res.stack_bytes >= res.spill_stores_bytes
    assert "-maxrregcount=16" in result.command


@needs_nvcc
def test_unresolved_device_function_is_a_ptxas_error(build_dir: Path) -> None:
    source = '__device__ int f(int);\nextern "C" __global__ void k(int* y) { y[0] = f(1); }\n'
    result = nvcc_compile(_unique(source), work_dir=build_dir)
    assert not result.ok
    assert any(e.message.startswith("ptxas:") and "f(int)" in e.message for e in result.errors), (
        result.diagnostics
    )


@needs_nvcc
def test_unknown_arch_is_an_nvcc_error(build_dir: Path) -> None:
    result = nvcc_compile(GOOD, arch="sm_1", work_dir=build_dir)
    assert not result.ok
    assert any("nvcc:" in e.message and "sm_1" in e.message for e in result.errors)


@needs_nvcc
def test_shared_library_with_host_code_loads(build_dir: Path) -> None:
    result = nvcc_compile(HOST_KERNEL, mode="shared", host_cpp=HOST_CPP, work_dir=build_dir)
    assert result.ok, result.log
    assert result.artifact is not None and result.artifact.endswith("libcandidate.so")
    assert "host.cpp" in result.command and "-shared" in result.command
    assert [r.kernel for r in result.resources] == ["axpy"]
    lib = ctypes.CDLL(result.artifact)
    assert lib.candidate_abi_version() == 7
    assert hasattr(lib, "run_axpy")


@needs_nvcc
def test_shared_library_undefined_symbol_is_a_link_error(build_dir: Path) -> None:
    host = 'extern "C" void missing_fn();\nextern "C" int go() { missing_fn(); return 0; }\n'
    result = nvcc_compile(HOST_KERNEL, mode="shared", host_cpp=_unique(host), work_dir=build_dir)
    assert not result.ok
    assert any(
        e.file == "host.cpp" and "undefined reference to `missing_fn'" in e.message
        for e in result.errors
    ), result.diagnostics


def _cublas_dirs() -> list[Path]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = find_nvcc()
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots.append(os.path.join(os.sep, "usr", "local", "cuda"))
    dirs = []
    for root in filter(None, roots):
        dirs += [Path(root, "lib64"), Path(root, "targets", "x86_64-linux", "lib")]
    return dirs


def _has_cublas() -> bool:
    return any(any(d.glob("libcublas.so*")) for d in _cublas_dirs() if d.is_dir())


@needs_nvcc
@pytest.mark.skipif(
    not _has_cublas(),
    reason="libcublas.so is missing from the CUDA toolkit's lib64 (cuBLAS not installed)",
)
def test_shared_library_links_cublas(build_dir: Path) -> None:
    host = r"""
#include <cublas_v2.h>
extern "C" int make_handle() {
  cublasHandle_t h;
  return cublasCreate(&h) == CUBLAS_STATUS_SUCCESS ? 0 : 1;
}
"""
    result = nvcc_compile(
        HOST_KERNEL, mode="shared", host_cpp=host, link_libraries=["cublas"], work_dir=build_dir
    )
    assert result.ok, result.log
    assert "-lcublas" in result.command
    assert result.artifact is not None and Path(result.artifact).is_file()


def test_missing_nvcc_is_a_clear_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STITCH_NVCC", str(tmp_path / "no-such-nvcc"))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = nvcc_compile(GOOD, work_dir=tmp_path / "builds")
    assert not result.ok
    [error] = result.errors
    assert "nvcc not found" in error.message
    assert "STITCH_NVCC" in error.message and "CUDA toolkit" in error.message
    assert not (tmp_path / "builds").exists()


@needs_nvcc
def test_timeout_is_a_failure_not_an_exception(build_dir: Path) -> None:
    start = time.perf_counter()
    result = nvcc_compile(_unique(SPILL), work_dir=build_dir, timeout_s=0.05)
    assert time.perf_counter() - start < 5
    assert not result.ok
    assert any("timed out" in e.message for e in result.errors)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="mode='shared'"):
        nvcc_compile(GOOD, host_cpp="int x;")
    with pytest.raises(ValueError, match="library"):
        nvcc_compile(GOOD, mode="shared", link_libraries=["cublas; rm -rf"])


# --------------------------------------------------------------------------------------------
# Parsers on captured output (nvcc 13.0, gcc 13)

PTXAS_SM80 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5spillPKfPfi' for 'sm_80'
ptxas info    : Function properties for _Z5spillPKfPfi
    3696 bytes stack frame, 3120 bytes spill stores, 3732 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 3696 bytes cumulative stack size, \
372 bytes cmem[0]
ptxas info    : Compile time = 261.129 ms
ptxas info    : Function properties for _Z6helperi
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'smem_sum' for 'sm_80'
ptxas info    : Function properties for smem_sum
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 22 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0], \
8 bytes cmem[2]
"""


def test_parse_ptxas_resources_with_cmem_and_mangled_names() -> None:
    spill, smem = parse_ptxas_resources(PTXAS_SM80)
    assert spill.kernel == "spill(float const*, float*, int)"
    assert (spill.registers, spill.spill_stores_bytes, spill.spill_loads_bytes) == (32, 3120, 3732)
    assert spill.stack_bytes == 3696 and spill.constant_bytes == 372
    assert smem.kernel == "smem_sum"
    assert (smem.registers, smem.shared_bytes, smem.constant_bytes) == (22, 4096, 368)
    assert smem.stack_bytes == 0  # the helper's frame is not the kernel's
    raw = parse_ptxas_resources(PTXAS_SM80, demangle=False)
    assert raw[0].kernel == "_Z5spillPKfPfi"


def test_parse_ptxas_resources_old_format_without_barriers() -> None:
    log = (
        "ptxas info    : Compiling entry function 'axpy' for 'sm_70'\n"
        "ptxas info    : Used 10 registers, 368 bytes cmem[0]\n"
    )
    [res] = parse_ptxas_resources(log)
    assert (res.kernel, res.registers, res.constant_bytes) == ("axpy", 10, 368)


def test_parse_host_compiler_and_linker_messages() -> None:
    log = """\
host.cpp:4:5: error: 'foo' was not declared in this scope
    4 |     foo();
      |     ^~~
host.cpp:9:1: warning: no return statement in function returning non-void [-Wreturn-type]
/usr/bin/ld: /tmp/tmpxft_00000ee8_00000000-14_host.o: in function `run':
tmpxft_00000ee8_00000000-6_host.cudafe1.cpp:(.text+0x5): undefined reference to `missing_fn'
/usr/bin/ld: cannot find -lcublas: No such file or directory
collect2: error: ld returned 1 exit status
"""
    diags = parse_diagnostics(log)
    assert [(d.file, d.line, d.column, d.severity) for d in diags[:2]] == [
        ("host.cpp", 4, 5, "error"),
        ("host.cpp", 9, 1, "warning"),
    ]
    assert diags[0].message == "'foo' was not declared in this scope"
    assert diags[2].file == "host.cpp" and "undefined reference to `missing_fn'" in diags[2].message
    assert diags[3].message == "ld: cannot find -lcublas: No such file or directory"
    assert len(diags) == 4  # the collect2 summary is only kept when nothing else explains it


def test_parse_frontend_ptxas_and_nvcc_messages() -> None:
    log = """\
kernel.cu(12): error: identifier "x" is undefined
    y[i] = x[i];
           ^

kernel.cu(3): warning #177-D: variable "unused" was declared but never referenced
kernel.cu(1): catastrophic error: cannot open source file "missing.h"
Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"
2 errors detected in the compilation of "kernel.cu".
ptxas error   : Entry function 'k' uses too much shared data (0x30000 bytes, 0xc000 max)
ptxas /tmp/tmpxft_00001_00000000-6_kernel.ptx, line 12; error   : Unknown symbol 'q'
ptxas fatal   : Ptx assembly aborted due to errors
nvcc fatal   : Unsupported gpu architecture 'sm_99'
collect2: error: ld returned 1 exit status
"""
    diags = parse_diagnostics(log)
    assert [(d.file, d.line, d.severity) for d in diags[:3]] == [
        ("kernel.cu", 12, "error"),
        ("kernel.cu", 3, "warning"),
        ("kernel.cu", 1, "error"),
    ]
    assert diags[1].message.endswith("[#177-D]")
    assert diags[3].message.startswith("ptxas: Entry function 'k' uses too much shared data")
    assert diags[4].line is None and "(PTX line 12)" in diags[4].message
    assert diags[5].severity == "error" and "aborted" in diags[5].message
    assert diags[6].message == "nvcc: Unsupported gpu architecture 'sm_99'"
    assert len(diags) == 7


def test_parse_linker_summary_kept_when_alone() -> None:
    [diag] = parse_diagnostics("collect2: error: ld returned 1 exit status\n")
    assert diag.severity == "error" and "ld returned 1" in diag.message
