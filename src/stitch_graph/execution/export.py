"""Export a finished candidate as a standalone KernelBench ``ModelNew`` file.

KernelBench's evaluator execs a file and calls ``ModelNew(*get_init_inputs())`` then ``forward``.
The exported file depends on torch and CuPy only (never on stitch_graph): it embeds the kernel
source, the host module and a copy of the small runtime (``runtime/split.py``, ``kernels.py``,
``cudnn.py`` and ``cublas.py``), builds the kernels with NVRTC on first use (form ``nvrtc``) or
with ``nvcc -shared`` into a cache folder (form ``nvcc_shared``), and execs the host module with
``KERNELS``/``LIB`` injected, exactly as the worker does. KernelBench builds ``Model`` and
``ModelNew`` after the same seed and expects equal initial weights, so the exported ``ModelNew``
copies them from a reference built with the same RNG draws (its forward never touches it),
non-persistent buffers included.
Building lazily lets the file be imported (and inspected) where no GPU is present.
"""

from __future__ import annotations

import ast
import inspect

from stitch_graph.artifacts import Candidate, Task

__all__ = ["embedded_candidate", "export_kernelbench"]

_EMBEDDED = frozenset({"FORM", "KERNEL_SOURCE", "HOST_SOURCE", "HOST_CPP", "LINK_LIBRARIES"})

_TEMPLATE = '''"""KernelBench ModelNew for {task_name!s}, exported by stitch-graph ({digest}).

Standalone: needs torch and CuPy{nvcc_note}. Kernels are built on first use.
"""

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import types

import cupy  # noqa: F401  (the kernel launcher runs on CuPy)
import torch
import torch.nn as nn  # noqa: F401

FORM = {form!r}
KERNEL_SOURCE = {kernel_source!r}
HOST_SOURCE = {host_source!r}
HOST_CPP = {host_cpp!r}
LINK_LIBRARIES = {link_libraries!r}
_RUNTIME_SOURCES = {runtime_sources!r}
REFERENCE_SOURCE = {reference_source!r}


def _runtime():
    module = sys.modules.get("_stitch_export_runtime")
    if module is None:
        module = types.ModuleType("_stitch_export_runtime")
        sys.modules[module.__name__] = module
        for source in _RUNTIME_SOURCES:
            exec(compile(source, "<stitch runtime>", "exec"), module.__dict__)
    return module


class _LazyKernels:
    """Builds the kernels with NVRTC the first time one is used."""

    def __init__(self):
        self._library = None

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._library is None:
            self._library = _runtime().KernelLibrary(KERNEL_SOURCE)
        return getattr(self._library, name)


def _build_shared():
    major, minor = torch.cuda.get_device_capability()
    arch = "sm_%d%d" % (major, minor)
    key = hashlib.sha256((KERNEL_SOURCE + "\\0" + (HOST_CPP or "") + "\\0" + arch
                          + "\\0" + ",".join(LINK_LIBRARIES)).encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), "stitch-export-" + key)
    library = os.path.join(folder, "libcandidate.so")
    if not os.path.exists(library):
        os.makedirs(folder, exist_ok=True)
        sources = []
        for name, text in (("kernel.cu", KERNEL_SOURCE), ("host.cpp", HOST_CPP)):
            if text:
                with open(os.path.join(folder, name), "w") as fh:
                    fh.write(text)
                sources.append(name)
        nvcc = os.environ.get("NVCC", "nvcc")
        command = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-O3", "-std=c++17", "-arch=" + arch,
                   "-o", "libcandidate.so.tmp", *sources, *("-l" + lib for lib in LINK_LIBRARIES)]
        subprocess.run(command, cwd=folder, check=True)
        os.replace(os.path.join(folder, "libcandidate.so.tmp"), library)
    return ctypes.CDLL(library)


class _LazyLibrary:
    """Builds and loads the shared library the first time a symbol is used."""

    def __init__(self):
        self._library = None

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._library is None:
            self._library = _build_shared()
        return getattr(self._library, name)


_host = types.ModuleType("_stitch_export_host")
_host.__dict__["KERNELS"] = _LazyKernels()
_host.__dict__["LIB"] = _LazyLibrary()
sys.modules[_host.__name__] = _host
exec(compile(HOST_SOURCE, "<stitch host>", "exec"), _host.__dict__)


class ModelNew(_host.ModelNew):
    """The program, starting from the reference's initial weights.

    KernelBench seeds its RNG and builds ``Model`` and ``ModelNew`` one after the other, expecting
    equal initial weights. The reference is built here with the same RNG draws, only to copy its
    initial parameters and buffers; every forward runs the program's own kernels.
    """

    def __init__(self, *init_args):
        reference = None
        if REFERENCE_SOURCE:
            namespace = {{"__name__": "_stitch_export_reference"}}
            exec(compile(REFERENCE_SOURCE, "<reference>", "exec"), namespace)
            reference = namespace["Model"](*init_args)
        super().__init__(*init_args)
        if reference is None:
            return
        # parameters and buffers, non-persistent ones too (a mask built in __init__)
        start = {{**dict(reference.named_parameters()), **dict(reference.named_buffers())}}
        own = {{**dict(self.named_parameters()), **dict(self.named_buffers())}}
        with torch.no_grad():
            for name, tensor in own.items():
                if name in start and start[name].shape == tensor.shape:
                    tensor.copy_(start[name])
'''


def export_kernelbench(candidate: Candidate, task: Task) -> str:
    """A standalone KernelBench ``ModelNew`` file for ``candidate``.

    Args:
        candidate: The program (either form).
        task: Its problem (named in the file's docstring).

    Returns:
        Python source text; it imports torch and CuPy only.
    """
    from stitch_graph.runtime import cublas, cudnn, kernels, split

    runtime_sources = [inspect.getsource(m) for m in (split, kernels, cudnn, cublas)]
    nvcc_note = (
        " and nvcc (the host library is built at first use)"
        if (candidate.form == "nvcc_shared")
        else ""
    )
    return _TEMPLATE.format(
        task_name=task.name.replace('"', "'"),
        digest=candidate.digest,
        nvcc_note=nvcc_note,
        form=candidate.form,
        kernel_source=candidate.kernel_source,
        host_source=candidate.host_source,
        host_cpp=candidate.host_cpp,
        link_libraries=list(candidate.link_libraries),
        runtime_sources=runtime_sources,
        reference_source=task.source,
    )


def embedded_candidate(text: str, task: Task) -> Candidate | None:
    """The program inside ``text`` when ``text`` is exactly this version's export of it for
    ``task``, else ``None``.

    An export runs the fixed wrapper above around its embedded program, and the wrapper reads
    the reference (to copy its initial weights) and execs the host module, which the static
    checks rightly refuse in a file written elsewhere. So the embedded program is what gets
    verified, and only where re-exporting it gives the same text byte for byte: a wrapper
    changed in any way is checked as the external file it then is."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in _EMBEDDED:
            try:
                values[target.id] = ast.literal_eval(node.value)
            except ValueError:
                return None
    if set(values) != _EMBEDDED or values["FORM"] not in ("nvrtc", "nvcc_shared"):
        return None
    candidate = Candidate(
        kernel_source=values["KERNEL_SOURCE"],
        host_source=values["HOST_SOURCE"],
        form=values["FORM"],
        host_cpp=values["HOST_CPP"],
        link_libraries=list(values["LINK_LIBRARIES"]),
        author="export",
        notes="the program a stitch-graph export of this problem embeds",
    )
    return candidate if export_kernelbench(candidate, task) == text else None
