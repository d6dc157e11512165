"""True-FP32 GEMMs through cuBLAS and cuBLASLt, called with ctypes on PyTorch's stream.

``Cublas.sgemm`` is what eager PyTorch runs for an FP32 matmul with TF32 off. ``CublasLt``
offers the other algorithms its heuristic ranks for the same GEMM (tile shapes, split-K,
stages), so a program can take whichever of them is fastest on the real shapes: the tuner
times ``algo`` 1, 2, 3 ... (cuBLASLt's first, second, third candidates) against 0 (cuBLAS).

Both are capturable in CUDA graphs: the handles get a workspace from PyTorch's allocator, made
before any capture (setting a stream sends cuBLAS back to its default pool, which it may grow
with ``cudaMalloc``, and that is not allowed while a stream is being captured).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

_GEMM_WORKSPACE = 32 << 20  # what PyTorch gives cuBLAS on Hopper
_COMPUTE_32F, _R_32F = 68, 0  # cublasComputeType_t, cudaDataType_t: FP32, never TF32
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_DESC_EPILOGUE, _DESC_BIAS_POINTER = 7, 8
EPILOGUES = {"": 1, "bias": 4, "relu_bias": 6}  # cublasLtEpilogue_t: DEFAULT, BIAS, RELU_BIAS
_LAYOUT_BATCH_COUNT, _LAYOUT_BATCH_STRIDE = 5, 6  # cublasLtMatrixLayoutAttribute_t
_PREF_WORKSPACE, _PREF_ALIGNMENTS = 1, (5, 6, 7, 8)  # MAX_WORKSPACE, MIN_ALIGNMENT_{A,B,C,D}
_CANDIDATES = 8  # algorithms asked of the heuristic


def _open_library(stem: str, loaded: Callable[[str], str | None]) -> Any:
    """The library ``stem`` (the one this process has mapped first), or ``None``."""
    names = [loaded(stem), f"{stem}.so", f"{stem}.so.13", f"{stem}.so.12", f"{stem}.so.11"]
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _blas_check(status: int, what: str) -> None:
    if status:
        msg = f"{what} failed with cuBLAS status {status}"
        raise RuntimeError(msg)


def _gemm_workspace() -> Any:
    import torch

    return torch.empty(_GEMM_WORKSPACE, dtype=torch.uint8, device="cuda")


class _Opened:
    """A shared library opened once per process (``None`` where it cannot be)."""

    _stem = ""
    _lib: Any = False

    @classmethod
    def library(cls, loaded: Callable[[str], str | None]) -> Any:
        if cls._lib is False:
            cls._lib = _open_library(cls._stem, loaded)
        return cls._lib


class Cublas(_Opened):
    """``cublasSgemm`` / ``cublasSgemmStridedBatched`` with math mode default (no TF32)."""

    _stem = "libcublas"

    def __init__(self, loaded: Callable[[str], str | None]) -> None:
        lib = self.library(loaded)
        if lib is None:
            msg = "libcublas could not be loaded"
            raise OSError(msg)
        self.lib = lib
        handle = ctypes.c_void_p()
        _blas_check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        _blas_check(lib.cublasSetMathMode(handle, 0), "cublasSetMathMode")  # no TF32
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.space = _gemm_workspace()
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.cublasSgemm_v2.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ]
        lib.cublasSgemmStridedBatched.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,
            ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_int, ctypes.c_longlong, ctypes.c_int,
        ]

    def sgemm(self, stream: int, ta: int, tb: int, m: int, n: int, k: int, a: int, lda: int,
              sa: int, b: int, ldb: int, sb: int, c: int, ldc: int, sc: int, batch: int) -> None:
        lib, handle = self.lib, self.handle
        _blas_check(lib.cublasSetStream_v2(handle, stream), "cublasSetStream")
        _blas_check(
            lib.cublasSetWorkspace_v2(handle, self.space.data_ptr(), _GEMM_WORKSPACE),
            "cublasSetWorkspace",
        )
        one, zero = ctypes.byref(self.one), ctypes.byref(self.zero)
        if batch == 1:
            status = lib.cublasSgemm_v2(handle, ta, tb, m, n, k, one, a, lda, b, ldb, zero, c, ldc)
        else:
            status = lib.cublasSgemmStridedBatched(
                handle, ta, tb, m, n, k, one, a, lda, sa, b, ldb, sb, zero, c, ldc, sc, batch
            )
        _blas_check(status, "cublasSgemm")


class _LtAlgo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _LtHeuristic(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [
        ("algo", _LtAlgo),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


class _GemmPlan:
    """Descriptors of one GEMM shape and the algorithms cuBLASLt's heuristic offers for it."""

    def __init__(self, desc: Any, layouts: tuple[Any, Any, Any], algos: list[_LtAlgo]) -> None:
        self.desc, self.layouts, self.algos = desc, layouts, algos


class CublasLt(_Opened):
    """``cublasLtMatmul`` in FP32 with a chosen one of the heuristic's algorithms."""

    _stem = "libcublasLt"

    def __init__(self, space: Any, loaded: Callable[[str], str | None]) -> None:
        lib = self.library(loaded)
        if lib is None:
            msg = "libcublasLt could not be loaded"
            raise OSError(msg)
        self.lib, self.space = lib, space
        handle = ctypes.c_void_p()
        _blas_check(lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        self.handle = handle
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.plans: dict[tuple[int, ...], _GemmPlan] = {}
        vp, i32, u64, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
        lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), i32, i32]
        lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i32, u64, u64, i64]
        for name in (
            "cublasLtMatmulDescSetAttribute",
            "cublasLtMatrixLayoutSetAttribute",
            "cublasLtMatmulPreferenceSetAttribute",
        ):
            getattr(lib, name).argtypes = [vp, i32, vp, ctypes.c_size_t]
        lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [
            vp, vp, vp, vp, vp, vp, vp, i32, ctypes.POINTER(_LtHeuristic), ctypes.POINTER(i32)
        ]
        lib.cublasLtMatmul.argtypes = [
            vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(_LtAlgo), vp,
            ctypes.c_size_t, vp,
        ]

    def algorithms(self, shape: tuple[int, ...]) -> int:
        """How many algorithms the heuristic offers for ``shape`` (as ``matmul`` takes it)."""
        return len(self._plan(shape).algos)

    def matmul(self, stream: int, index: int, shape: tuple[int, ...], a: int, b: int,
               c: int, bias: int = 0, epilogue: str = "") -> bool:
        """``C = op(A) op(B)`` with the heuristic's ``index``-th algorithm (0: its first);
        ``False`` (nothing run) when it offers fewer. ``shape`` is ``(ta, tb, m, n, k, lda, sa,
        ldb, sb, ldc, sc, batch)``, column-major as for ``cublasSgemm``. ``epilogue`` ``bias``
        adds the vector at ``bias`` (one value a row of C: a linear layer's output feature)
        as the GEMM stores C, ``relu_bias`` then clamps at 0 (``EPILOGUES``)."""
        shape = (*shape, _pointer_alignment(a, b, c, *([bias] if epilogue else [])), epilogue)
        plan = self.plans.get(shape) or self._plan(shape)
        if index >= len(plan.algos):
            return False
        if epilogue:
            pointer = ctypes.c_void_p(bias)
            set_ = self.lib.cublasLtMatmulDescSetAttribute(
                plan.desc, _DESC_BIAS_POINTER, ctypes.byref(pointer), 8
            )
            _blas_check(set_, "bias pointer")
        la, lb, lc = plan.layouts
        status = self.lib.cublasLtMatmul(
            self.handle, plan.desc, ctypes.byref(self.one), a, la, b, lb, ctypes.byref(self.zero),
            c, lc, c, lc, ctypes.byref(plan.algos[index]), self.space.data_ptr(), _GEMM_WORKSPACE,
            stream,
        )
        _blas_check(status, "cublasLtMatmul")
        return True

    def _plan(self, shape: tuple[int, ...]) -> _GemmPlan:
        if len(shape) == 12:
            shape = (*shape, 256, "")
        if shape in self.plans:
            return self.plans[shape]
        ta, tb, m, n, k, lda, sa, ldb, sb, ldc, sc, batch, align, epilogue = shape
        lib = self.lib
        desc = ctypes.c_void_p()
        _blas_check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F), "desc")
        for attr, value in ((_DESC_TRANSA, ta), (_DESC_TRANSB, tb)):
            op = ctypes.c_int32(value)
            _blas_check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(op), 4), "trans")
        kind = ctypes.c_uint32(EPILOGUES[epilogue])
        set_ = lib.cublasLtMatmulDescSetAttribute(desc, _DESC_EPILOGUE, ctypes.byref(kind), 4)
        _blas_check(set_, "epilogue")
        if epilogue:  # the heuristic reads only the bias address's alignment: the key's
            like = ctypes.c_void_p(align)
            set_ = lib.cublasLtMatmulDescSetAttribute(desc, _DESC_BIAS_POINTER, ctypes.byref(like), 8)
            _blas_check(set_, "bias pointer")

        def layout(rows: int, cols: int, ld: int, stride: int) -> Any:
            made = ctypes.c_void_p()
            created = lib.cublasLtMatrixLayoutCreate(ctypes.byref(made), _R_32F, rows, cols, ld)
            _blas_check(created, "layout")
            if batch > 1:
                count, step = ctypes.c_int32(batch), ctypes.c_int64(stride)
                for attr, value, size in (
                    (_LAYOUT_BATCH_COUNT, count, 4),
                    (_LAYOUT_BATCH_STRIDE, step, 8),
                ):
                    _blas_check(
                        lib.cublasLtMatrixLayoutSetAttribute(made, attr, ctypes.byref(value), size),
                        "batch",
                    )
            return made

        layouts = (
            layout(*((k, m) if ta else (m, k)), lda, sa),
            layout(*((n, k) if tb else (k, n)), ldb, sb),
            layout(m, n, ldc, sc),
        )
        pref = ctypes.c_void_p()
        _blas_check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        limit = ctypes.c_uint64(_GEMM_WORKSPACE)
        set_ = lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_WORKSPACE, ctypes.byref(limit), 8)
        _blas_check(set_, "workspace")
        for attr in _PREF_ALIGNMENTS:  # only algorithms safe for these pointers' alignment
            bytes_ = ctypes.c_uint32(align)
            set_ = lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(bytes_), 4)
            _blas_check(set_, "alignment")
        results = (_LtHeuristic * _CANDIDATES)()
        found = ctypes.c_int32(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            self.handle, desc, *layouts, layouts[2], pref, _CANDIDATES, results,
            ctypes.byref(found),
        )
        algos = [
            _LtAlgo.from_buffer_copy(results[i].algo)
            for i in range(found.value if status == 0 else 0)
            if results[i].state == 0 and results[i].workspace_size <= _GEMM_WORKSPACE
        ]
        plan = self.plans[shape] = _GemmPlan(desc, layouts, algos)
        return plan


def _pointer_alignment(*pointers: int) -> int:
    """The largest power of two up to 256 that divides every address."""
    common = 256
    for pointer in pointers:
        common = math.gcd(common, pointer or 256)
    return common
