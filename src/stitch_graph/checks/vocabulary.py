"""Word lists the checks compare host code against.

Whether a torch call is harmless bookkeeping, a view, an allocation or real computation, and
which dotted names are off limits, is decided by name. The lists live in one place so that every
check (and every reader) sees the same vocabulary, and extending it is a data change only.
"""

from __future__ import annotations

import ast

# What the forward path may do with torch

_ALLOCATORS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "tensor",
        "as_tensor",
        "from_numpy",
    }
)
_CONSTANT_ALLOCATORS = frozenset(
    {"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "tensor", "as_tensor"}
)
# torch.<name> calls that are neither compute nor suspicious.
_TORCH_ALLOWED_CALLS = frozenset(
    {
        "torch.device",
        "torch.Size",
        "torch.no_grad",
        "torch.inference_mode",
        "torch.enable_grad",
        "torch.is_tensor",
        "torch.is_floating_point",
        "torch.get_default_dtype",
        "torch.finfo",
        "torch.iinfo",
        "torch.broadcast_shapes",
        "torch.promote_types",
        "torch.result_type",
        "torch.cuda.current_stream",
        "torch.cuda.default_stream",
        "torch.cuda.current_device",
        "torch.cuda.device",
        "torch.cuda.is_available",
        "torch.cuda.get_device_properties",
        "torch.cuda.get_device_capability",
        "torch.cuda.synchronize",
        "torch.cuda.graph",
        "torch.cuda.CUDAGraph",
        "torch.cuda.graph_pool_handle",
        "torch.cuda.stream",
        "torch.cuda.Stream",
        "torch.nn.Parameter",
        "torch.nn.parameter.Parameter",
        "torch.nn.init.calculate_gain",
        "torch.utils.cpp_extension.load_inline",
    }
)
# torch.<name> calls that return something other than a tensor.
_TORCH_NON_TENSOR_CALLS = _TORCH_ALLOWED_CALLS - {
    "torch.nn.Parameter",
    "torch.nn.parameter.Parameter",
}
# Ops that return a view of their first operand, the same whether spelled as a method
# (``x.flatten(1)``) or as a torch function (``torch.flatten(x, 1)``). ``reshape`` and
# ``flatten`` copy a tensor whose strides do not allow a view; that copy is data movement, not
# computation, as it is for ``.contiguous()``.
_VIEW_OPS = frozenset(
    {
        "reshape",
        "flatten",
        "unflatten",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "swapaxes",
        "swapdims",
        "t",
        "adjoint",
        "narrow",
        "select",
        "split",
        "tensor_split",
        "hsplit",
        "vsplit",
        "dsplit",
        "chunk",
        "unbind",
        "diagonal",
        "as_strided",
        "movedim",
        "moveaxis",
        "view_as_real",
        "view_as_complex",
        "detach",
    }
)
# Views, layout changes and allocations that exist only as tensor methods.
_VIEW_METHODS = _VIEW_OPS | frozenset(
    {
        "view",
        "view_as",
        "reshape_as",
        "expand",
        "expand_as",
        "contiguous",
        "requires_grad_",
        "cuda",
        "to",
        "float",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_tensor",
        "zero_",
        "fill_",
        "record_stream",
        "pin_memory",
    }
)
_NEW_ALLOC_METHODS = frozenset(
    {"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor"}
)
_QUERY_METHODS = frozenset(
    {
        "size",
        "numel",
        "nelement",
        "dim",
        "ndimension",
        "stride",
        "data_ptr",
        "is_contiguous",
        "element_size",
        "storage_offset",
        "get_device",
        "untyped_storage",
        "is_floating_point",
        "is_complex",
        "type",
    }
)
_QUERY_ATTRS = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "is_cuda",
        "layout",
        "requires_grad",
        "itemsize",
        "nbytes",
    }
)
_TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "data", "real", "imag", "grad"})
_VALUE_READ_METHODS = frozenset({"item", "tolist", "any", "all", "cpu", "numpy", "__bool__"})
_HALF_METHODS = frozenset({"half", "bfloat16"})
_HALF_DTYPES = frozenset(
    {"torch.float16", "torch.half", "torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"}
)
# Method names that mean compute on any receiver that is not known to be something else.
_COMPUTE_METHODS = frozenset(
    {
        "add",
        "add_",
        "sub",
        "sub_",
        "mul",
        "mul_",
        "div",
        "div_",
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "sum",
        "mean",
        "prod",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "pow",
        "abs",
        "neg",
        "relu",
        "relu_",
        "sigmoid",
        "tanh",
        "softmax",
        "log_softmax",
        "clamp",
        "clamp_",
        "clip",
        "norm",
        "var",
        "std",
        "cumsum",
        "cumprod",
        "sort",
        "topk",
        "where",
        "masked_fill",
        "masked_fill_",
        "copy_",
        "clone",
        "conv2d",
        "einsum",
        "sign",
        "floor",
        "ceil",
        "round",
        "gelu",
        "erf",
        "sin",
        "cos",
        "square",
        "reciprocal",
        "lerp",
        "addcmul",
        "addcdiv",
        "index_select",
        "gather",
        "scatter",
        "scatter_add",
        "repeat",
        "tile",
        "flip",
        "roll",
        "logsumexp",
        "fmod",
        "remainder",
        "dot",
        "outer",
        "tril",
        "triu",
        "diag",
    }
)

# Names that are off limits, by dotted prefix

_CODEGEN_PREFIXES = (
    "torch.compile",
    "torch.cuda.jiterator",
    "torch.jit",
    "torch._dynamo",
    "torch._inductor",
    "torch.utils.cpp_extension",
    "torch.ops",
    "torch._C",
    "torch._ops",
    "torch.fx",
    "torch.export",
    "torch.library",
    "triton",
    "numba",
    "jax",
    "jaxlib",
    "tvm",
    "tensorflow",
    "onnxruntime",
    "cupy.ElementwiseKernel",
    "cupy.ReductionKernel",
    "cupy.fuse",
    "cupyx.jit",
    "pycuda",
    "cuda.nvrtc",
    "cuda.bindings.nvrtc",
    "importlib",
    "runpy",
)
# Names under a banned prefix that are honest builds of the file's own CUDA text (the builds
# themselves are checked in stitch_graph.checks.external). CuPy's RawKernel and RawModule are
# not under a banned prefix at all.
_CODEGEN_ALLOWED = frozenset({"torch.utils.cpp_extension", "torch.utils.cpp_extension.load_inline"})
_TIMING_PREFIXES = (
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent.futures",
    "subprocess",
    "signal",
    "asyncio",
    "sched",
    "atexit",
    "builtins",
    "os.system",
    "os.popen",
    "os.fork",
    "os.kill",
    "os.spawnl",
    "os.spawnv",
    "os.execv",
    "os.execl",
    "time.sleep",
    "torch.cuda.Event",
    "torch.cuda.set_sync_debug_mode",
    "torch.cuda.nvtx",
    "torch.profiler",
)
_REFERENCE_PREFIXES = (
    "inspect",
    "gc",
    "sys.modules",
    "sys._getframe",
    "sys.argv",
    "__main__",
    "linecache",
    "pathlib",
    "glob",
    "io.open",
    "os.listdir",
    "os.scandir",
    "os.walk",
    "traceback",
)
_PRECISION_PREFIXES = ("torch.autocast", "torch.cuda.amp", "torch.amp")
_REFERENCE_MODULES = frozenset({"problem", "reference", "ref", "kernelbench", "model", "__main__"})
_REFERENCE_NAMES = frozenset({"Model", "get_inputs", "get_init_inputs"})
_MUTABLE_ROOTS = ("torch", "time", "builtins", "sys", "os", "cupy", "numpy", "math", "gc")
_TF32_FLAGS = frozenset(
    {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"}
)
# Stream constructors whose work escapes the timed stream unless joined back.
_STREAM_CONSTRUCTORS = frozenset({"torch.cuda.Stream", "cupy.cuda.Stream"})
# open() modes that only write: a build step writing its source or library, never a read.
_WRITE_ONLY_MODES = frozenset({"w", "wb", "wt", "x", "xb", "xt"})
# Array routines of other libraries that are allowed in the forward path: views of torch
# memory, scalar types, streams, the launchers themselves, and GEMMs that CuPy hands to cuBLAS
# (a vendor library, as KERNELS.sgemm is).
_ARRAY_LIBRARY_ROOTS = ("cupy", "cupyx", "numpy", "scipy")
_ARRAY_ALLOWED_PREFIXES = (
    "cupy.cuda",
    "cupy.RawKernel",
    "cupy.RawModule",
    "cupy.asarray",
    "cupy.matmul",
    "cupy.dot",
    "cupy.cublas",
    "cupy.from_dlpack",
    "cupy.fromDlpack",
    "cupy.ndarray",
    "cupy.dtype",
    "cupy.intc",
    "cupy.uintp",
    "cupy.int8",
    "cupy.int16",
    "cupy.int32",
    "cupy.int64",
    "cupy.uint8",
    "cupy.uint16",
    "cupy.uint32",
    "cupy.uint64",
    "cupy.float32",
    "cupy.float64",
    "cupy.bool_",
    "numpy.intc",
    "numpy.uintp",
    "numpy.int8",
    "numpy.int16",
    "numpy.int32",
    "numpy.int64",
    "numpy.uint8",
    "numpy.uint16",
    "numpy.uint32",
    "numpy.uint64",
    "numpy.float32",
    "numpy.float64",
    "numpy.bool_",
    "numpy.dtype",
    "numpy.prod",
    "numpy.ctypeslib",
)
_CACHE_DECORATORS = frozenset(
    {
        "functools.lru_cache",
        "functools.cache",
        "functools.cached_property",
        "lru_cache",
        "cache",
        "cached_property",
    }
)
_DANGEROUS_BUILTINS = {
    "exec": "codegen_call",
    "eval": "codegen_call",
    "compile": "codegen_call",
    "__import__": "codegen_call",
    "open": "reference_access",
    "globals": "reference_access",
    "vars": "reference_access",
    "breakpoint": "timing_tamper",
}
_LAUNCHER_NAMES = frozenset({"KERNELS", "LIB"})
# CUDA libraries whose calls do real work on device buffers (cuBLAS GEMMs, cuDNN convolutions).
_LIBRARY_MODULES = frozenset({"cublas", "cublasLt", "cudnn", "cufft", "cusparse", "cusolver"})

# Annotations that mark a forward parameter as a Python value rather than a tensor.
_SCALAR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "tuple", "list", "dict"})

# The torch op a Python operator on tensors stands for.
_BINOP_NAMES: dict[type[ast.operator], str] = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "floor_divide",
    ast.Mod: "remainder",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.BitAnd: "bitwise_and",
    ast.BitOr: "bitwise_or",
    ast.BitXor: "bitwise_xor",
    ast.LShift: "bitwise_left_shift",
    ast.RShift: "bitwise_right_shift",
}
