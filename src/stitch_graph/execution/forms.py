"""Program forms: how a candidate's kernels get built and how its host module gets loaded.

Two forms exist because build time dominates a round. ``nvrtc``: kernels are compiled by NVRTC
through CuPy (0.1 s) or loaded from a cubin that nvcc already built for the same architecture, and
host Python launches them through ``KERNELS`` on PyTorch's current stream. ``nvcc_shared``: host
C++ (cuBLAS/cuBLASLt calls, graphs, streams) plus the kernels go through ``nvcc -shared`` and the
library is loaded with ctypes as ``LIB``. Both are cached by content hash: nvcc results by
``tools.nvcc``, NVRTC results by CuPy's kernel cache, which the parent points at a folder that
outlives worker processes. ``external``: a KernelBench file written elsewhere builds its own
kernels when the worker execs it (:mod:`stitch_graph.execution.external`); nothing is built
here and nothing is injected.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stitch_graph.artifacts import Candidate, CompileResult

__all__ = [
    "BuildError",
    "BuiltProgram",
    "arch_matches",
    "library_flags",
    "load_model_class",
    "prepare_program",
]


class BuildError(RuntimeError):
    """The candidate could not be built; ``compile_result`` holds nvcc's diagnostics."""

    def __init__(self, message: str, compile_result: CompileResult | None = None) -> None:
        super().__init__(message)
        self.compile_result = compile_result


class BuiltProgram(BaseModel):
    """What a worker needs to load a candidate: its build folder and built artefact, if any."""

    form: str
    build_dir: str
    cubin_path: str | None = None
    library_path: str | None = None
    arch: str = ""
    build_seconds: float = 0.0
    cached: bool = False

    @property
    def artifact(self) -> str | None:
        """The cubin (``nvrtc``) or shared library (``nvcc_shared``)."""
        return self.library_path if self.form == "nvcc_shared" else self.cubin_path


def arch_matches(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code built for ``arch`` (``sm_90a``, ``sm_80``, ...) runs on ``capability`` as is.

    A cubin runs only on the exact major.minor it was built for (plus the ``a`` variant on the
    same chip), so this is an exact comparison.
    """
    m = re.fullmatch(r"(?:sm|compute)_(\d+)(\d)[af]?", arch.strip())
    return bool(m) and (int(m.group(1)), int(m.group(2))) == tuple(capability)


def prepare_program(
    candidate: Candidate,
    *,
    build_root: str | Path,
    compile_result: CompileResult | None = None,
    arch: str = "sm_90a",
    timeout_s: float = 120.0,
) -> BuiltProgram:
    """Build (or find cached) what the candidate's worker will load.

    Args:
        candidate: The program.
        build_root: Folder that holds one build folder per candidate digest.
        compile_result: The compile step's result; its cubin is reused for the ``nvrtc`` form and
            its library for ``nvcc_shared`` when built for ``arch``.
        arch: Target architecture.
        timeout_s: nvcc's time limit.

    Returns:
        The built program.

    Raises:
        BuildError: nvcc failed for the ``nvcc_shared`` form.
    """
    build_dir = Path(build_root) / candidate.digest
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "kernels.cu").write_text(candidate.kernel_source)
    (build_dir / "host.py").write_text(candidate.host_source)
    usable = (
        compile_result is not None
        and compile_result.ok
        and compile_result.artifact
        and Path(compile_result.artifact).exists()
        and compile_result.arch in ("", arch)
    )
    artifact = compile_result.artifact if usable and compile_result else None
    if candidate.form == "external":
        return BuiltProgram(form="external", build_dir=str(build_dir), arch=arch)
    if candidate.form == "nvrtc":
        cubin = artifact if artifact and artifact.endswith(".cubin") else None
        return BuiltProgram(form="nvrtc", build_dir=str(build_dir), cubin_path=cubin, arch=arch)
    if artifact and artifact.endswith(".so"):
        return BuiltProgram(
            form="nvcc_shared",
            build_dir=str(build_dir),
            library_path=artifact,
            arch=arch,
            cached=True,
        )
    from stitch_graph.toolchain.nvcc import nvcc_compile

    libraries, flags = library_flags(candidate.link_libraries)
    result = nvcc_compile(
        candidate.kernel_source,
        arch=arch,
        mode="shared",
        host_cpp=candidate.host_cpp,
        link_libraries=tuple(libraries),
        extra_flags=tuple(flags),
        work_dir=str(Path(build_root).parent / "nvcc"),
        timeout_s=int(timeout_s),
    )
    if not result.ok or not result.artifact:
        errors = "; ".join(d.message for d in result.errors[:3]) or result.log[-500:]
        msg = f"nvcc -shared failed: {errors}"
        raise BuildError(msg, result)
    return BuiltProgram(
        form="nvcc_shared",
        build_dir=str(build_dir),
        library_path=result.artifact,
        arch=arch,
        build_seconds=result.seconds,
        cached=result.cached,
    )


def _pip_library(name: str) -> tuple[Path, Path] | None:
    """``(shared object, include folder)`` of ``lib<name>`` in NVIDIA's pip wheels, if present."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for so in sorted(Path(base).glob(f"**/lib/lib{name}.so*")):
            include = so.parent.parent / "include"
            if include.is_dir():
                return so, include
    return None


def library_flags(libraries: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split link libraries into ``-l`` names nvcc finds itself and explicit flags for the rest.

    A CUDA toolkit without cuBLAS (headers and ``libcublas.so``) is common where PyTorch brings
    its own copy in NVIDIA's pip wheels; then the wheel's include folder, library file and an
    rpath are passed explicitly.

    Returns:
        ``(libraries, extra_flags)`` for ``nvcc_compile``.
    """
    from stitch_graph.toolchain.nvcc import find_nvcc

    nvcc = find_nvcc()
    root = Path(nvcc).resolve().parent.parent if nvcc else None
    keep: list[str] = []
    flags: list[str] = []
    for lib in libraries:
        name = lib.removeprefix("-l")
        dirs = ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")
        if root is None or any((root / d / f"lib{name}.so").exists() for d in dirs):
            keep.append(name)
            continue
        found = _pip_library(name)
        if found is None:
            keep.append(name)  # nvcc will say what is missing
            continue
        so, include = found
        flags += [f"-I{include}", str(so), "-Xlinker", f"-rpath={so.parent}"]
    return keep, flags


class _Unavailable:
    """Stands in for ``KERNELS``/``LIB`` in a worker without a GPU; any use raises."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        msg = f"{self._what}.{name} is unavailable: this worker runs without a GPU"
        raise RuntimeError(msg)


def _load_library(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_LOCAL", 0))


def load_model_class(
    candidate: Candidate,
    build_dir: str | Path,
    cubin_or_lib: str | None,
    *,
    device: str = "cuda",
    arch: str | None = None,
) -> type:
    """Exec the candidate's host module in a fresh namespace and return its ``ModelNew``.

    ``KERNELS`` (form ``nvrtc``) or ``LIB`` (form ``nvcc_shared``) is injected as a global before
    the host code runs.

    Args:
        candidate: The program.
        build_dir: Its build folder; the host source is written there for readable tracebacks.
        cubin_or_lib: Cubin (``nvrtc``; ``None`` compiles with NVRTC) or shared library path.
        device: ``"cpu"`` injects stand-ins that raise when used (for GPU-less tests).
        arch: Architecture the cubin was built for; a cubin for another GPU is ignored in favour
            of NVRTC.

    Returns:
        The ``ModelNew`` class.
    """
    folder = Path(build_dir)
    folder.mkdir(parents=True, exist_ok=True)
    host_path = folder / "host.py"
    if not host_path.exists() or host_path.read_text() != candidate.host_source:
        host_path.write_text(candidate.host_source)
    name = f"stitch_candidate_{candidate.digest}"
    module = types.ModuleType(name)
    module.__file__ = str(host_path)
    if candidate.form == "external":
        # the file builds and loads its own kernels; load_inline builds outlive the worker
        extensions = folder.parent.parent / "torch-extensions"
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions))
    elif device == "cpu":
        module.__dict__["KERNELS"] = _Unavailable("KERNELS")
        module.__dict__["LIB"] = _Unavailable("LIB")
    elif candidate.form == "nvcc_shared":
        if not cubin_or_lib:
            msg = "form nvcc_shared needs the built shared library; none was given"
            raise FileNotFoundError(msg)
        module.__dict__["LIB"] = _load_library(cubin_or_lib)
    else:
        from stitch_graph.runtime.kernels import KernelLibrary

        cubin = cubin_or_lib
        if cubin and arch:
            import torch

            if not arch_matches(arch, torch.cuda.get_device_capability()):
                cubin = None
        module.__dict__["KERNELS"] = KernelLibrary(candidate.kernel_source, cubin_path=cubin)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    try:
        exec(compile(candidate.host_source, str(host_path), "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    model_new = module.__dict__.get("ModelNew")
    if not isinstance(model_new, type):
        msg = "the host module defines no class `ModelNew`"
        raise TypeError(msg)
    return model_new
