"""Convolutions through cuDNN, called with ctypes on PyTorch's current stream.

Convolution is a library anchor: a generated program calls cuDNN for the convolution itself (FP32
math, never TF32) and fuses the bias and everything after it into one generated kernel. No extra
package is needed: PyTorch's CUDA build already maps libcudnn.

cuDNN's graph ("backend") API comes first, as in PyTorch eager: its heuristics reach engines the
legacy API does not. On an H200 with cuDNN 9.19, per call on ResNet-sized shapes, the legacy API's
heuristic choice took 1.3-3.7x as long as PyTorch's convolution, the graph API's 1.1-1.8x. Engines
whose numerical notes say tensor cores, down-converted inputs or reduced-precision sums are
skipped, so the math stays FP32. Where the graph API offers no engine, the legacy API and its
heuristic serve. Plans are built once per shape and cached.
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
_FWD_TRANSFORMS = frozenset({4, 5, 6, 7})  # forward FFT, FFT_TILING, WINOGRAD, WINOGRAD_NONFUSED
_BWD_DATA_TRANSFORMS = frozenset({2, 3, 4, 5})  # backward-data FFT, FFT_TILING, WINOGRAD(_NONFUSED)
_MIN_WORKSPACE_LIMIT = 1 << 30
_INT_MAX = 2**31 - 1

# graph API enumerations (cudnn_graph.h, stable since cuDNN 8)
_T_HANDLE, _T_DATA_TYPE, _T_INT64, _T_FLOAT, _T_VOID_PTR = 0, 1, 3, 4, 6
_T_CONV_MODE, _T_HEUR_MODE, _T_NUMERICAL_NOTE, _T_DESCRIPTOR = 7, 8, 11, 15
_D_CONVOLUTION, _D_ENGINE, _D_ENGINECFG, _D_ENGINEHEUR, _D_EXECUTION_PLAN = 1, 2, 3, 4, 5
_D_CONV_FORWARD, _D_CONV_BACKWARD_DATA, _D_OPERATION_GRAPH, _D_VARIANT_PACK, _D_TENSOR = (
    10, 12, 15, 16, 17)
_A_CONV_COMP_TYPE, _A_CONV_MODE, _A_CONV_DILATIONS, _A_CONV_STRIDES = 100, 101, 102, 103
_A_CONV_POST_PADDINGS, _A_CONV_PRE_PADDINGS, _A_CONV_SPATIAL_DIMS = 104, 105, 106
_A_HEUR_MODE, _A_HEUR_GRAPH, _A_HEUR_RESULTS, _A_CFG_ENGINE = 200, 201, 202, 300
_A_PLAN_HANDLE, _A_PLAN_CONFIG, _A_PLAN_WORKSPACE = 400, 401, 402
_A_FORWARD = {"alpha": 700, "beta": 701, "conv": 702, "w": 703, "x": 704, "y": 705}
_A_BACKWARD_DATA = {"alpha": 706, "beta": 707, "conv": 708, "w": 709, "y": 710, "x": 711}
_A_GRAPH_HANDLE, _A_GRAPH_OPS = 800, 801
_A_TENSOR_ALIGNMENT, _A_TENSOR_TYPE, _A_TENSOR_DIMS, _A_TENSOR_STRIDES, _A_TENSOR_UID = (
    900, 901, 902, 903, 906)
_A_PACK_UIDS, _A_PACK_POINTERS, _A_PACK_WORKSPACE = 1000, 1001, 1003
_A_ENGINE_NOTES = 1303
_HEUR_INSTANT, _HEUR_FALLBACK = 0, 2
_NOTES_NOT_FP32 = {0, 1, 2}  # tensor core (TF32), down-converted inputs, reduced-precision sums
_NOTE_COUNT = 10
_UID_X, _UID_W, _UID_Y = 1, 2, 3


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


@dataclass
class _GraphPlan:
    """A finalised graph-API execution plan; ``keep`` holds the descriptors it was built from."""

    plan: ctypes.c_void_p
    workspace: int
    keep: list


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

    def __init__(self, loaded: Callable[[str], str | None] = lambda stem: None,
                 graph_api: bool = True) -> None:
        self.lib = _library(loaded)
        self.lib.cudnnGetErrorString.restype = ctypes.c_char_p
        for name in ("cudnnSetStream", "cudnnConvolutionForward", "cudnnConvolutionBackwardData"):
            getattr(self.lib, name).argtypes = None
        self.graph_api = graph_api and hasattr(self.lib, "cudnnBackendExecute")
        if self.graph_api:
            vp, i64 = ctypes.c_void_p, ctypes.c_int64
            self.lib.cudnnBackendCreateDescriptor.argtypes = [ctypes.c_int, ctypes.POINTER(vp)]
            self.lib.cudnnBackendSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int, i64, vp]
            self.lib.cudnnBackendGetAttribute.argtypes = [
                vp, ctypes.c_int, ctypes.c_int, i64, ctypes.POINTER(i64), vp]
            for name in ("cudnnBackendFinalize", "cudnnBackendDestroyDescriptor"):
                getattr(self.lib, name).argtypes = [vp]
            self.lib.cudnnBackendExecute.argtypes = [vp, vp, vp]
        self._handles = threading.local()
        self._plans: dict[tuple, _Plan | _GraphPlan] = {}
        self._lock = threading.Lock()
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._workspace_limit: int | None = None

    def workspace_limit(self) -> int:
        """The largest workspace an engine may ask for: a quarter of the GPU's free memory when
        first asked, at least 1 GiB. Eager's convolutions are bounded only by what its allocator
        can give, and at large batches the engines cuDNN ranks first can need more than 1 GiB
        (AlexNet at batch 1024 ran 1.6x slower under that cap on the H200)."""
        if self._workspace_limit is None:
            import torch

            free, _ = torch.cuda.mem_get_info()
            self._workspace_limit = max(_MIN_WORKSPACE_LIMIT, free // 4)
        return self._workspace_limit

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

    def _descriptor(self, kind: int, attributes: list[tuple], finalize: bool = True) -> Any:
        """A graph-API descriptor with ``attributes`` (name, type, ctype, values) set; ``None``
        when cuDNN refuses to finalise it."""
        lib, desc = self.lib, ctypes.c_void_p()
        self._check(lib.cudnnBackendCreateDescriptor(kind, ctypes.byref(desc)), "descriptor")
        for name, kind_, ctype, values in attributes:
            array = (ctype * len(values))(*values)
            status = lib.cudnnBackendSetAttribute(desc, name, kind_, len(values), array)
            self._check(status, f"graph attribute {name}")
        if finalize and lib.cudnnBackendFinalize(desc):
            lib.cudnnBackendDestroyDescriptor(desc)
            return None
        return desc

    def _get(self, desc: Any, name: int, kind: int, ctype: Any, count: int) -> list:
        """Up to ``count`` values of a graph-API attribute."""
        got, array = ctypes.c_int64(), (ctype * max(count, 1))()
        status = self.lib.cudnnBackendGetAttribute(desc, name, kind, count, ctypes.byref(got), array)
        self._check(status, f"graph attribute {name}")
        return list(array[: got.value])

    def _engine_configs(self, graph: Any, mode: int) -> list:
        """The engine configurations cuDNN's heuristic ``mode`` proposes, best first."""
        heur = self._descriptor(_D_ENGINEHEUR, [
            (_A_HEUR_GRAPH, _T_DESCRIPTOR, ctypes.c_void_p, [graph.value]),
            (_A_HEUR_MODE, _T_HEUR_MODE, ctypes.c_int, [mode])])
        if heur is None:
            return []
        got = ctypes.c_int64()
        self.lib.cudnnBackendGetAttribute(heur, _A_HEUR_RESULTS, _T_DESCRIPTOR, 0,
                                          ctypes.byref(got), None)
        configs = [self._descriptor(_D_ENGINECFG, [], finalize=False) for _ in range(got.value)]
        array = (ctypes.c_void_p * max(len(configs), 1))(*[c.value for c in configs])
        status = self.lib.cudnnBackendGetAttribute(heur, _A_HEUR_RESULTS, _T_DESCRIPTOR,
                                                   len(configs), ctypes.byref(got), array)
        self.lib.cudnnBackendDestroyDescriptor(heur)
        return configs[: got.value] if status == 0 else []

    def _fp32_only(self, config: Any) -> bool:
        """Whether ``config``'s engine keeps full FP32 math (no TF32, no down-conversion)."""
        engine = self._descriptor(_D_ENGINE, [], finalize=False)
        try:
            count = ctypes.c_int64()
            status = self.lib.cudnnBackendGetAttribute(
                config, _A_CFG_ENGINE, _T_DESCRIPTOR, 1, ctypes.byref(count), ctypes.byref(engine))
            if status:
                return False
            notes = self._get(engine, _A_ENGINE_NOTES, _T_NUMERICAL_NOTE, ctypes.c_int, _NOTE_COUNT)
            return not _NOTES_NOT_FP32.intersection(notes)
        finally:
            self.lib.cudnnBackendDestroyDescriptor(engine)

    def _graph_plan(self, handle: ctypes.c_void_p, key: tuple) -> _GraphPlan | None:
        """The ``engine``-th FP32 engine of cuDNN's heuristics for this convolution, or the last
        one there is when there are fewer (None: none at all)."""
        transposed, xs, ws, ys, stride, padding, dilation, _groups, alignment, engine = key
        i64, vp = ctypes.c_int64, ctypes.c_void_p

        def tensor(uid: int, shape: tuple) -> Any:
            return self._descriptor(_D_TENSOR, [
                (_A_TENSOR_TYPE, _T_DATA_TYPE, ctypes.c_int, [_FLOAT]),
                (_A_TENSOR_DIMS, _T_INT64, i64, list(shape)),
                (_A_TENSOR_STRIDES, _T_INT64, i64, _contiguous_strides(list(shape))),
                (_A_TENSOR_UID, _T_INT64, i64, [uid]),
                (_A_TENSOR_ALIGNMENT, _T_INT64, i64, [alignment])])

        x, w, y = tensor(_UID_X, xs), tensor(_UID_W, ws), tensor(_UID_Y, ys)
        conv = self._descriptor(_D_CONVOLUTION, [
            (_A_CONV_COMP_TYPE, _T_DATA_TYPE, ctypes.c_int, [_FLOAT]),
            (_A_CONV_MODE, _T_CONV_MODE, ctypes.c_int, [_CROSS_CORRELATION]),
            (_A_CONV_SPATIAL_DIMS, _T_INT64, i64, [len(stride)]),
            (_A_CONV_DILATIONS, _T_INT64, i64, list(dilation)),
            (_A_CONV_STRIDES, _T_INT64, i64, list(stride)),
            (_A_CONV_PRE_PADDINGS, _T_INT64, i64, list(padding)),
            (_A_CONV_POST_PADDINGS, _T_INT64, i64, list(padding))])
        if None in (x, w, y, conv):
            return None
        # a transposed convolution is the backward-data pass of the convolution from y to x
        kind, names = ((_D_CONV_BACKWARD_DATA, _A_BACKWARD_DATA) if transposed
                       else (_D_CONV_FORWARD, _A_FORWARD))
        op = self._descriptor(kind, [
            (names["alpha"], _T_FLOAT, ctypes.c_float, [1.0]),
            (names["beta"], _T_FLOAT, ctypes.c_float, [0.0]),
            (names["conv"], _T_DESCRIPTOR, vp, [conv.value]),
            (names["w"], _T_DESCRIPTOR, vp, [w.value]),
            (names["x"], _T_DESCRIPTOR, vp, [x.value]),
            (names["y"], _T_DESCRIPTOR, vp, [y.value])])
        graph = op and self._descriptor(_D_OPERATION_GRAPH, [
            (_A_GRAPH_OPS, _T_DESCRIPTOR, vp, [op.value]),
            (_A_GRAPH_HANDLE, _T_HANDLE, vp, [handle.value])])
        if graph is None:
            return None
        keep = [x, w, y, conv, op, graph]
        found: _GraphPlan | None = None
        for mode in (_HEUR_INSTANT, _HEUR_FALLBACK):
            for config in self._engine_configs(graph, mode):
                plan = self._fp32_only(config) and self._descriptor(_D_EXECUTION_PLAN, [
                    (_A_PLAN_HANDLE, _T_HANDLE, vp, [handle.value]),
                    (_A_PLAN_CONFIG, _T_DESCRIPTOR, vp, [config.value])])
                if plan:
                    (size,) = self._get(plan, _A_PLAN_WORKSPACE, _T_INT64, i64, 1)
                    if size <= self.workspace_limit():
                        if found is not None:
                            self._release(found)
                        found = _GraphPlan(plan, size, [*keep, config])
                        if engine <= 0:
                            return found
                        engine -= 1
                        continue
                    self.lib.cudnnBackendDestroyDescriptor(plan)
                self.lib.cudnnBackendDestroyDescriptor(config)
        return found

    def _release(self, plan: _GraphPlan) -> None:
        """Destroy a plan that is not kept, and its engine configuration."""
        self.lib.cudnnBackendDestroyDescriptor(plan.plan)
        self.lib.cudnnBackendDestroyDescriptor(plan.keep[-1])

    def _plan(self, handle: ctypes.c_void_p, key: tuple) -> _Plan:
        transposed, xs, ws, ys, stride, padding, dilation, groups, _alignment, engine = key
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
        usable = [p for p in perf[: count.value] if not p.status and p.math_type == _FMA_MATH]
        # ranks past cuDNN's first choice skip the FFT and Winograd algorithms: they transform
        # the operands and round differently (1.4e-4 from PyTorch on a 3x3 convolution of
        # normal data, past the 1e-4 a program is judged at)
        transforms = _BWD_DATA_TRANSFORMS if transposed else _FWD_TRANSFORMS
        usable = usable[:1] + [p for p in usable[1:] if p.algo not in transforms]
        # the engine-th FP32 algorithm first, then cuDNN's order (the first when engine is 0)
        for p in usable[min(engine, max(len(usable) - 1, 0)):] + usable:
            size = ctypes.c_size_t()
            if transposed:
                status = lib.cudnnGetConvolutionBackwardDataWorkspaceSize(
                    handle, w, y, conv, x, p.algo, ctypes.byref(size))
            else:
                status = lib.cudnnGetConvolutionForwardWorkspaceSize(
                    handle, x, w, conv, y, p.algo, ctypes.byref(size))
            if status == 0 and size.value <= self.workspace_limit():
                return _Plan(x, w, y, conv, p.algo, size.value)
        msg = (f"cuDNN offers no FP32 algorithm for {'transposed ' if transposed else ''}"
               f"convolution x{list(xs)} w{list(ws)} -> {list(ys)}")
        raise RuntimeError(msg)

    def _new_plan(self, handle: ctypes.c_void_p, key: tuple) -> _Plan | _GraphPlan:
        """The graph API's plan where it has an FP32 engine, else the legacy API's."""
        plan = None
        if self.graph_api:
            try:
                plan = self._graph_plan(handle, key)
            except RuntimeError:  # a descriptor this cuDNN build refuses: the legacy API serves
                plan = None
        return plan or self._plan(handle, key)

    def _execute(self, handle: ctypes.c_void_p, plan: _GraphPlan, pointers: list[int],
                 space: ctypes.c_void_p) -> int:
        """Run a graph-API plan on x, w and y at ``pointers``; cuDNN's status."""
        pack = self._descriptor(_D_VARIANT_PACK, [
            (_A_PACK_UIDS, _T_INT64, ctypes.c_int64, [_UID_X, _UID_W, _UID_Y]),
            (_A_PACK_POINTERS, _T_VOID_PTR, ctypes.c_void_p, pointers),
            (_A_PACK_WORKSPACE, _T_VOID_PTR, ctypes.c_void_p, [space.value])])
        if pack is None:
            return -1
        try:
            return self.lib.cudnnBackendExecute(handle, plan.plan, pack)
        finally:
            self.lib.cudnnBackendDestroyDescriptor(pack)

    def run(self, stream: int, transposed: bool, x: Any, w: Any, y: Any,
            stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...],
            groups: int, engine: int = 0) -> None:
        """``y = conv(x, w)`` or ``conv_transpose(x, w)``, FP32, contiguous NC... tensors.

        ``engine`` picks among the FP32 engines (or legacy algorithms) in the heuristic's order;
        0 is cuDNN's first choice. Batches whose tensors exceed cuDNN's 32-bit element counts run
        in parts of whole images.
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
            pointers = [t.data_ptr() for t in (xp, w, yp)]
            alignment = next(a for a in (16, 8, 4, 1) if not any(p % a for p in pointers))
            key = (transposed, tuple(xs), tuple(ws), tuple(ys), *geometry, groups, alignment,
                   engine)
            plan = self._plans.get((handle.value, key))  # plans belong to a thread's handle
            if plan is None:
                with self._lock:
                    plan = self._plans.get((handle.value, key)) or self._plans.setdefault(
                        (handle.value, key), self._new_plan(handle, key))
            space = (torch.empty(plan.workspace, dtype=torch.uint8, device=x.device)
                     if plan.workspace else None)
            space_ = ctypes.c_void_p(space.data_ptr() if space is not None else None)
            if isinstance(plan, _GraphPlan):
                status = self._execute(handle, plan, pointers, space_)
            elif transposed:
                status = self.lib.cudnnConvolutionBackwardData(
                    handle, ctypes.byref(self.one), plan.w, ctypes.c_void_p(pointers[1]), plan.y,
                    ctypes.c_void_p(pointers[0]), plan.conv, plan.algo, space_,
                    ctypes.c_size_t(plan.workspace), ctypes.byref(self.zero), plan.x,
                    ctypes.c_void_p(pointers[2]))
            else:
                status = self.lib.cudnnConvolutionForward(
                    handle, ctypes.byref(self.one), plan.x, ctypes.c_void_p(pointers[0]), plan.w,
                    ctypes.c_void_p(pointers[1]), plan.conv, plan.algo, space_,
                    ctypes.c_size_t(plan.workspace), ctypes.byref(self.zero), plan.y,
                    ctypes.c_void_p(pointers[2]))
            self._check(status, "transposed convolution" if transposed else "convolution")
