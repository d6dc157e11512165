"""Static hack checks, run on a candidate before it is ever executed.

A generated program can pass a correctness test and post a speedup without doing the work in CUDA:
it can call PyTorch, cache outputs across calls, return constants that happen to fall inside the
tolerance, branch on input values, patch the timer, or read the reference. Running such a program
wastes GPU time and, worse, rewards the trick. These checks read the host code's syntax tree and
the CUDA text and report what they find, so the Verifier can refuse the candidate (and a trainer can
use it as a negative) before anything runs.

The checks are heuristics: they aim to let an honest program through untouched and to catch the
known tricks, not to prove anything. Ops the candidate openly leaves to PyTorch
(``Candidate.declared_torch_ops``) are reported as declared uses, not as hacks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from stitch_graph.artifacts import Candidate, HackFinding, HackReport
from stitch_graph.checks.opnames import bare_op_name, op_key, op_keys

__all__ = ["HACK_RULES", "HackReport", "check_candidate"]

HACK_RULES: dict[str, str] = {
    "codegen_call": "Code is generated or compiled at run time by something other than the "
    "candidate's own CUDA (torch.compile, TorchScript, Triton, cupy kernel builders, exec/eval, "
    "dynamic imports, torch.ops/torch._C).",
    "constant_output": "The returned output is a constant or a fresh allocation that no kernel "
    "writes.",
    "declared_torch_op": "Informational: an op the candidate openly leaves to PyTorch "
    "(declared_torch_ops); allowed, but it lowers operator coverage.",
    "host_syntax_error": "The host code does not parse as Python, so nothing about it can be "
    "trusted.",
    "input_branch": "The host code reads input values (.item(), .any(), .tolist(), comparisons "
    "of tensors in conditions), so its behaviour can depend on the test data.",
    "missing_model_new": "The host code defines no ModelNew class.",
    "no_kernel_launch": "The forward path launches no CUDA kernel at all.",
    "output_cache": "Outputs are cached across calls (results kept on self or in globals, caches "
    "keyed by data_ptr()/id(), functools caches) instead of being computed each call.",
    "precision_downgrade": "The program computes in lower precision than the reference (half or "
    "bfloat16 casts, TF32 switches, half/TF32 tensor-core fragments on fp32 data).",
    "reference_access": "The program reads the reference: imports Model or get_inputs, inspects "
    "modules, frames or the garbage collector, opens files, or copies the reference's forward.",
    "timing_tamper": "The program patches torch, time or builtins, creates timing events, sleeps, "
    "or starts threads or processes, any of which can distort measurement.",
    "torch_compute": "PyTorch computes part of the result in the forward path (torch or "
    "functional calls, tensor methods or arithmetic, advanced indexing, nn submodule calls) "
    "without declaring it.",
    "trivial_kernel": "The launched kernels do no real work: an empty body, or only copies or "
    "constant stores.",
}

# ------------------------------------------------------------------------------------------
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

# ------------------------------------------------------------------------------------------
# Names that are off limits, by dotted prefix

_CODEGEN_PREFIXES = (
    "torch.compile",
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
    "cupy.RawKernel",
    "cupy.RawModule",
    "cupy.fuse",
    "cupyx.jit",
    "pycuda",
    "cuda.nvrtc",
    "cuda.bindings.nvrtc",
    "importlib",
    "runpy",
)
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


def _attribute_chain(node: ast.AST) -> list[str]:
    """``a.b.c`` as ``["a", "b", "c"]`` (empty when the root is not a plain name)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    parts.append(node.id)
    return parts[::-1]


# ------------------------------------------------------------------------------------------
# Collecting findings


@dataclass
class _Collector:
    findings: list[HackFinding] = field(default_factory=list)
    notes: list[HackFinding] = field(default_factory=list)
    declared: list[str] = field(default_factory=list)
    _seen: set[tuple[str, int | None, str]] = field(default_factory=set)

    def add(self, rule: str, detail: str, node: ast.AST | None = None) -> None:
        line = getattr(node, "lineno", None) if node is not None else None
        key = (rule, line, "" if line is not None else detail)
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(HackFinding(rule=rule, detail=detail, line=line))

    def declare(self, op: str, detail: str, node: ast.AST | None = None) -> None:
        line = getattr(node, "lineno", None) if node is not None else None
        key = ("declared_torch_op", line, detail)
        if key in self._seen:
            return
        self._seen.add(key)
        self.notes.append(HackFinding(rule="declared_torch_op", detail=detail, line=line))
        if op not in self.declared:
            self.declared.append(op)


# ------------------------------------------------------------------------------------------
# Name resolution


def _const_str(node: ast.AST) -> str | None:
    """The value of a string expression built only from literals, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const_str(node.left), _const_str(node.right)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue):
                inner = _const_str(value.value)
                if inner is None:
                    return None
                parts.append(inner)
            else:
                return None
        return "".join(parts)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.List | ast.Tuple)
    ):
        sep = _const_str(node.func.value)
        items = [_const_str(e) for e in node.args[0].elts]
        if sep is not None and all(i is not None for i in items):
            return sep.join(i for i in items if i is not None)
    return None


class _Names:
    """Maps local names to the dotted module paths they stand for (``F`` → torch.nn.functional)."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        # Simple rebinding: ``f = torch.relu`` or ``c = getattr(torch, "compile")``.
        for _ in range(2):
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                ):
                    dotted = self.dotted(node.value)
                    if dotted and dotted.split(".")[0] in self._modules():
                        self.aliases.setdefault(node.targets[0].id, dotted)

    def _modules(self) -> set[str]:
        return {v.split(".")[0] for v in self.aliases.values()}

    def dotted(self, node: ast.AST) -> str | None:
        """The dotted path ``node`` refers to, when it is rooted at an imported name."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
        ):
            base = self.dotted(node.args[0])
            name = _const_str(node.args[1])
            if base and name:
                return f"{base}.{name}"
        return None


def _has_prefix(dotted: str, prefixes: Iterable[str]) -> str | None:
    for prefix in prefixes:
        if dotted == prefix or dotted.startswith(prefix + "."):
            return prefix
    return None


def _attr_chain(node: ast.AST) -> str | None:
    """``self.a.b`` for nested attributes on a plain name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _attr_chain(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _view_operand(node: ast.Call, names: _Names) -> ast.AST | None:
    """The tensor a view call returns a view of, for every spelling: ``x.flatten(1)``,
    ``torch.flatten(x, 1)``, ``torch.Tensor.flatten(x, 1)``; None for any other call."""
    func = node.func
    dotted = names.dotted(func)
    if dotted:
        last = dotted.rsplit(".", 1)[-1]
        functional = dotted == f"torch.{last}" and last in _VIEW_OPS
        unbound = dotted == f"torch.Tensor.{last}" and last in _VIEW_METHODS
        if not (functional or unbound) or last in _NEW_ALLOC_METHODS:
            return None
        if node.args:
            return node.args[0]
        return next((k.value for k in node.keywords if k.arg in {"input", "self"}), None)
    if isinstance(func, ast.Attribute) and func.attr in _VIEW_METHODS:
        return None if func.attr in _NEW_ALLOC_METHODS else func.value
    return None


# ------------------------------------------------------------------------------------------
# Module-wide checks: imports, banned names, patching, dynamic code


def _check_module(tree: ast.Module, names: _Names, out: _Collector, fp32_reference: bool) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            _check_import(node, out)
        elif isinstance(node, ast.Attribute | ast.Name) and isinstance(
            getattr(node, "ctx", None), ast.Load
        ):
            _check_reference(node, names, out, fp32_reference)
        if isinstance(node, ast.Call):
            _check_call_anywhere(node, names, out)
            if fp32_reference:
                _check_half_cast(node, out)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                _check_patch(target, node, names, out)
    _check_side_streams(tree, names, out)


def _check_import(node: ast.Import | ast.ImportFrom, out: _Collector) -> None:
    modules: list[str] = []
    if isinstance(node, ast.Import):
        modules = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            out.add("reference_access", f"relative import from {'.' * node.level}{base}", node)
        for alias in node.names:
            modules.append(f"{base}.{alias.name}" if base else alias.name)
            if alias.name in _REFERENCE_NAMES:
                out.add("reference_access", f"imports {alias.name} from {base or '.'}", node)
        if base.split(".")[0] in _REFERENCE_MODULES:
            out.add("reference_access", f"imports from module {base!r}", node)
    for module in modules:
        if module.split(".")[0] in _REFERENCE_MODULES:
            out.add("reference_access", f"imports module {module!r}", node)
        for rule, prefixes in (
            ("codegen_call", _CODEGEN_PREFIXES),
            ("timing_tamper", _TIMING_PREFIXES),
            ("reference_access", _REFERENCE_PREFIXES),
            ("precision_downgrade", _PRECISION_PREFIXES),
        ):
            hit = _has_prefix(module, prefixes)
            if hit:
                out.add(rule, f"imports {module}", node)


def _check_reference(
    node: ast.Attribute | ast.Name, names: _Names, out: _Collector, fp32_reference: bool
) -> None:
    if isinstance(node, ast.Name):
        if node.id in _REFERENCE_NAMES:
            out.add("reference_access", f"refers to the reference's {node.id}", node)
        if node.id in {"__builtins__", "__main__"}:
            rule = "timing_tamper" if node.id == "__builtins__" else "reference_access"
            out.add(rule, f"refers to {node.id}", node)
    dotted = names.dotted(node)
    if not dotted:
        return
    for rule, prefixes in (
        ("codegen_call", _CODEGEN_PREFIXES),
        ("timing_tamper", _TIMING_PREFIXES),
        ("reference_access", _REFERENCE_PREFIXES),
        ("precision_downgrade", _PRECISION_PREFIXES),
    ):
        if _has_prefix(dotted, prefixes):
            out.add(rule, f"uses {dotted}", node)
    if fp32_reference and dotted in _HALF_DTYPES:
        out.add("precision_downgrade", f"uses {dotted} for an fp32 reference", node)
    if dotted == "torch.set_float32_matmul_precision":
        out.add("precision_downgrade", "changes float32 matmul precision", node)


def _check_call_anywhere(node: ast.Call, names: _Names, out: _Collector) -> None:
    func = node.func
    if isinstance(func, ast.Name) and func.id not in names.aliases:
        rule = _DANGEROUS_BUILTINS.get(func.id)
        if rule:
            out.add(rule, f"calls {func.id}()", node)
        if func.id in {"getattr", "setattr", "delattr"} and node.args:
            base = names.dotted(node.args[0])
            if func.id == "getattr" and base and len(node.args) >= 2:
                literal = isinstance(node.args[1], ast.Constant)
                if not literal:
                    assembled = _const_str(node.args[1])
                    shown = repr(assembled) if assembled is not None else "a computed name"
                    out.add("codegen_call", f"getattr({base}, {shown}) hides the name used", node)
            if func.id in {"setattr", "delattr"} and base:
                if base.split(".")[0] in _MUTABLE_ROOTS:
                    out.add("timing_tamper", f"{func.id}() on {base}", node)
    if isinstance(func, ast.Attribute) and func.attr in {"__setattr__", "__delattr__"}:
        base = names.dotted(func.value)
        if base and base.split(".")[0] in _MUTABLE_ROOTS:
            out.add("timing_tamper", f"{func.attr} on {base}", node)


def _check_patch(target: ast.AST, node: ast.AST, names: _Names, out: _Collector) -> None:
    for sub in ast.walk(target):
        if not isinstance(sub, ast.Attribute):
            continue
        dotted = names.dotted(sub)
        if not dotted:
            continue
        if dotted in _TF32_FLAGS:
            value = getattr(node, "value", None)
            if not (isinstance(value, ast.Constant) and value.value is False):
                out.add("precision_downgrade", f"sets {dotted}", node)
            return
        if dotted.split(".")[0] in _MUTABLE_ROOTS:
            out.add("timing_tamper", f"assigns to {dotted}", node)
            return


def _check_side_streams(tree: ast.Module, names: _Names, out: _Collector) -> None:
    creates = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and names.dotted(n.func) == "torch.cuda.Stream"
    ]
    joins = any(
        isinstance(n, ast.Attribute) and n.attr in {"wait_stream", "wait_event", "synchronize"}
        for n in ast.walk(tree)
    )
    if creates and not joins:
        out.add(
            "timing_tamper",
            "work on a side stream that is never joined to the current stream escapes timing",
            creates[0],
        )


# ------------------------------------------------------------------------------------------
# The class and its forward path


@dataclass
class _ModelInfo:
    cls: ast.ClassDef
    methods: dict[str, ast.FunctionDef]
    tensor_attrs: set[str]
    submodules: dict[str, str]  # attribute -> nn class dotted name
    launcher_attrs: set[str]


def _find_model(tree: ast.Module, names: _Names) -> _ModelInfo | None:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if cls is None:
        return None
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    tensor_attrs: set[str] = set()
    submodules: dict[str, str] = {}
    launcher_attrs: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in {"register_buffer", "register_parameter"} and node.args:
                name = _const_str(node.args[0])
                if name:
                    tensor_attrs.add(name)
            if node.func.attr == "add_module" and node.args:
                name = _const_str(node.args[0])
                if name:
                    submodules[name] = "torch.nn.Module"
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        if value is None:
            continue
        for target in targets:
            if not (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                continue
            attr = target.attr
            dotted = names.dotted(value.func) if isinstance(value, ast.Call) else None
            root = _attr_chain(value.func) if isinstance(value, ast.Call) else _attr_chain(value)
            if dotted and dotted.startswith("torch.nn.") and dotted.split(".")[-1][:1].isupper():
                if dotted.split(".")[-1] in {"Parameter", "Buffer"}:
                    tensor_attrs.add(attr)
                else:
                    submodules[attr] = dotted
            elif dotted and dotted.startswith("torch."):
                tensor_attrs.add(attr)
            elif root and root.split(".")[0] in _LAUNCHER_NAMES:
                launcher_attrs.add(attr)
    return _ModelInfo(cls, methods, tensor_attrs, submodules, launcher_attrs)


@dataclass
class _Function:
    node: ast.FunctionDef | ast.AsyncFunctionDef
    is_method: bool
    tensor_params: set[str] = field(default_factory=set)


def _forward_path(tree: ast.Module, model: _ModelInfo) -> dict[str, _Function]:
    """Forward and every method or module function it calls or refers to, keyed by name."""
    module_funcs = {
        n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    forward = model.methods.get("forward")
    if forward is None:
        return {}
    path: dict[str, _Function] = {"forward": _Function(forward, True)}
    todo = ["forward"]
    while todo:
        current = path[todo.pop()]
        # referenced, not only called: a method handed to a helper as a callback runs too
        for func in ast.walk(current.node):
            key: str | None = None
            target: ast.FunctionDef | ast.AsyncFunctionDef | None = None
            is_method = False
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
                and func.attr in model.methods
            ):
                key, target, is_method = f"self.{func.attr}", model.methods[func.attr], True
            elif (
                isinstance(func, ast.Name)
                and isinstance(func.ctx, ast.Load)
                and func.id in module_funcs
            ):
                key, target = func.id, module_funcs[func.id]
            if key and target is not None and key not in path and key != "self.forward":
                path[key] = _Function(target, is_method)
                todo.append(key)
    return path


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[ast.arg]:
    args = [*func.args.posonlyargs, *func.args.args]
    return args[1:] if is_method and args else args


_SCALAR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "tuple", "list", "dict"})


def _annotated_scalar(arg: ast.arg) -> bool:
    ann = arg.annotation
    if ann is None:
        return False
    text = ast.unparse(ann)
    return any(re.search(rf"\b{s}\b", text) for s in _SCALAR_ANNOTATIONS) and "Tensor" not in text


class _Analyzer:
    """Tensor-ness of expressions inside one function of the forward path."""

    def __init__(
        self, fn: _Function, model: _ModelInfo, names: _Names, path: dict[str, _Function]
    ) -> None:
        self.fn = fn
        self.model = model
        self.names = names
        self.path = path
        self.tensors: set[str] = set(fn.tensor_params)
        self.launchers: set[str] = set()
        self.tensor_attrs = set(model.tensor_attrs)
        self._infer_locals()

    def _infer_locals(self) -> None:
        for _ in range(3):
            for node in ast.walk(self.fn.node):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        self._bind(target, node.value)
                elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                    self._bind(node.target, node.value)
                elif isinstance(node, ast.NamedExpr):
                    self._bind(node.target, node.value)
                elif isinstance(node, ast.For):
                    if self.is_tensor(node.iter):
                        self._bind_all(node.target)
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    if self.is_tensor(node.context_expr):
                        self._bind_all(node.optional_vars)

    def _bind_all(self, target: ast.AST) -> None:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                self.tensors.add(sub.id)

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            if self.is_tensor(value):
                self.tensors.add(target.id)
            if self.is_launcher(value):
                self.launchers.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._bind(t, v)
            elif self.is_tensor(value) and not self._is_query(value):
                self._bind_all(target)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and self.is_tensor(value)
        ):
            self.tensor_attrs.add(target.attr)

    def _is_query(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in _QUERY_ATTRS

    def is_launcher(self, node: ast.AST) -> bool:
        """Whether ``node`` is KERNELS/LIB or one of their kernels."""
        if isinstance(node, ast.Name):
            return node.id in _LAUNCHER_NAMES or node.id in self.launchers
        if isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr in self.model.launcher_attrs
            ):
                return True
            return self.is_launcher(node.value)
        if isinstance(node, ast.Subscript):
            return self.is_launcher(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "getattr" and node.args:
                return self.is_launcher(node.args[0])
        return False

    def is_launch(self, call: ast.Call) -> bool:
        """Whether ``call`` launches a kernel, calls a CUDA library, or replays a graph."""
        if self.is_launcher(call.func):
            return True
        if not isinstance(call.func, ast.Attribute):
            return False
        if call.func.attr == "replay":
            return True
        return bool(_LIBRARY_MODULES & set(_attribute_chain(call.func)[:-1]))

    def is_tensor(self, node: ast.AST | None) -> bool:
        """Whether ``node`` is known to evaluate to a tensor."""
        if node is None:
            return False
        if isinstance(node, ast.Name):
            return node.id in self.tensors
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return node.attr in self.tensor_attrs
            if node.attr in _TENSOR_ATTRS:
                return self.is_tensor(node.value)
            if (
                isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"
                and node.value.attr in self.model.submodules
                and node.attr in {"weight", "bias", "running_mean", "running_var"}
            ):
                return True
            return False
        if isinstance(node, ast.Subscript):
            return self.is_tensor(node.value)
        if isinstance(node, ast.Starred):
            return self.is_tensor(node.value)
        if isinstance(node, ast.BinOp):
            return self.is_tensor(node.left) or self.is_tensor(node.right)
        if isinstance(node, ast.UnaryOp):
            return not isinstance(node.op, ast.Not) and self.is_tensor(node.operand)
        if isinstance(node, ast.IfExp):
            return self.is_tensor(node.body) or self.is_tensor(node.orelse)
        if isinstance(node, ast.Compare):
            if all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
                return False
            return any(self.is_tensor(x) for x in [node.left, *node.comparators])
        if isinstance(node, ast.Call):
            return self._call_is_tensor(node)
        return False

    def _call_is_tensor(self, node: ast.Call) -> bool:
        if self.is_launch(node):
            return False
        dotted = self.names.dotted(node.func)
        if dotted:
            if dotted.startswith("torch.Tensor.") and dotted.rsplit(".", 1)[-1] in _QUERY_METHODS:
                return False
            if dotted.startswith("torch.") and dotted not in _TORCH_NON_TENSOR_CALLS:
                return True
            return False
        func = node.func
        if isinstance(func, ast.Attribute):
            if (
                isinstance(func.value, ast.Name)
                and func.value.id == "self"
                and func.attr in self.model.submodules
            ):
                return True
            if self.is_tensor(func.value):
                return func.attr not in _QUERY_METHODS and func.attr not in {
                    "item",
                    "tolist",
                    "numpy",
                }
        return False

    def resolve_op(self, node: ast.Call) -> tuple[str, str] | None:
        """``(op, shown)`` when ``node`` computes through torch, else None."""
        if self.is_launch(node):
            return None
        func = node.func
        dotted = self.names.dotted(func)
        if dotted and dotted.startswith("torch."):
            if dotted in _TORCH_ALLOWED_CALLS or _has_prefix(dotted, _CODEGEN_PREFIXES):
                return None
            if _has_prefix(dotted, _TIMING_PREFIXES) or _has_prefix(dotted, _PRECISION_PREFIXES):
                return None
            last = dotted.rsplit(".", 1)[-1]
            if dotted.count(".") == 1 and last in _ALLOCATORS:
                return None
            if _view_operand(node, self.names) is not None:
                return None
            if dotted == f"torch.Tensor.{last}" and last in _QUERY_METHODS:
                return None
            if dotted.startswith("torch.cuda.") or dotted.startswith("torch.backends."):
                return None
            if last[:1].isupper() and dotted.startswith("torch.nn."):
                return None  # building a module in forward is odd but not compute by itself
            return bare_op_name(last), dotted
        if isinstance(func, ast.Attribute):
            receiver = func.value
            if (
                isinstance(receiver, ast.Name)
                and receiver.id == "self"
                and func.attr in self.model.submodules
            ):
                cls = self.model.submodules[func.attr]
                return bare_op_name(cls), f"self.{func.attr}() ({cls})"
            method = func.attr
            if method in _VIEW_METHODS or method in _QUERY_METHODS:
                return None
            if method in _VALUE_READ_METHODS or method in _HALF_METHODS:
                return None
            if self.is_tensor(receiver):
                return bare_op_name(method), f".{method}()"
            if method in _COMPUTE_METHODS and not self._known_non_tensor(receiver):
                return bare_op_name(method), f".{method}()"
        return None

    def _known_non_tensor(self, node: ast.AST) -> bool:
        if self.is_launcher(node):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.names.aliases or node.id == "self"
        if isinstance(node, ast.Constant | ast.JoinedStr | ast.List | ast.Dict | ast.Tuple):
            return True
        if self.names.dotted(node):
            return True
        return False


# ------------------------------------------------------------------------------------------
# Per-function checks


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


def _test_nodes(func: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(func):
        tests: list[ast.AST] = []
        if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
        elif isinstance(node, ast.BoolOp):
            tests.extend(node.values)
        for test in tests:
            ids.update(id(sub) for sub in ast.walk(test))
    return ids


def _test_roots(func: ast.AST) -> list[ast.AST]:
    roots: list[ast.AST] = []
    for node in ast.walk(func):
        if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            roots.append(node.test)
        elif isinstance(node, ast.comprehension):
            roots.extend(node.ifs)
    return roots


def _check_function(
    an: _Analyzer, declared: set[str], out: _Collector, fp32_reference: bool
) -> None:
    func = an.fn.node
    in_test = _test_nodes(func)

    def compute(op: str, shown: str, node: ast.AST) -> None:
        if op_key(op) in declared:
            out.declare(op, f"declared torch op {op} via {shown}", node)
        else:
            out.add("torch_compute", f"PyTorch computes {shown} in the forward path", node)

    # Conditions that read tensor values.
    for test in _test_roots(func):
        for sub in _truth_operands(test):
            if an.is_tensor(sub):
                out.add(
                    "input_branch",
                    f"condition depends on tensor values: {ast.unparse(sub)[:60]}",
                    sub,
                )

    for node in ast.walk(func):
        if isinstance(node, ast.Call):
            _check_value_reads(node, an, out)
            resolved = an.resolve_op(node)
            if resolved:
                compute(*resolved, node)
        elif isinstance(node, ast.BinOp):
            if an.is_tensor(node.left) or an.is_tensor(node.right):
                op = _BINOP_NAMES.get(type(node.op), "binary_op")
                compute(op, f"tensor operator {ast.unparse(node)[:60]}", node)
        elif isinstance(node, ast.AugAssign):
            if an.is_tensor(node.target) or an.is_tensor(node.value):
                op = _BINOP_NAMES.get(type(node.op), "binary_op")
                compute(op, f"in-place tensor operator {ast.unparse(node)[:60]}", node)
        elif isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
            if an.is_tensor(node.operand):
                compute("neg", f"tensor operator {ast.unparse(node)[:60]}", node)
        elif isinstance(node, ast.Compare) and id(node) not in in_test:
            if an.is_tensor(node):
                compute("compare", f"tensor comparison {ast.unparse(node)[:60]}", node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and an.is_tensor(target.value):
                    if an.is_tensor(node.value):
                        compute("copy", f"tensor slice assignment {ast.unparse(target)}", node)
        if isinstance(node, ast.Subscript) and an.is_tensor(node.value):
            if _advanced_index(node.slice, an):
                store = isinstance(node.ctx, ast.Store | ast.Del)
                op = "index_put" if store else "index"
                shown = ast.unparse(node)[:60]
                compute(op, f"advanced indexing {shown}" + (" (assignment)" if store else ""), node)

    # functools caches on forward-path functions
    for deco in func.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        dotted = an.names.dotted(target) or _attr_chain(target) or ""
        if dotted in _CACHE_DECORATORS or dotted.rsplit(".", 1)[-1] in {"lru_cache", "cache"}:
            out.add("output_cache", f"{func.name} is wrapped in {dotted}", deco)


def _advanced_index(index: ast.AST, an: _Analyzer) -> bool:
    """Whether a subscript of a tensor gathers or scatters rather than taking a view.

    Ints, slices, ``None`` and ``...`` (and names bound to Python values) index basically, a
    view. A tensor index, a mask built by a comparison or a list of positions makes PyTorch
    gather (or, assigned to, scatter): real work. The source shows only what names are bound
    to, so a tensor is whatever the analyzer knows as one (forward's tensor arguments, module
    parameters and buffers, results of torch calls).
    """
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    for item in items:
        if isinstance(item, ast.List | ast.ListComp | ast.Tuple):
            return True
        if an.is_tensor(item):  # a tensor, or a comparison of one (a mask)
            return True
    return False


def _truth_operands(test: ast.AST) -> Iterator[ast.AST]:
    """The sub-expressions of a condition whose truth value decides it."""
    if isinstance(test, ast.BoolOp):
        for value in test.values:
            yield from _truth_operands(value)
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yield from _truth_operands(test.operand)
    elif isinstance(test, ast.Compare):
        if not all(isinstance(op, ast.Is | ast.IsNot) for op in test.ops):
            yield test
    else:
        yield test


def _check_value_reads(node: ast.Call, an: _Analyzer, out: _Collector) -> None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in _VALUE_READ_METHODS:
        if func.attr in {"item", "tolist", "numpy", "__bool__"} or an.is_tensor(func.value):
            out.add("input_branch", f".{func.attr}() reads tensor values on the host", node)
    dotted = an.names.dotted(func)
    if dotted in {
        "torch.equal",
        "torch.allclose",
        "torch.is_nonzero",
        "torch.any",
        "torch.all",
        "torch.count_nonzero",
    }:
        out.add("input_branch", f"{dotted}() inspects tensor values", node)
    if isinstance(func, ast.Name) and func.id in {"bool", "float", "int", "list", "len"}:
        if func.id != "len" and node.args and an.is_tensor(node.args[0]):
            out.add("input_branch", f"{func.id}(tensor) reads tensor values on the host", node)


def _check_half_cast(node: ast.Call, out: _Collector) -> None:
    func = node.func
    if not isinstance(func, ast.Attribute):
        return
    if func.attr in _HALF_METHODS:
        out.add("precision_downgrade", f".{func.attr}() casts an fp32 computation down", node)


# ------------------------------------------------------------------------------------------
# Data flow of outputs: caches, constants, launches


@dataclass
class _Flow:
    written: set[str] = field(default_factory=set)
    launched: bool = False

    def copy(self) -> _Flow:
        return _Flow(set(self.written), self.launched)


class _OutputFlow:
    """Walks forward in order to see which buffers a kernel writes before each return."""

    def __init__(
        self,
        an: _Analyzer,
        launching_helpers: set[str],
        module_vars: set[str],
        out: _Collector,
    ) -> None:
        self.an = an
        self.helpers = launching_helpers
        self.out = out
        self.roots: dict[str, set[str]] = {}
        self.constant_allocs: set[str] = set()
        self.globals_: set[str] = set(module_vars)
        self.cache_keys: set[str] = set()

    # roots ----------------------------------------------------------------------------------

    def roots_of(self, node: ast.AST | None) -> set[str]:
        if node is None:
            return set()
        if isinstance(node, ast.Name):
            if node.id in self.roots:
                return set(self.roots[node.id])
            if node.id in self.globals_:
                return {f"global.{node.id}"}
            return {node.id}
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return {f"self.{node.attr}"}
            if node.attr in _TENSOR_ATTRS:
                return self.roots_of(node.value)
            return set()
        if isinstance(node, ast.Subscript | ast.Starred):
            return self.roots_of(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _NEW_ALLOC_METHODS:
                return {f"alloc@{node.lineno}:{node.col_offset}"}
            operand = _view_operand(node, self.an.names)
            if operand is not None:
                return self.roots_of(operand)
            if isinstance(func, ast.Attribute) and func.attr in {"get", "setdefault", "pop"}:
                return self.roots_of(func.value)
            dotted = self.an.names.dotted(func)
            if dotted and dotted.count(".") == 1 and dotted.split(".")[1] in _ALLOCATORS:
                return {f"alloc@{node.lineno}:{node.col_offset}"}
        return set()

    def _args_roots(self, call: ast.Call) -> set[str]:
        roots: set[str] = set()
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            for sub in ast.walk(arg):
                if isinstance(sub, ast.Name | ast.Attribute | ast.Subscript | ast.Call):
                    roots |= self.roots_of(sub)
        return roots

    def _helper_key(self, call: ast.Call) -> str | None:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self":
                return f"self.{func.attr}"
        return None

    # walking --------------------------------------------------------------------------------

    def run(self) -> None:
        func = self.an.fn.node
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                self.globals_.update(node.names)
        self._block(func.body, _Flow())

    def _effects(self, node: ast.AST, flow: _Flow) -> None:
        """Launches and helper calls inside one statement's expressions, in source order."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                if self.an.is_launch(sub):
                    flow.launched = True
                    flow.written |= self._args_roots(sub)
                    if isinstance(sub.func, ast.Attribute) and sub.func.attr == "replay":
                        flow.written.add("*")
                elif self._helper_key(sub) in self.helpers:
                    flow.launched = True
                    flow.written |= self._args_roots(sub)
                    flow.written.add("self.*")

    def _assign(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            roots = self.roots_of(value)
            self.roots[target.id] = roots
            if isinstance(value, ast.Call):
                dotted = self.an.names.dotted(value.func) or ""
                if dotted.rsplit(".", 1)[-1] in _CONSTANT_ALLOCATORS:
                    self.constant_allocs |= roots
            if _mentions_identity(value):
                self.cache_keys.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._assign(t, v)

    def _block(self, body: list[ast.stmt], flow: _Flow) -> _Flow | None:
        """Walk statements; returns the flow at the end, or None when every path returned."""
        for stmt in body:
            if isinstance(stmt, ast.Return):
                self._effects(stmt, flow)
                self._check_return(stmt, flow)
                return None
            if isinstance(stmt, ast.If):
                self._effects(stmt.test, flow)
                a = self._block(stmt.body, flow.copy())
                b = self._block(stmt.orelse, flow.copy())
                if a is None and b is None:
                    return None
                flow = _merge(a, b)
                continue
            if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
                head = stmt.iter if isinstance(stmt, ast.For | ast.AsyncFor) else stmt.test
                self._effects(head, flow)
                inner = self._block(stmt.body, flow.copy())
                if inner is not None:  # loops of launches are assumed to run
                    flow = _merge(flow, inner) if not inner.launched else inner
                rest = self._block(stmt.orelse, flow.copy())
                if rest is not None:
                    flow = rest
                continue
            if isinstance(stmt, ast.With | ast.AsyncWith):
                for item in stmt.items:
                    self._effects(item.context_expr, flow)
                inner = self._block(stmt.body, flow)
                if inner is None:
                    return None
                flow = inner
                continue
            if isinstance(stmt, ast.Try):
                inner = self._block(stmt.body, flow.copy())
                handlers = [self._block(h.body, flow.copy()) for h in stmt.handlers]
                paths = [p for p in [inner, *handlers] if p is not None]
                if not paths:
                    return None
                flow = paths[0]
                for p in paths[1:]:
                    flow = _merge(flow, p)
                final = self._block(stmt.finalbody, flow)
                if final is None:
                    return None
                flow = final
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            self._effects(stmt, flow)
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    self._assign(target, stmt.value)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self._assign(stmt.target, stmt.value)
        return flow

    def _constant_expr(self, node: ast.AST, flow: _Flow) -> bool:
        """Whether ``node`` is built only from literals and constant allocations."""
        if isinstance(node, ast.Constant):
            return node.value is not None
        if isinstance(node, ast.Call):
            dotted = self.an.names.dotted(node.func) or ""
            if dotted.startswith("torch") and dotted.rsplit(".", 1)[-1] in _CONSTANT_ALLOCATORS:
                return True
            operand = _view_operand(node, self.an.names)
            if operand is not None:
                return self._constant_expr(operand, flow)
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _NEW_ALLOC_METHODS:
                return self._constant_expr(func.value, flow)
            return False
        if isinstance(node, ast.BinOp):
            return self._constant_expr(node.left, flow) and self._constant_expr(node.right, flow)
        if isinstance(node, ast.UnaryOp):
            return self._constant_expr(node.operand, flow)
        if isinstance(node, ast.Name):
            roots = self.roots_of(node)
            return bool(roots) and all(
                r in self.constant_allocs and r not in flow.written for r in roots
            )
        return False

    def _check_return(self, stmt: ast.Return, flow: _Flow) -> None:
        value = stmt.value
        if value is None:
            return
        items = value.elts if isinstance(value, ast.Tuple | ast.List) else [value]
        for item in items:
            self._check_returned(item, stmt, flow)

    def _check_returned(self, item: ast.AST, stmt: ast.Return, flow: _Flow) -> None:
        shown = ast.unparse(item)[:60]
        if isinstance(item, ast.Constant) and item.value is not None:
            self.out.add("constant_output", f"returns the literal {shown}", stmt)
            return
        if self._constant_expr(item, flow):
            self.out.add("constant_output", f"returns a constant tensor {shown}", stmt)
            return
        if "*" in flow.written:
            return
        roots = self.roots_of(item)
        for root in sorted(roots):
            if root in flow.written:
                continue
            if root.startswith("alloc@"):
                kind = "constant" if root in self.constant_allocs else "fresh"
                self.out.add(
                    "constant_output",
                    f"returns a {kind} allocation ({shown}) that no kernel writes first",
                    stmt,
                )
            elif root.startswith("self.") and "self.*" not in flow.written:
                self.out.add(
                    "output_cache",
                    f"returns {root} without a kernel writing it in this call",
                    stmt,
                )
            elif root.startswith("global."):
                self.out.add(
                    "output_cache",
                    f"returns module state {root[7:]} without a kernel writing it in this call",
                    stmt,
                )


def _merge(a: _Flow | None, b: _Flow | None) -> _Flow:
    if a is None:
        return b.copy() if b else _Flow()
    if b is None:
        return a.copy()
    return _Flow(a.written & b.written, a.launched and b.launched)


def _mentions_identity(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr in {"data_ptr", "untyped_storage"}:
                return True
            if isinstance(func, ast.Name) and func.id in {"id", "hash"}:
                return True
    return False


def _check_keyed_caches(fn: _Function, model: _ModelInfo, out: _Collector) -> None:
    """Containers on self or in globals looked up by an input's identity (data_ptr, id)."""
    key_names: set[str] = set()
    for node in ast.walk(fn.node):
        if isinstance(node, ast.Assign) and _mentions_identity(node.value):
            key_names.update(
                sub.id for t in node.targets for sub in ast.walk(t) if isinstance(sub, ast.Name)
            )

    def is_key(expr: ast.AST) -> bool:
        return _mentions_identity(expr) or any(
            isinstance(s, ast.Name) and s.id in key_names for s in ast.walk(expr)
        )

    def is_store(container: ast.AST) -> bool:
        return not isinstance(container, ast.Name) or container.id not in {"KERNELS", "LIB"}

    for node in ast.walk(fn.node):
        hit = None
        if isinstance(node, ast.Subscript) and is_key(node.slice) and is_store(node.value):
            hit = node
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "setdefault", "__getitem__", "__contains__"}
            and node.args
            and is_key(node.args[0])
        ):
            hit = node
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.In | ast.NotIn) for op in node.ops
        ):
            if is_key(node.left):
                hit = node
        if hit is not None:
            out.add(
                "output_cache",
                f"cache looked up by an input's identity: {ast.unparse(hit)[:60]}",
                hit,
            )


# ------------------------------------------------------------------------------------------
# Reference copying


def _forward_body_text(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    body = list(item.body)
                    if (
                        body
                        and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, ast.Constant)
                    ):
                        body = body[1:]
                    text = "\n".join(ast.unparse(s) for s in body)
                    return re.sub(r"\s+", "", text)
    return None


def _check_copied_reference(reference_source: str, model: _ModelInfo, out: _Collector) -> None:
    body = _forward_body_text(reference_source)
    if not body or len(body) < 12:
        return
    mine = re.sub(r"\s+", "", ast.unparse(model.cls))
    if body in mine:
        out.add(
            "reference_access", "ModelNew contains the reference's forward body verbatim", model.cls
        )


# ------------------------------------------------------------------------------------------
# CUDA source checks


_KERNEL_HEAD = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(([^)]*)\)\s*\{',
    re.S,
)
_HALF_KERNEL = re.compile(
    r"\b(__\w*half\w*|__\w*bfloat16\w*|half2|nv_bfloat16|__float_to_tf32|"
    r"wmma::precision::tf32)\b"
    r"|cvt\.rna\.tf32|\.f16\b|\.bf16\b|\.tf32\b"
)
_LOAD = re.compile(r"^(?:__ldg\s*\(\s*&?\s*)?\w+\s*\[[^\]]*\]\s*\)?$")


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


def _kernel_bodies(source: str) -> dict[str, tuple[str, str]]:
    """Map each extern "C" kernel to ``(parameters, body)``, matching braces."""
    bodies: dict[str, tuple[str, str]] = {}
    for match in _KERNEL_HEAD.finditer(source):
        depth, i = 1, match.end()
        while i < len(source) and depth:
            if source[i] == "{":
                depth += 1
            elif source[i] == "}":
                depth -= 1
            i += 1
        bodies[match.group(1)] = (match.group(2), source[match.end() : i - 1])
    return bodies


def _kernel_kind(params: str, body: str) -> str:
    """``"empty"``, ``"copy"`` (only loads or constants stored) or ``"work"``."""
    text = re.sub(r"\breinterpret_cast\s*<[^>]*>\s*\(\s*(\w+)\s*\)", r"\1", body)
    text = re.sub(r"\(\s*(?:const\s+)?\w+\s*\*\s*\)\s*", "", text)
    compact = re.sub(r"\s+", "", text)
    if compact in {"", "return;", ";"}:
        return "empty"
    pointers = {
        m.group(1) for m in re.finditer(r"\*\s*(?:__restrict__\s*)?(\w+)\s*(?:,|$)", params + ",")
    }
    if re.search(r"\b(atomic\w+|__shfl\w*|asm|wmma|mma|cublas\w*|cudnn\w*)\b", text):
        return "work"
    statements = [s.strip() for s in re.split(r"[;{}]", text) if s.strip()]
    loads: set[str] = set()
    stores = 0
    for stmt in statements:
        decl = re.match(r"^(?:const\s+)?[\w:<>]+\s+(\w+)\s*=\s*(.+)$", stmt, re.S)
        assign = re.match(r"^(\w+)\s*(\[[^\]]*\])?\s*=\s*(.+)$", stmt, re.S)
        if decl:
            name, rhs = decl.group(1), decl.group(2).strip()
            if _LOAD.match(rhs) and rhs.split("[")[0].replace("__ldg", "").strip("( &") in pointers:
                loads.add(name)
            continue
        if assign and assign.group(2) and assign.group(1) in pointers:
            rhs = assign.group(3).strip()
            stores += 1
            if rhs in loads or _LOAD.match(rhs) or re.fullmatch(r"[-+]?[\d.]+[fF]?", rhs):
                continue
            return "work"
        elif re.search(r"[+\-*/%]=|\+\+|--", stmt) and not re.match(
            r"^(?:for|if|while|int|unsigned|size_t|long)\b", stmt
        ):
            # updates of locals such as accumulators count only if stored later
            continue
    return "copy" if stores else "work"


def _launched_kernels(tree: ast.Module | None) -> set[str] | None:
    if tree is None:
        return None
    launched: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "KERNELS":
                launched.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "getattr" and len(node.args) >= 2:
                if isinstance(node.args[0], ast.Name) and node.args[0].id == "KERNELS":
                    name = _const_str(node.args[1])
                    if name:
                        launched.add(name)
    return launched


def _check_kernels(
    candidate: Candidate, tree: ast.Module | None, out: _Collector, fp32_reference: bool
) -> None:
    source = _strip_comments(candidate.kernel_source)
    if fp32_reference:
        match = _HALF_KERNEL.search(source)
        if match:
            line = source.count("\n", 0, match.start()) + 1
            out.findings.append(
                HackFinding(
                    rule="precision_downgrade",
                    detail=f"kernel uses {match.group(0)} while the reference is fp32",
                    line=line,
                )
            )
    bodies = _kernel_bodies(source)
    if not bodies:
        return
    launched = _launched_kernels(tree) if candidate.form == "nvrtc" else None
    relevant = {
        name: pb for name, pb in bodies.items() if launched is None or name in launched
    } or bodies
    kinds = {name: _kernel_kind(*pb) for name, pb in relevant.items()}
    for name, kind in kinds.items():
        if kind == "empty":
            out.add("trivial_kernel", f"kernel {name} has an empty body")
    if kinds and all(k in {"copy", "empty"} for k in kinds.values()):
        if any(k == "copy" for k in kinds.values()):
            names = ", ".join(sorted(kinds))
            out.add("trivial_kernel", f"kernels {names} only copy data or store constants")


# ------------------------------------------------------------------------------------------
# Entry point


def _reference_is_fp32(reference_source: str | None, reference_dtype: str | None) -> bool:
    if reference_dtype:
        return reference_dtype in {"float32", "fp32", "float", "torch.float32"}
    if reference_source and re.search(r"float16|bfloat16|\.half\(\)|torch\.half", reference_source):
        return False
    return True


def check_candidate(
    candidate: Candidate,
    *,
    reference_source: str | None = None,
    reference_dtype: str | None = None,
) -> HackReport:
    """Run every static hack check on ``candidate``.

    Args:
        candidate: The program to check; ``declared_torch_ops`` lists ops it may leave to
            PyTorch.
        reference_source: Text of the reference problem file; enables the copied-forward check
            and the inference of the reference precision.
        reference_dtype: Precision of the reference (``"float32"``, ``"float16"``, ...). When
            omitted it is inferred from ``reference_source`` and defaults to fp32.

    Returns:
        A :class:`HackReport`; ``report.rejected`` says whether to refuse the candidate.
    """
    out = _Collector()
    fp32 = _reference_is_fp32(reference_source, reference_dtype)
    declared = op_keys(candidate.declared_torch_ops)
    try:
        tree: ast.Module | None = ast.parse(candidate.host_source)
    except SyntaxError as exc:
        tree = None
        out.add("host_syntax_error", f"host code does not parse: {exc.msg}")
    if tree is not None:
        _check_host(tree, candidate, declared, reference_source, out, fp32)
    _check_kernels(candidate, tree, out, fp32)
    return HackReport(findings=out.findings, declared_uses=out.declared, notes=out.notes)


def _check_host(
    tree: ast.Module,
    candidate: Candidate,
    declared: set[str],
    reference_source: str | None,
    out: _Collector,
    fp32: bool,
) -> None:
    names = _Names(tree)
    _check_module(tree, names, out, fp32)
    model = _find_model(tree, names)
    if model is None:
        out.add("missing_model_new", "no class ModelNew at module level")
        return
    if reference_source:
        _check_copied_reference(reference_source, model, out)
    path = _forward_path(tree, model)
    if not path:
        out.add("missing_model_new", "ModelNew has no forward method", model.cls)
        return
    forward = path["forward"]
    forward.tensor_params = {
        a.arg
        for a in [*_params(forward.node, True), *forward.node.args.kwonlyargs]
        if not _annotated_scalar(a)
    }
    if forward.node.args.vararg:
        forward.tensor_params.add(forward.node.args.vararg.arg)
    analyzers = _propagate_tensor_params(path, model, names)

    launching = _launching_functions(analyzers)
    if "forward" not in launching:
        out.add("no_kernel_launch", "the forward path launches no kernel", forward.node)
    for key, an in analyzers.items():
        _check_function(an, declared, out, fp32)
        _check_keyed_caches(an.fn, model, out)
        if key == "forward":
            _OutputFlow(an, launching - {"forward"}, _module_vars(tree), out).run()
    for name, method in model.methods.items():
        if name not in {"forward"} and f"self.{name}" not in path:
            for deco in method.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                dotted = names.dotted(target) or _attr_chain(target) or ""
                if dotted.rsplit(".", 1)[-1] in {"lru_cache", "cache", "cached_property"}:
                    out.add("output_cache", f"{name} is wrapped in {dotted}", deco)


def _module_vars(tree: ast.Module) -> set[str]:
    """Names bound by plain assignments at module level (candidates for global caches)."""
    found: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            found.update(s.id for s in ast.walk(target) if isinstance(s, ast.Name))
    return found - _LAUNCHER_NAMES


def _propagate_tensor_params(
    path: dict[str, _Function], model: _ModelInfo, names: _Names
) -> dict[str, _Analyzer]:
    """Mark helper parameters as tensors when some call site passes a tensor."""
    analyzers: dict[str, _Analyzer] = {}
    for _ in range(len(path) + 1):
        changed = False
        analyzers = {key: _Analyzer(fn, model, names, path) for key, fn in path.items()}
        for an in analyzers.values():
            for node in ast.walk(an.fn.node):
                if not isinstance(node, ast.Call):
                    continue
                key = None
                if isinstance(node.func, ast.Name) and node.func.id in path:
                    key = node.func.id
                elif (
                    isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "self"
                    and f"self.{node.func.attr}" in path
                ):
                    key = f"self.{node.func.attr}"
                if key is None:
                    continue
                callee = path[key]
                params = _params(callee.node, callee.is_method)
                for arg, param in zip(node.args, params, strict=False):
                    if an.is_tensor(arg) and param.arg not in callee.tensor_params:
                        callee.tensor_params.add(param.arg)
                        changed = True
                by_name = {p.arg for p in [*params, *callee.node.args.kwonlyargs]}
                for kw in node.keywords:
                    if kw.arg in by_name and an.is_tensor(kw.value):
                        if kw.arg not in callee.tensor_params:
                            callee.tensor_params.add(kw.arg)
                            changed = True
        if not changed:
            break
    return analyzers


def _launching_functions(analyzers: dict[str, _Analyzer]) -> set[str]:
    """Keys of forward-path functions that launch a kernel, directly or through a helper."""
    direct = {
        key
        for key, an in analyzers.items()
        if any(isinstance(n, ast.Call) and an.is_launch(n) for n in ast.walk(an.fn.node))
    }
    calls: dict[str, set[str]] = {}
    for key, an in analyzers.items():
        callees: set[str] = set()
        for node in ast.walk(an.fn.node):
            if isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name) and node.func.id in analyzers:
                    callees.add(node.func.id)
                elif (
                    isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "self"
                    and f"self.{node.func.attr}" in analyzers
                ):
                    callees.add(f"self.{node.func.attr}")
        calls[key] = callees
    launching = set(direct)
    changed = True
    while changed:
        changed = False
        for key, callees in calls.items():
            if key not in launching and callees & launching:
                launching.add(key)
                changed = True
    return launching
