"""Splitting a kernel source into parts: every kernel once, the preamble in each part, a
kernel's part fixed by its name, and anything but kernels after the first one keeps it whole.
The parts are built with the real nvcc, each on its own."""

from __future__ import annotations

import re

import pytest

from stitch_graph.runtime.kernels import kernel_signatures
from stitch_graph.runtime.split import split_kernels
from stitch_graph.toolchain import find_nvcc, nvcc_compile, nvcc_compile_parts
from stitch_graph.toolchain.nvcc import KERNEL_FILE

PREAMBLE = """// helpers every kernel uses
#define SG_SCALE 2.0f
__device__ __forceinline__ float twice(float x) { return SG_SCALE * x; }
struct Pair { float a, b; };
"""


BODY = "out[i] = twice(x[i]) + {i}.0f;"


def kernel(i: int, body: str = BODY) -> str:
    return (
        f"// kernel {i}: braces in comments {{ and strings do not count\n"
        f'extern "C" __global__ __launch_bounds__(256) void k{i}_scale(const float* x, '
        f"float* out, int n) {{\n"
        f"  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        f'  const char* tag = "{{}}"; (void)tag;\n'
        f"  if (i < n) {{ {body.format(i=i)} }}\n"
        f"}}\n\n"
    )


def source(n: int = 20, **changed: str) -> str:
    return PREAMBLE + "\n" + "".join(kernel(i, changed.get(f"k{i}", BODY)) for i in range(n))


def test_every_kernel_lands_in_one_part_with_the_whole_preamble():
    parts = split_kernels(source(), 4)
    assert 1 < len(parts) <= 4
    names = [name for part in parts for name in kernel_signatures(part)]
    assert sorted(names) == sorted(f"k{i}_scale" for i in range(20))
    assert all(part.startswith(PREAMBLE) for part in parts)
    # each kernel keeps its leading comment
    assert all(
        re.search(rf"// kernel {name[1:].split('_')[0]}:.*\n[^\n]*void {name}\(", part)
        for part in parts
        for name in kernel_signatures(part)
    )


def test_a_changed_kernel_changes_only_its_own_part():
    before = split_kernels(source(), 4)
    after = split_kernels(source(k7="out[i] = -x[i];"), 4)
    assert len(before) == len(after)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(changed) == 1 and "k7_scale" in kernel_signatures(after[changed[0]])


@pytest.mark.parametrize(
    "between",
    [
        "#define LATER 1\n",
        "__device__ float helper(float x) { return x; }\n",
        '__device__ float table[4];\n',
        'extern "C" __global__ void declared_only(float* out);\n',
    ],
)
def test_anything_but_kernels_after_the_first_kernel_keeps_the_source_whole(between):
    text = PREAMBLE + kernel(0) + between + "".join(kernel(i) for i in range(1, 20))
    assert split_kernels(text, 4) == [text]


def test_few_kernels_or_one_part_stay_whole():
    assert split_kernels(source(5), 4) == [source(5)]
    assert split_kernels(source(), 1) == [source()]
    assert split_kernels("int main() { return 0; }", 4) == ["int main() { return 0; }"]


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")
def test_each_part_builds_on_its_own(tmp_path):
    for part in split_kernels(source(), 2):
        result = nvcc_compile(part, arch="sm_90a", work_dir=tmp_path)
        assert result.ok, result.log
        assert {r.kernel for r in result.resources} == set(kernel_signatures(part))


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")
def test_parts_built_at_once_report_errors_on_the_whole_sources_lines(tmp_path):
    whole = source(k13="out[i] = undeclared_name;")
    line = next(n for n, text in enumerate(whole.splitlines(), 1) if "undeclared_name" in text)
    parts = split_kernels(whole, 4, line_file=KERNEL_FILE)
    result = nvcc_compile_parts(parts, arch="sm_90a", work_dir=tmp_path)
    assert not result.ok and result.artifact is None
    [error] = result.errors
    assert (error.file, error.line) == (KERNEL_FILE, line) and "undeclared_name" in error.message
    # the other parts built, and their kernels' registers are reported
    [failed] = [p for p in parts if "k13_scale" in kernel_signatures(p)]
    built = {name for p in parts if p is not failed for name in kernel_signatures(p)}
    assert {r.kernel for r in result.resources} == built


class _FakeCupy:
    """CuPy's surface that ``_build_modules`` touches: records which thread builds what."""

    def __init__(self) -> None:
        import threading
        from types import SimpleNamespace

        self.builds: list[tuple[int, str]] = []
        fake = self

        class RawModule:
            def __init__(self, *, code: str, options: tuple[str, ...]) -> None:
                self.code = code

            def compile(self) -> None:
                fake.builds.append((threading.get_ident(), self.code))
                if "undeclared_name" in self.code:
                    raise RuntimeError("NVRTC: identifier undeclared_name is undefined")

        class Device:
            def __init__(self, index: int = 0) -> None:
                self.id = index

            def use(self) -> None:
                pass

        self.RawModule = RawModule
        self.cuda = SimpleNamespace(Device=Device)


def test_parts_are_compiled_ahead_on_threads_and_loaded_on_the_calling_thread():
    import threading

    from stitch_graph.runtime.kernels import _build_modules

    cupy, placed = _FakeCupy(), {}
    first = _build_modules(cupy, source(), ("-std=c++17",), 4, placed)
    parts = split_kernels(source(), 4)
    here = threading.get_ident()
    loaded = [code for thread, code in cupy.builds if thread == here]
    assert loaded == parts  # every part loaded here, in order, after being compiled ahead
    assert len(cupy.builds) == 2 * len(parts)
    assert set(placed) == {f"k{i}_scale" for i in range(20)}
    assert placed["k0_scale"].code in parts and first.code == parts[0]
    assert all(name in kernel_signatures(placed[name].code) for name in placed)


def test_an_error_in_one_part_is_raised_on_the_calling_thread():
    from stitch_graph.runtime.kernels import _build_modules

    with pytest.raises(RuntimeError, match="undeclared_name"):
        _build_modules(_FakeCupy(), source(k3="out[i] = undeclared_name;"), (), 4, {})
