"""Load a candidate's CUDA kernels and launch them on PyTorch's current stream.

Host code of a candidate sees a ``KernelLibrary`` as the global ``KERNELS``. Kernels are called
like functions: ``KERNELS.add_relu(grid, block, x, b, out, n)``. Tensors become device pointers and
Python numbers are converted to the C type the kernel's signature declares, so host code never has
to know how CuPy marshals scalars. Build speed is why this exists: NVRTC (or a cached cubin from
nvcc) takes well under a second, where PyTorch's extension builder takes about a minute.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import re
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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


_C_TO_CTYPES: dict[str, type] = {
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "int": ctypes.c_int32,
    "int32_t": ctypes.c_int32,
    "unsigned": ctypes.c_uint32,
    "unsigned int": ctypes.c_uint32,
    "uint32_t": ctypes.c_uint32,
    "long": ctypes.c_int64,
    "long long": ctypes.c_int64,
    "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_uint64,
    "unsigned long long": ctypes.c_uint64,
    "uint64_t": ctypes.c_uint64,
    "bool": ctypes.c_bool,
    "char": ctypes.c_int8,
    "int8_t": ctypes.c_int8,
    "uint8_t": ctypes.c_uint8,
    "short": ctypes.c_int16,
    "int16_t": ctypes.c_int16,
}


def _convert(value: Any, ctype: str) -> Any:
    """``value`` as the NumPy scalar CuPy passes for ``ctype`` (the portable launch path)."""
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


def _pointer(value: Any) -> int:
    if value is None:
        return 0
    try:
        return value.data_ptr()
    except AttributeError:
        return int(value)


class _ArgumentBlock:
    """Pre-built ``void*[]`` of a kernel's parameters; a launch only stores the new values.

    cuLaunchKernel reads the values when it is called, so one block serves every launch of its
    thread; that is what makes a launch cost a few microseconds instead of CuPy's tens.
    """

    def __init__(self, ctypes_: list[str]) -> None:
        for ctype in ctypes_:
            if ctype != "ptr" and ctype not in _C_TO_CTYPES:
                msg = f"kernel parameter type {ctype!r} is not supported by the launcher"
                raise TypeError(msg)
        self.slots = [
            ctypes.c_uint64() if t == "ptr" else _C_TO_CTYPES[t]() for t in ctypes_
        ]
        self.is_pointer = [t == "ptr" for t in ctypes_]
        self.array = (ctypes.c_void_p * max(1, len(self.slots)))(
            *(ctypes.addressof(slot) for slot in self.slots)
        )

    def store(self, args: tuple[Any, ...]) -> None:
        for i, (slot, pointer, value) in enumerate(zip(self.slots, self.is_pointer, args)):
            try:
                slot.value = _pointer(value) if pointer else value
            except TypeError as error:
                msg = f"argument {i} ({type(value).__name__}) does not fit its C type: {error}"
                raise TypeError(msg) from None


class _Driver:
    """``cuLaunchKernel`` from libcuda through ctypes (None where libcuda cannot be loaded)."""

    _instance: _Driver | None | bool = False

    def __init__(self, lib: Any) -> None:
        self.launch = lib.cuLaunchKernel
        self.launch.restype = ctypes.c_int
        self.launch.argtypes = [
            ctypes.c_void_p, *([ctypes.c_uint] * 6), ctypes.c_uint, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_void_p,
        ]
        self._error_name = lib.cuGetErrorName
        self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    @classmethod
    def get(cls) -> _Driver | None:
        if cls._instance is False:
            try:
                cls._instance = cls(ctypes.CDLL("libcuda.so.1"))
            except (OSError, AttributeError):
                cls._instance = None
        return cls._instance  # type: ignore[return-value]

    def error(self, code: int) -> str:
        name = ctypes.c_char_p()
        self._error_name(code, ctypes.byref(name))
        return (name.value or b"CUDA_ERROR_UNKNOWN").decode()


def _dims(value: int | Sequence[int]) -> tuple[int, int, int]:
    if not isinstance(value, Sequence):  # an int, or a NumPy or tensor scalar
        return int(value), 1, 1
    dims = tuple(int(v) for v in value) + (1, 1)
    return dims[0], dims[1], dims[2]


class GuardFailed(RuntimeError):
    """An input took a path through a traced forward that its program does not compute."""


def _bias_after(c: Any, bias: Any, relu: bool) -> None:
    """The bias (one value a row of the column-major C: C's last dim as PyTorch holds it) and
    ReLU that cuBLASLt's epilogue could not apply."""
    if bias is not None:
        c.add_(bias)
    if relu:
        c.relu_()


class KernelLauncher:
    """One kernel; calling it launches it on PyTorch's current CUDA stream."""

    def __init__(self, library: KernelLibrary, name: str, ctypes_: list[str]) -> None:
        self._library = library
        self.name = name
        self.ctypes = ctypes_
        self._function = None
        self._driver: _Driver | None = None
        self._local = threading.local()  # one argument block per launching thread

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
            self._function = self._library.module_of(self.name).get_function(self.name).kernel
            fast = all(t == "ptr" or t in _C_TO_CTYPES for t in self.ctypes)
            self._driver = _Driver.get() if fast else None  # __half scalars go through CuPy
        if self._driver is None:
            # CuPy's driver-level function takes the stream as an argument, which saves
            # entering and leaving a stream context on every launch
            converted = tuple(_convert(a, t) for a, t in zip(args, self.ctypes, strict=True))
            self._function(
                _dims(grid), _dims(block), converted, shared_mem=shared_mem,
                stream=self._library.stream(),
            )
            return
        arguments = getattr(self._local, "block", None)
        if arguments is None:
            arguments = self._local.block = _ArgumentBlock(self.ctypes)
        try:
            arguments.store(args)
        except TypeError as error:
            raise TypeError(f"kernel {self.name}: {error}") from None
        gx, gy, gz = _dims(grid)
        bx, by, bz = _dims(block)
        code = self._driver.launch(
            self._function.ptr, gx, gy, gz, bx, by, bz, shared_mem,
            self._library.stream_handle(), arguments.array, None,
        )
        if code:
            msg = (
                f"launching kernel {self.name} (grid {grid}, block {block}) failed: "
                f"{self._driver.error(code)}"
            )
            raise RuntimeError(msg)


class KernelLibrary:
    """The kernels of one candidate, built by NVRTC or loaded from a cubin built by nvcc."""

    def __init__(
        self,
        source: str,
        *,
        cubin_path: str | None = None,
        options: Sequence[str] = ("-std=c++17",),
        parts: int | None = None,
    ) -> None:
        """Build (or load) the module now so that build errors surface at model construction.

        ``parts``: how many NVRTC builds a source of many kernels is split into, at once
        (default: this machine's cores, at most 16; 1 builds it whole)."""
        import cupy

        self._cupy = cupy
        self.signatures = kernel_signatures(source)
        self._modules: dict[str, Any] = {}  # kernel name -> its module, for a split source
        if cubin_path:
            self.module = cupy.RawModule(path=cubin_path)
        else:
            parts = parts or _runtime_class("default_parts", "split")()
            self.module = _build_modules(cupy, source, tuple(options), parts, self._modules)
        self._streams: dict[int, Any] = {}
        import torch

        self._device = cupy.cuda.Device().id
        # torch.cuda.current_stream() builds a Stream object per call (microseconds); the raw
        # getter behind it returns the handle alone
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def module_of(self, name: str) -> Any:
        """The CuPy module that holds kernel ``name``."""
        return self._modules.get(name, self.module)

    def stream_handle(self) -> int:
        """The raw handle of PyTorch's current stream on this library's device."""
        raw = self._raw_stream
        if raw is not None:
            return raw(self._device)
        import torch

        return torch.cuda.current_stream().cuda_stream

    def stream(self) -> Any:
        """CuPy view of PyTorch's current stream, cached by handle."""
        handle = self.stream_handle()
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._cupy.cuda.ExternalStream(handle)
            self._streams[handle] = stream
        return stream

    def sgemm(self, ta: int, tb: int, m: int, n: int, k: int, a: Any, lda: int, sa: int,
              b: Any, ldb: int, sb: int, c: Any, ldc: int, sc: int, batch: int,
              algo: int = 0, bias: Any = None, relu: bool = False) -> None:
        """Column-major ``C = op(A) op(B)`` (strided-batched when ``batch > 1``) in true FP32.

        Runs on PyTorch's current stream through libcuBLAS directly (capturable in a CUDA graph);
        where that library cannot be loaded, through CuPy's cuBLAS wrapper. ``algo`` 0 is
        ``cublasSgemm`` (what eager runs); ``algo`` N > 0 is cuBLASLt's N-th ranked algorithm
        for this GEMM, or ``cublasSgemm`` again where the heuristic offers fewer. ``bias`` (a
        vector of ``m``, one value a row of C) and ``relu`` are applied by cuBLASLt's epilogue
        as C is stored, with its (N+1)-th ranked algorithm for ``algo`` N (so each ``algo`` is
        another algorithm); where cuBLASLt cannot, by PyTorch after ``cublasSgemm``.
        """
        stream = self.stream_handle()
        pointers = (_pointer(a), _pointer(b), _pointer(c))
        blas = self._blas()
        if blas != "cupy":
            if algo > 0 or bias is not None:
                shape = (ta, tb, m, n, k, lda, sa, ldb, sb, ldc, sc, batch)
                lt = self._blas_lt(blas)
                rank = algo if bias is not None else algo - 1
                epilogue = "" if bias is None else "relu_bias" if relu else "bias"
                extra = (_pointer(bias), epilogue) if bias is not None else ()
                if lt and lt.matmul(stream, rank, shape, *pointers, *extra):
                    return
            blas.sgemm(stream, ta, tb, m, n, k, pointers[0], lda, sa, pointers[1], ldb, sb,
                       pointers[2], ldc, sc, batch)
            _bias_after(c, bias, relu)
            return
        from cupy.cuda import cublas

        handle = self._cupy.cuda.device.get_cublas_handle()
        one, zero = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
        with self.stream():
            cublas.setStream(handle, stream)
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            cublas.setMathMode(handle, cublas.CUBLAS_DEFAULT_MATH)
            if batch == 1:
                cublas.sgemm(handle, ta, tb, m, n, k, one.ctypes.data, pointers[0], lda,
                             pointers[1], ldb, zero.ctypes.data, pointers[2], ldc)
            else:
                cublas.sgemmStridedBatched(
                    handle, ta, tb, m, n, k, one.ctypes.data, pointers[0], lda, sa, pointers[1],
                    ldb, sb, zero.ctypes.data, pointers[2], ldc, sc, batch,
                )
        _bias_after(c, bias, relu)

    def conv(self, x: Any, w: Any, y: Any, stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int], groups: int = 1, engine: int = 0) -> None:
        """``y = conv(x, w)`` (no bias: the generated epilogue adds it) through cuDNN, in FP32;
        ``engine`` picks among cuDNN's FP32 engines in its heuristic's order (0: its first)."""
        self._cudnn().run(self.stream_handle(), False, x, w, y, tuple(stride), tuple(padding),
                          tuple(dilation), groups, engine)

    def conv_transpose(self, x: Any, w: Any, y: Any, stride: Sequence[int],
                       padding: Sequence[int], dilation: Sequence[int], groups: int = 1,
                       engine: int = 0) -> None:
        """``y = conv_transpose(x, w)`` through cuDNN; ``y``'s shape carries the output padding."""
        self._cudnn().run(self.stream_handle(), True, x, w, y, tuple(stride), tuple(padding),
                          tuple(dilation), groups, engine)

    def _blas(self) -> Any:
        """cuBLAS through ctypes, or ``"cupy"`` where libcublas cannot be loaded."""
        blas = self.__dict__.get("_blas_handle")
        if blas is None:
            factory = _runtime_class("Cublas", "cublas")
            try:
                blas = factory(_loaded_library)
            except (OSError, AttributeError, RuntimeError):
                blas = "cupy"
            self._blas_handle = blas
        return blas

    def _blas_lt(self, blas: Any) -> Any:
        """cuBLASLt sharing ``blas``'s workspace (made on first use, outside any capture), or
        ``False`` where it cannot be loaded."""
        lt = self.__dict__.get("_lt_handle")
        if lt is None:
            factory = _runtime_class("CublasLt", "cublas")
            try:
                lt = factory(blas.space, _loaded_library)
            except (OSError, AttributeError, RuntimeError):
                lt = False  # no cuBLASLt: every algo runs as cublasSgemm
            self._lt_handle = lt
        return lt

    def _cudnn(self) -> Any:
        dnn = self.__dict__.get("_dnn")
        if dnn is None:
            dnn = self._dnn = _runtime_class("Cudnn", "cudnn")(_loaded_library)
        return dnn

    @staticmethod
    def guard(condition: Any, message: str) -> None:
        """Check a decision the program's forward took when it was traced on real inputs.

        A forward whose control flow reads tensor values is generated for the path its example
        inputs took; ``condition`` (a 0-d tensor the kernels computed) says whether this input
        takes it too. Reading it waits for the kernels, so programs check once, at the end.

        Raises:
            GuardFailed: This input takes another path, which the program does not compute.
        """
        if not bool(condition):
            msg = (
                f"this input takes a path through forward that the program was not generated "
                f"for ({message}); generate it again from inputs that take this path"
            )
            raise GuardFailed(msg)

    @staticmethod
    def rnn_weights(
        weights: list[Any],
        mode: int,
        input_size: int,
        hidden: int,
        layers: int,
        batch_first: bool,
        bidirectional: bool,
        biases: bool,
        proj: int = 0,
    ) -> list[Any]:
        """``weights`` of a recurrent layer that cuDNN runs, as views into one buffer in its
        layout, laid out once (``nn.LSTM`` keeps its own weights so); ``proj``: an LSTM's
        ``proj_size``, each layer then has ``weight_hr`` last.

        cuDNN's RNN reads one weight buffer: given separate tensors, PyTorch compacts them
        into a new one on every call (KernelBench L3 35_LSTM: 0.90x eager for that copy). The
        tensors are re-pointed in place, so loading a state dict later still fills them.
        """
        import torch

        first = weights[0]
        if (
            first.is_cuda
            and first.dtype == torch.float32
            and len({w.untyped_storage().data_ptr() for w in weights}) > 1
            and torch._use_cudnn_rnn_flatten_weight()
        ):
            with torch.no_grad():
                torch._cudnn_rnn_flatten_weight(
                    weights,
                    (4 if biases else 2) + (1 if proj else 0),
                    input_size,
                    mode,
                    hidden,
                    proj,
                    layers,
                    batch_first,
                    bidirectional,
                )
        return weights

    def graphed(self, module: Any, body: Any, *inputs: Any) -> Any:
        """``body(*inputs)`` replayed from a CUDA graph, for launch-bound programs.

        The whole forward is captured once per input signature (shapes, strides, dtypes and
        devices of the inputs; addresses of the parameters and buffers) on static input buffers.
        Each call copies its inputs into those buffers, replays the graph and copies the outputs
        out, so every kernel runs again on the current values, new tensors of the same shapes do
        not capture again, and each call returns fresh tensors as in eager mode. Inputs at the
        same addresses twice in a row get a graph of their own that reads them in place (the
        program never writes its inputs): no copies in, whatever their values. The copies are
        part of the program's time, so whether a graph pays is measured, never assumed. Where
        capture fails (a library call that cannot be captured), the body runs with plain
        launches from then on.
        """
        import torch

        if torch.cuda.is_current_stream_capturing():
            return body(*inputs)
        # a bound method is a new object on every access: key on the function behind it
        key = (
            id(module),
            id(getattr(body, "__func__", body)),
            self._state_token(module),
            *(_signature(value) for value in inputs),
        )
        graphs = self.__dict__.setdefault("_graphs", {})
        entry = graphs.get(key)
        if entry is None:
            entry = graphs[key] = _capture(body, inputs)
            if isinstance(entry, str):  # said once per signature, so a slow program says why
                warnings.warn(
                    f"CUDA graph capture failed, plain launches instead: {entry}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            while len(graphs) > 8:
                graphs.pop(next(iter(graphs)))
        if isinstance(entry, str):  # could not be captured: the reason
            return body(*inputs)
        # the same input buffers a second time (a serving loop, a benchmark refilling them):
        # a graph that reads them where they are, with no copies in
        addresses = (key, *(v.data_ptr() if hasattr(v, "data_ptr") else None for v in inputs))
        bound = self.__dict__.setdefault("_bound", {})
        if addresses not in bound and self.__dict__.get("_last_addresses") == addresses:
            bound[addresses] = _capture(body, inputs, copies=False)
            while len(bound) > 4:
                bound.pop(next(iter(bound)))
        self.__dict__["_last_addresses"] = addresses
        if not isinstance(bound.get(addresses, ""), str):
            entry = bound[addresses]
        graph, static_inputs, outputs = entry
        for static, value in zip(static_inputs, inputs, strict=True):
            if static is not None:
                static.copy_(value)
        graph.replay()
        if isinstance(outputs, tuple | list):
            return type(outputs)(o.clone() for o in outputs)
        return outputs.clone()

    def _state_token(self, module: Any) -> int:
        """A number that changes when the addresses or layouts of ``module``'s parameters and
        buffers do, so that a graph, which holds them by address, is never replayed on stale
        ones.

        Walking the module tree and reading every tensor's layout on each call took 0.9 ms of
        host time for EfficientNetB0's 242 tensors, more than half its replayed forward. Here the
        tree is walked again only after some module registered a parameter, buffer or
        submodule (PyTorch's global registration hooks count those). Otherwise each call
        compares the tensors' addresses with the ones recorded last time (0.08 ms).
        """
        _watch_registrations()
        states = self.__dict__.setdefault("_states", {})
        seen = states.get(id(module))
        if seen is not None and seen[0] == _REGISTRATIONS[0]:
            tensors, pointers, layouts, token = seen[1:]
            if [t.data_ptr() for t in tensors] == pointers:
                return token
        tensors = [*module.parameters(), *module.buffers()]
        layouts = tuple(_layout(t) for t in tensors)
        token = seen[4] if seen is not None and seen[3] == layouts else next(_TOKENS)
        pointers = [t.data_ptr() for t in tensors]
        states[id(module)] = (_REGISTRATIONS[0], tensors, pointers, layouts, token)
        return token

    def __getattr__(self, name: str) -> KernelLauncher:
        """The launcher of kernel ``name``."""
        if name.startswith("_") or name not in self.__dict__.get("signatures", {}):
            known = ", ".join(sorted(self.__dict__.get("signatures", {}))) or "none"
            msg = f'no extern "C" __global__ kernel named {name!r} (kernels: {known})'
            raise AttributeError(msg)
        launcher = KernelLauncher(self, name, self.signatures[name])
        setattr(self, name, launcher)
        return launcher


def _build_modules(
    cupy: Any, source: str, options: tuple[str, ...], parts: int, placed: dict[str, Any]
) -> Any:
    """Build ``source`` with NVRTC, split into up to ``parts`` built at once where it holds many
    kernels (``split.split_kernels``); ``placed`` gets each kernel's module. Returns the first."""
    split_kernels = _runtime_class("split_kernels", "split")
    sources = split_kernels(source, parts)

    def build(part: str) -> Any:
        module = cupy.RawModule(code=part, options=options)
        module.compile()
        return module

    if len(sources) == 1:
        return build(source)
    device = cupy.cuda.Device().id

    def compile_ahead(part: str) -> None:
        """Fill CuPy's on-disk cache with the part's build; an error resurfaces below."""
        try:
            cupy.cuda.Device(device).use()  # a new thread has no current device of its own
            build(part)
        except Exception:  # noqa: BLE001, S110 - the build below raises it where it belongs
            pass

    with ThreadPoolExecutor(len(sources)) as pool:
        list(pool.map(compile_ahead, sources))
    # loaded here, from the cache, so every module belongs to the thread that built the library
    modules = [build(part) for part in sources]
    for part, module in zip(sources, modules, strict=True):
        placed.update(dict.fromkeys(kernel_signatures(part), module))
    return modules[0]


_REGISTRATIONS = [0]  # parameters, buffers and submodules registered by any module so far
_TOKENS = itertools.count(1)
_WATCHING: list[Any] = []


def _watch_registrations() -> None:
    """Count every registration of a parameter, buffer or submodule, in any module (once per
    process; the hooks return ``None``, so they change nothing they see)."""
    if _WATCHING:
        return
    from torch.nn.modules import module as torch_module

    def count(*_: Any) -> None:
        _REGISTRATIONS[0] += 1

    _WATCHING.extend(
        register(count)
        for register in (
            torch_module.register_module_parameter_registration_hook,
            torch_module.register_module_buffer_registration_hook,
            torch_module.register_module_module_registration_hook,
        )
    )


def _runtime_class(name: str, module: str) -> Any:
    """Class (or function) ``name`` of the runtime's ``module``: defined beside this module in
    an exported program (its sources run in one namespace), else imported from the package."""
    found = globals().get(name)
    if found is None:
        found = getattr(importlib.import_module(f"stitch_graph.runtime.{module}"), name)
    return found


def _loaded_library(stem: str) -> str | None:
    """Path of a shared library this process has already mapped (e.g. CuPy's libcublas)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if f"/{stem}.so" in path:
                    return path
    except OSError:
        pass
    return None


def _layout(value: Any) -> Any:
    if hasattr(value, "data_ptr"):
        return (value.data_ptr(), tuple(value.shape), tuple(value.stride()), str(value.dtype))
    return repr(value)


def _signature(value: Any) -> Any:
    """What a captured graph depends on in an input: its layout, not its address or values."""
    if hasattr(value, "data_ptr"):
        return (tuple(value.shape), tuple(value.stride()), str(value.dtype), str(value.device))
    return repr(value)


def _capture(body: Any, inputs: tuple[Any, ...], *, copies: bool = True) -> Any:
    """``(graph, static inputs, outputs)`` of one call captured on static copies of the tensor
    inputs (``None`` where an input is not a tensor, or for every input with ``copies=False``:
    the graph then reads the inputs' own buffers, which the program only reads), or why it
    could not be captured."""
    import torch

    static_inputs = [
        torch.empty_like(v).copy_(v)  # keeps a dense input's strides
        if isinstance(v, torch.Tensor) and copies
        else None
        for v in inputs
    ]
    arguments = [v if s is None else s for s, v in zip(static_inputs, inputs, strict=True)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):  # warm-up: module loads and library workspaces happen here
            body(*arguments)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = body(*arguments)
    except Exception as error:  # noqa: BLE001 - any failure means plain launches instead
        torch.cuda.synchronize()
        _end_generator_capture()
        return f"{type(error).__name__}: {error}"
    return graph, static_inputs, outputs


def _end_generator_capture() -> None:
    """Take CUDA's default generator out of capture mode after a failed capture.

    A capture the CUDA runtime invalidated (a synchronising call in the body) ends before
    PyTorch's capture epilogue, so the generator stays in capture mode and every later random
    op of the process raises "Offset increment outside graph capture". A one-op capture runs the
    prologue and the epilogue again, which ends that mode.
    """
    import torch

    scratch = torch.zeros(1, device="cuda")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                scratch.add_(1)
    except Exception as error:  # noqa: BLE001 - the plain launches go on without random ops
        warnings.warn(
            f"random ops may fail after a failed CUDA graph capture: {error}",
            RuntimeWarning,
            stacklevel=3,
        )
    torch.cuda.synchronize()
