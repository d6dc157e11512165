"""Load a candidate's CUDA kernels and launch them on PyTorch's current stream.

Host code of a candidate sees a ``KernelLibrary`` as the global ``KERNELS``. Kernels are called
like functions: ``KERNELS.add_relu(grid, block, x, b, out, n)``. Tensors become device pointers and
Python numbers are converted to the C type the kernel's signature declares, so host code never has
to know how CuPy marshals scalars. Build speed is why this exists: NVRTC (or a cached cubin from
nvcc) takes well under a second, where PyTorch's extension builder takes about a minute.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

_C_TO_NUMPY: dict[str, type] = {
    "float": np.float32,
    "double": np.float64,
    "__half": np.float16,
    "half": np.float16,
    "int": np.int32,
    "int32_t": np.int32,
    "unsigned": np.uint32,
    "unsigned int": np.uint32,
    "uint32_t": np.uint32,
    "long": np.int64,
    "long long": np.int64,
    "int64_t": np.int64,
    "size_t": np.uint64,
    "unsigned long long": np.uint64,
    "uint64_t": np.uint64,
    "bool": np.bool_,
    "char": np.int8,
    "int8_t": np.int8,
    "uint8_t": np.uint8,
    "short": np.int16,
    "int16_t": np.int16,
}

_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(([^)]*)\)',
    re.S,
)
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict)\b")


def kernel_signatures(source: str) -> dict[str, list[str]]:
    """Map each ``extern "C" __global__`` kernel in ``source`` to its parameters' C types.

    A pointer parameter is reported as ``"ptr"``; scalars keep their base type name.
    """
    source = re.sub(r"//[^\n]*", "", source)
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    signatures: dict[str, list[str]] = {}
    for name, params in _KERNEL_RE.findall(source):
        types: list[str] = []
        for raw in filter(None, (p.strip() for p in params.split(","))):
            if raw == "void":
                continue
            if "*" in raw or "[" in raw:
                types.append("ptr")
                continue
            words = _QUALIFIERS.sub(" ", raw).split()
            types.append(" ".join(words[:-1]) if len(words) > 1 else words[0])
        signatures[name] = types
    return signatures


def _convert(value: Any, ctype: str) -> Any:
    if ctype == "ptr":
        if hasattr(value, "data_ptr"):
            return np.uint64(value.data_ptr())
        if value is None:
            return np.uint64(0)
        return np.uint64(int(value))
    np_type = _C_TO_NUMPY.get(ctype)
    if np_type is None:
        msg = f"kernel parameter type {ctype!r} is not supported by the launcher; pass a pointer"
        raise TypeError(msg)
    return np_type(value)


class KernelLauncher:
    """One kernel; calling it launches it on PyTorch's current CUDA stream."""

    def __init__(self, library: KernelLibrary, name: str, ctypes_: list[str]) -> None:
        self._library = library
        self.name = name
        self.ctypes = ctypes_
        self._function = None

    def __call__(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        *args: Any,
        shared_mem: int = 0,
    ) -> None:
        """Launch with ``grid`` x ``block`` threads and the kernel's arguments in order."""
        if len(args) != len(self.ctypes):
            msg = f"kernel {self.name} takes {len(self.ctypes)} arguments, got {len(args)}"
            raise TypeError(msg)
        if self._function is None:
            # CuPy's driver-level function takes the stream as an argument, which saves
            # entering and leaving a stream context on every launch
            self._function = self._library.module.get_function(self.name).kernel
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        block = (block,) if isinstance(block, int) else tuple(block)
        converted = tuple(_convert(a, t) for a, t in zip(args, self.ctypes, strict=True))
        self._function(
            grid, block, converted, shared_mem=shared_mem, stream=self._library.stream()
        )


class KernelLibrary:
    """The kernels of one candidate, built by NVRTC or loaded from a cubin built by nvcc."""

    def __init__(
        self,
        source: str,
        *,
        cubin_path: str | None = None,
        options: Sequence[str] = ("-std=c++17",),
    ) -> None:
        """Build (or load) the module now so that build errors surface at model construction."""
        import cupy

        self._cupy = cupy
        self.signatures = kernel_signatures(source)
        if cubin_path:
            self.module = cupy.RawModule(path=cubin_path)
        else:
            self.module = cupy.RawModule(code=source, options=tuple(options))
            self.module.compile()
        self._streams: dict[int, Any] = {}

    def stream(self) -> Any:
        """CuPy view of PyTorch's current stream, cached by handle."""
        import torch

        handle = torch.cuda.current_stream().cuda_stream
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._cupy.cuda.ExternalStream(handle)
            self._streams[handle] = stream
        return stream

    def __getattr__(self, name: str) -> KernelLauncher:
        """The launcher of kernel ``name``."""
        if name.startswith("_") or name not in self.__dict__.get("signatures", {}):
            known = ", ".join(sorted(self.__dict__.get("signatures", {}))) or "none"
            msg = f'no extern "C" __global__ kernel named {name!r} (kernels: {known})'
            raise AttributeError(msg)
        launcher = KernelLauncher(self, name, self.signatures[name])
        setattr(self, name, launcher)
        return launcher
