"""Convolutions through cuDNN, called with ctypes on PyTorch's current stream.

Convolution is a library anchor: a generated program calls cuDNN for the convolution itself (FP32
math, never TF32) and fuses the bias and everything after it into one generated kernel. The legacy
cuDNN API is enough for that and needs no extra package: PyTorch's CUDA build already maps
libcudnn. Descriptors and the algorithm (cuDNN's heuristic, the choice PyTorch eager makes without
benchmark mode) are built once per shape and cached.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Cudnn"]

_FLOAT = 0  # CUDNN_DATA_FLOAT
_NCHW = 0  # CUDNN_TENSOR_NCHW
_CROSS_CORRELATION = 1  # what deep-learning frameworks call convolution
_FMA_MATH = 3  # CUDNN_FMA_MATH: plain FP32 FMAs, no tensor cores and so no TF32
_ALGO_COUNT = 8  # enough for every forward and backward-data algorithm
_WORKSPACE_LIMIT = 1 << 30
_INT_MAX = 2**31 - 1


class _AlgoPerf(ctypes.Structure):
    """``cudnnConvolutionFwdAlgoPerf_t`` (the backward-data one has the same layout)."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("math_type", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


@dataclass
class _Plan:
    """Descriptors, algorithm and workspace size of one convolution shape."""

    x: ctypes.c_void_p  # tensor descriptor of the convolution's input (dx when transposed)
    w: ctypes.c_void_p  # filter descriptor
    y: ctypes.c_void_p  # tensor descriptor of the convolution's output (dy when transposed)
    conv: ctypes.c_void_p
    algo: int
    workspace: int


def _ints(values: list[int]) -> Any:
    return (ctypes.c_int * len(values))(*values)


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


def _library(loaded: Callable[[str], str | None]) -> Any:
    """libcudnn as PyTorch loaded it (``loaded`` finds a mapped library's path), else the first
    one the loader finds."""
    import torch

    torch.backends.cudnn.version()  # makes PyTorch load its libcudnn
    names = [loaded("libcudnn"), "libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"]
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    msg = "libcudnn could not be loaded: install PyTorch with CUDA (it ships cuDNN)"
    raise OSError(msg)


class Cudnn:
    """cuDNN convolutions (forward and transposed) on raw device pointers.

    Depends on nothing else of the package, so that an exported program can embed it.
    """

    def __init__(self, loaded: Callable[[str], str | None] = lambda stem: None) -> None:
        self.lib = _library(loaded)
        self.lib.cudnnGetErrorString.restype = ctypes.c_char_p
        for name in ("cudnnSetStream", "cudnnConvolutionForward", "cudnnConvolutionBackwardData"):
            getattr(self.lib, name).argtypes = None
        self._handles = threading.local()
        self._plans: dict[tuple, _Plan] = {}
        self._lock = threading.Lock()
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _check(self, status: int, what: str) -> None:
        if status:
            text = self.lib.cudnnGetErrorString(status).decode()
            msg = f"{what} failed: {text} (cuDNN status {status})"
            raise RuntimeError(msg)

    def _handle(self, stream: int) -> ctypes.c_void_p:
        handle = getattr(self._handles, "handle", None)
        if handle is None:
            handle = ctypes.c_void_p()
            self._check(self.lib.cudnnCreate(ctypes.byref(handle)), "cudnnCreate")
            self._handles.handle = handle
        self._check(self.lib.cudnnSetStream(handle, ctypes.c_void_p(stream)), "cudnnSetStream")
        return handle

    def _tensor(self, shape: list[int]) -> ctypes.c_void_p:
        desc = ctypes.c_void_p()
        self._check(self.lib.cudnnCreateTensorDescriptor(ctypes.byref(desc)), "tensor descriptor")
        strides = _contiguous_strides(shape)
        self._check(
            self.lib.cudnnSetTensorNdDescriptor(desc, _FLOAT, len(shape), _ints(shape), _ints(strides)),
            f"tensor descriptor {shape}",
        )
        return desc

    def _plan(self, handle: ctypes.c_void_p, key: tuple) -> _Plan:
        transposed, xs, ws, ys, stride, padding, dilation, groups = key
        lib = self.lib
        w = ctypes.c_void_p()
        self._check(lib.cudnnCreateFilterDescriptor(ctypes.byref(w)), "filter descriptor")
        self._check(
            lib.cudnnSetFilterNdDescriptor(w, _FLOAT, _NCHW, len(ws), _ints(list(ws))),
            f"filter descriptor {list(ws)}",
        )
        conv = ctypes.c_void_p()
        self._check(lib.cudnnCreateConvolutionDescriptor(ctypes.byref(conv)), "conv descriptor")
        self._check(
            lib.cudnnSetConvolutionNdDescriptor(
                conv, len(stride), _ints(list(padding)), _ints(list(stride)),
                _ints(list(dilation)), _CROSS_CORRELATION, _FLOAT,
            ),
            f"convolution descriptor (stride {stride}, padding {padding}, dilation {dilation})",
        )
        self._check(lib.cudnnSetConvolutionGroupCount(conv, groups), "group count")
        self._check(lib.cudnnSetConvolutionMathType(conv, _FMA_MATH), "math type")
        # the convolution's own input and output: for a transposed one, its output and input
        x, y = (self._tensor(list(ys)), self._tensor(list(xs))) if transposed else (
            self._tensor(list(xs)), self._tensor(list(ys)))
        perf = (_AlgoPerf * _ALGO_COUNT)()
        count = ctypes.c_int()
        if transposed:
            status = lib.cudnnGetConvolutionBackwardDataAlgorithm_v7(
                handle, w, y, conv, x, _ALGO_COUNT, ctypes.byref(count), perf)
        else:
            status = lib.cudnnGetConvolutionForwardAlgorithm_v7(
                handle, x, w, conv, y, _ALGO_COUNT, ctypes.byref(count), perf)
        self._check(status, "algorithm heuristic")
        for p in perf[: count.value]:
            if p.status or p.math_type != _FMA_MATH:
                continue
            size = ctypes.c_size_t()
            if transposed:
                status = lib.cudnnGetConvolutionBackwardDataWorkspaceSize(
                    handle, w, y, conv, x, p.algo, ctypes.byref(size))
            else:
                status = lib.cudnnGetConvolutionForwardWorkspaceSize(
                    handle, x, w, conv, y, p.algo, ctypes.byref(size))
            if status == 0 and size.value <= _WORKSPACE_LIMIT:
                return _Plan(x, w, y, conv, p.algo, size.value)
        msg = (f"cuDNN offers no FP32 algorithm for {'transposed ' if transposed else ''}"
               f"convolution x{list(xs)} w{list(ws)} -> {list(ys)}")
        raise RuntimeError(msg)

    def run(self, stream: int, transposed: bool, x: Any, w: Any, y: Any,
            stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...],
            groups: int) -> None:
        """``y = conv(x, w)`` or ``conv_transpose(x, w)``, FP32, contiguous NC... tensors.

        Batches whose tensors exceed cuDNN's 32-bit element counts run in parts of whole images.
        """
        import torch

        per_image = max(x[0].numel(), y[0].numel(), 1)
        part = max(1, _INT_MAX // per_image)
        handle = self._handle(stream)
        for n0 in range(0, x.shape[0], part):
            xp, yp = x[n0:n0 + part], y[n0:n0 + part]
            xs, ws, ys = list(xp.shape), list(w.shape), list(yp.shape)
            if len(xs) == 3:  # conv1d as conv2d of height 1, as cuDNN wants 4-d descriptors
                xs, ws, ys = xs[:2] + [1] + xs[2:], ws[:2] + [1] + ws[2:], ys[:2] + [1] + ys[2:]
                geometry = ((1, *stride), (0, *padding), (1, *dilation))
            else:
                geometry = (stride, padding, dilation)
            key = (transposed, tuple(xs), tuple(ws), tuple(ys), *geometry, groups)
            plan = self._plans.get(key)
            if plan is None:
                with self._lock:
                    plan = self._plans.get(key) or self._plans.setdefault(
                        key, self._plan(handle, key))
            space = torch.empty(max(plan.workspace, 1), dtype=torch.uint8, device=x.device)
            one, zero = ctypes.byref(self.one), ctypes.byref(self.zero)
            xp_, wp_, yp_, sp_ = (ctypes.c_void_p(t.data_ptr()) for t in (xp, w, yp, space))
            size = ctypes.c_size_t(plan.workspace)
            if transposed:
                status = self.lib.cudnnConvolutionBackwardData(
                    handle, one, plan.w, wp_, plan.y, xp_, plan.conv, plan.algo, sp_, size,
                    zero, plan.x, yp_)
            else:
                status = self.lib.cudnnConvolutionForward(
                    handle, one, plan.x, xp_, plan.w, wp_, plan.conv, plan.algo, sp_, size,
                    zero, plan.y, yp_)
            self._check(status, "transposed convolution" if transposed else "convolution")
