"""Kernels a KernelBench file builds itself: CuPy raw kernels, ``load_inline``, ctypes libraries.

Programs written outside this project rarely use ``KERNELS`` or ``LIB``. They compile CUDA text
with ``cupy.RawKernel``/``cupy.RawModule``, build an extension with
``torch.utils.cpp_extension.load_inline``, or build a shared library with ``nvcc`` and load it
with ctypes. Those are honest ways to launch one's own kernels, as long as the CUDA is text in the
file that the checks can read. This module finds such builds, the names that end up holding a
launcher (so the forward-path checks see the launch), the CUDA and C++ text (so the kernel
checks read it), and the few ``subprocess`` uses that only run ``nvcc``.

Other generators (``torch.compile``, Triton, ``ElementwiseKernel``, ...) stay banned by the
vocabulary; a build whose code the checks cannot read is reported as ``opaque_build``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from stitch_graph.checks.names import _Names

__all__ = ["ExternalBuild", "ExternalProgram", "cpp_compute_calls", "find_external_program"]

_RAW_FACTORIES = frozenset({"cupy.RawKernel", "cupy.RawModule"})
_INLINE_FACTORY = "torch.utils.cpp_extension.load_inline"
_LIBRARY_FACTORIES = frozenset(
    {"ctypes.CDLL", "ctypes.cdll.LoadLibrary", "ctypes.PyDLL", "numpy.ctypeslib.load_library"}
)
_SUBPROCESS_CALLS = frozenset(
    {"subprocess.run", "subprocess.check_call", "subprocess.check_output", "subprocess.call"}
)
# Shared libraries of the CUDA toolkit a program may load with ctypes and call directly.
_CUDA_LIBRARIES = re.compile(r"^lib(cudart|cuda|cublas|cublasLt|cudnn|cufft|curand|cusparse)\b")
# The launchers the project's own forms are given (a name bound to one of their kernels, as in
# ``_gemm = LIB.gemm_bias_relu``, is a launcher too).
_INJECTED = frozenset({"KERNELS", "LIB"})
# What marks a string as CUDA or C++ text the kernel checks should read.
_CODE_MARKERS = ("__global__", "#include", "torch::", "at::", "<<<")


@dataclass
class ExternalBuild:
    """One call that builds or loads native code.

    Attributes:
        node: The call in the host module.
        kind: ``"cupy"``, ``"load_inline"``, ``"library"`` (ctypes) or ``"nvcc"`` (a subprocess).
        text: The CUDA/C++ source text it compiles, when the checks can read it.
        problem: Why the checks cannot trust it (empty: nothing wrong).
        trusted: A library of the CUDA toolkit (cuBLAS, cuDNN, the runtime), loaded to call it.
    """

    node: ast.Call
    kind: str
    text: str = ""
    problem: str = ""
    trusted: bool = False


@dataclass
class ExternalProgram:
    """What an external program builds, and which names hold its launchers.

    Attributes:
        builds: Every build or load call, in source order.
        launcher_names: Names bound to a launcher (a raw kernel or module, an extension, a
            ctypes library, or a function of one).
        launcher_functions: Module functions that return a launcher.
        extension_names: Names bound to a ``load_inline`` extension, whose functions return
            tensors (a raw kernel or ctypes call returns none).
        code: ``(node, text)`` for every string constant that reads as CUDA or C++ source.
        sanctioned: ``id()`` of the host nodes of ``subprocess`` calls that only run nvcc.
        subprocess_for_nvcc_only: Whether every use of ``subprocess`` is such a call.
    """

    builds: list[ExternalBuild] = field(default_factory=list)
    launcher_names: frozenset[str] = frozenset()
    launcher_functions: frozenset[str] = frozenset()
    extension_names: frozenset[str] = frozenset()
    code: list[tuple[ast.AST, str]] = field(default_factory=list)
    sanctioned: frozenset[int] = frozenset()
    subprocess_for_nvcc_only: bool = False

    @property
    def nvcc_built(self) -> bool:
        """Whether the file builds a library from its own CUDA text with nvcc."""
        return any(b.kind == "nvcc" and not b.problem for b in self.builds)

    def is_launcher_value(self, node: ast.AST, names: _Names) -> bool:
        """Whether ``node`` evaluates to a launcher: a factory call, a launcher name, ..."""
        return _is_launcher_value(node, names, self.launcher_names, self.launcher_functions)

    def is_extension_value(self, node: ast.AST, names: _Names) -> bool:
        """Whether ``node`` evaluates to a ``load_inline`` extension module."""
        if isinstance(node, ast.Name):
            return node.id in self.extension_names
        return isinstance(node, ast.Call) and names.dotted(node.func) == _INLINE_FACTORY


def _module_strings(tree: ast.Module) -> dict[str, ast.AST]:
    """Names bound to an expression (candidates for source text): module level first, then
    locals of functions where the module does not bind the name."""
    bound: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                bound.setdefault(target.id, node.value)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                bound[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            bound[node.target.id] = node.value
    return bound


def source_text(node: ast.AST | None, strings: dict[str, ast.AST], depth: int = 0) -> str | None:
    """The text a source expression evaluates to, where it is built from literals in the file.

    Literals, module-level names, concatenation, f-strings (formatted fields count as empty),
    ``%`` and ``.format`` (the template is kept), ``.replace``/``.strip`` and
    ``textwrap.dedent``, and lists of those (joined by newlines). None when any part is
    computed some other way.
    """
    if node is None or depth > 20:
        return None
    step = depth + 1
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        return source_text(strings.get(node.id), strings, step)
    if isinstance(node, ast.JoinedStr):
        parts = [
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = source_text(node.left, strings, step), source_text(node.right, strings, step)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return source_text(node.left, strings, step)
    if isinstance(node, ast.Subscript):
        table = node.value
        if isinstance(table, ast.Name):
            table = strings.get(table.id, table)
        key = node.slice.value if isinstance(node.slice, ast.Constant) else None
        if isinstance(table, ast.Dict) and key is not None:
            for k, v in zip(table.keys, table.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == key:
                    return source_text(v, strings, step)
        return None
    if isinstance(node, ast.List | ast.Tuple):
        items = [source_text(e, strings, step) for e in node.elts]
        return None if any(i is None for i in items) else "\n".join(i for i in items if i)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in {
            "replace",
            "format",
            "strip",
            "lstrip",
            "rstrip",
            "encode",
        }:
            return source_text(func.value, strings, step)
        if isinstance(func, ast.Attribute) and func.attr == "dedent" and node.args:
            return source_text(node.args[0], strings, step)
        if isinstance(func, ast.Name) and func.id == "dedent" and node.args:
            return source_text(node.args[0], strings, step)
    return None


def _argument(call: ast.Call, position: int | None, keyword: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def _is_nvcc(
    node: ast.AST | None, names: _Names, strings: dict[str, ast.AST], depth: int = 0
) -> bool:
    """Whether ``node`` names the nvcc executable (a literal path, ``shutil.which("nvcc")``)."""
    if node is None or depth > 5:
        return False
    text = source_text(node, strings)
    if text is not None:
        return text.rsplit("/", 1)[-1] == "nvcc"
    if isinstance(node, ast.Name):
        return _is_nvcc(strings.get(node.id), names, strings, depth + 1)
    if isinstance(node, ast.BoolOp):
        return all(_is_nvcc(v, names, strings, depth + 1) for v in node.values)
    if isinstance(node, ast.Call) and names.dotted(node.func) in {"shutil.which", "os.path.join"}:
        return bool(node.args) and _is_nvcc(node.args[-1], names, strings, depth + 1)
    return False


def _build_of(call: ast.Call, names: _Names, strings: dict[str, ast.AST]) -> ExternalBuild | None:
    dotted = names.dotted(call.func)
    if dotted in _RAW_FACTORIES:
        kind = dotted.rsplit(".", 1)[-1]
        code = _argument(call, 0, "code")
        if code is None:
            shown = "path=" if _argument(call, None, "path") is not None else "no code"
            return ExternalBuild(
                call,
                "cupy",
                problem=f"cupy.{kind} loads a prebuilt binary ({shown}), not CUDA text",
            )
        text = source_text(code, strings)
        if text is None or "__global__" not in text:
            return ExternalBuild(
                call,
                "cupy",
                problem=f"cupy.{kind} compiles text the checks cannot read as CUDA source "
                "in this file",
            )
        return ExternalBuild(call, "cupy", text=text)
    if dotted == _INLINE_FACTORY:
        cuda = _argument(call, 2, "cuda_sources")
        cpp = _argument(call, 1, "cpp_sources")
        if cuda is None or (isinstance(cuda, ast.Constant) and not cuda.value):
            return ExternalBuild(
                call, "load_inline", problem="load_inline without cuda_sources builds no kernel"
            )
        cuda_text = source_text(cuda, strings)
        cpp_text = source_text(cpp, strings) if cpp is not None else ""
        if cuda_text is None or cpp_text is None or "__global__" not in cuda_text:
            return ExternalBuild(
                call,
                "load_inline",
                problem="load_inline compiles sources the checks cannot read as CUDA text "
                "in this file",
            )
        return ExternalBuild(call, "load_inline", text=f"{cpp_text}\n{cuda_text}")
    if dotted in _LIBRARY_FACTORIES:
        path = source_text(call.args[0], strings) if call.args else None
        if path is not None and _CUDA_LIBRARIES.match(path.rsplit("/", 1)[-1]):
            return ExternalBuild(call, "library", trusted=True)
        return ExternalBuild(call, "library")
    if dotted in _SUBPROCESS_CALLS and call.args:
        command = call.args[0]
        if isinstance(command, ast.Name):
            command = strings.get(command.id, command)
        first = (
            command.elts[0] if isinstance(command, ast.List | ast.Tuple) and command.elts else None
        )
        if isinstance(first, ast.Starred) and isinstance(first.value, ast.Name):
            spread = strings.get(first.value.id)
            first = (
                spread.elts[0] if isinstance(spread, ast.List | ast.Tuple) and spread.elts else None
            )
        if first is not None:
            if _is_nvcc(first, names, strings):
                text = source_text(_argument(call, None, "input"), strings) or ""
                return ExternalBuild(call, "nvcc", text=text)
    return None


def _is_launcher_value(
    node: ast.AST, names: _Names, launchers: frozenset[str], functions: frozenset[str]
) -> bool:
    if isinstance(node, ast.Name):
        return node.id in launchers or node.id in _INJECTED
    if isinstance(node, ast.Attribute):
        return _is_launcher_value(node.value, names, launchers, functions)
    if isinstance(node, ast.Subscript):
        return _is_launcher_value(node.value, names, launchers, functions)
    if isinstance(node, ast.Call):
        dotted = names.dotted(node.func)
        if dotted in _RAW_FACTORIES or dotted in _LIBRARY_FACTORIES or dotted == _INLINE_FACTORY:
            return True
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get_function":
            return _is_launcher_value(func.value, names, launchers, functions)
        if isinstance(func, ast.Name) and func.id in functions:
            return True
    return False


def _launchers(tree: ast.Module, names: _Names) -> tuple[frozenset[str], frozenset[str]]:
    """Names bound to launchers anywhere in the module, and functions returning one."""
    launchers: frozenset[str] = frozenset()
    functions: frozenset[str] = frozenset()
    module_funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for _ in range(4):
        found = set(launchers)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if _is_launcher_value(node.value, names, launchers, functions):
                    found.update(t.id for t in targets if isinstance(t, ast.Name))
        returning = set()
        for fn in module_funcs:
            values = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value]
            if values and all(
                _is_launcher_value(v, names, frozenset(found), functions) for v in values
            ):
                returning.add(fn.name)
        if found == launchers and returning == functions:
            break
        launchers, functions = frozenset(found), frozenset(returning)
    return launchers, functions


def find_external_program(tree: ast.Module, names: _Names) -> ExternalProgram:
    """Find the builds, launchers, source text and nvcc-only subprocess calls of a module."""
    strings = _module_strings(tree)
    builds: list[ExternalBuild] = []
    sanctioned: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            build = _build_of(node, names, strings)
            if build is not None:
                builds.append(build)
                if build.kind == "nvcc":
                    sanctioned.update(id(sub) for sub in ast.walk(node.func))
    builds.sort(key=lambda b: (b.node.lineno, b.node.col_offset))
    subprocess_names = {
        local for local, target in names.aliases.items() if target.split(".")[0] == "subprocess"
    }
    uses = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in subprocess_names
    ]
    code = [
        (n, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and any(marker in n.value for marker in _CODE_MARKERS)
    ]
    launchers, functions = _launchers(tree, names)
    extensions = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and names.dotted(node.value.func) == _INLINE_FACTORY
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    return ExternalProgram(
        builds=builds,
        launcher_names=launchers,
        launcher_functions=functions,
        extension_names=frozenset(extensions),
        code=code,
        sanctioned=frozenset(sanctioned),
        subprocess_for_nvcc_only=bool(uses) and all(id(n) in sanctioned for n in uses),
    )


# ATen calls a load_inline extension may make on the host side: allocation, options, streams.
_ATEN_ALLOWED = frozenset(
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
        "from_blob",
        "TensorOptions",
        "Tensor",
        "Device",
        "device",
        "dtype",
        "Scalar",
        "IntArrayRef",
        "getCurrentCUDAStream",
        "getDefaultCUDAStream",
        "OptionalCUDAGuard",
        "CUDAGuard",
        "DeviceGuard",
        "check",
        "typeMetaToScalarType",
    }
)
_ATEN_CALL = re.compile(r"\b(?:torch|at)::((?:\w+::)*)(\w+)\s*[({]")
_CPP_METHOD = re.compile(r"\.\s*([a-z_]\w*)\s*\(")
_DEVICE_FUNCTION = re.compile(r"__(?:global|device)__[^;{]*\{")


def _strip_device_code(text: str) -> str:
    """``text`` without comments and the bodies of ``__global__``/``__device__`` functions."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    out, last = [], 0
    for match in _DEVICE_FUNCTION.finditer(text):
        if match.start() < last:
            continue
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append(text[last : match.start()])
        last = i
    out.append(text[last:])
    return "".join(out)


def cpp_compute_calls(text: str, compute_methods: frozenset[str]) -> list[str]:
    """ATen ops and tensor methods the host side of extension C++ calls to compute.

    Args:
        text: C++ and CUDA source of an extension.
        compute_methods: Method names that compute on a tensor (the host checks' list).

    Returns:
        The calls found, as written (``torch::relu``, ``.matmul()``), first use first.
    """
    host = _strip_device_code(text)
    found: list[str] = []
    for match in _ATEN_CALL.finditer(host):
        namespace, name = match.group(1), match.group(2)
        if name in _ATEN_ALLOWED or namespace.startswith("cuda::") or name[:1].isupper():
            continue
        if name.startswith("k") and name[1:2].isupper():
            continue  # dtype constants: at::kFloat
        shown = match.group(0).rstrip("({ ").strip()
        if shown not in found:
            found.append(shown)
    for match in _CPP_METHOD.finditer(host):
        if match.group(1) in compute_methods:
            shown = f".{match.group(1)}()"
            if shown not in found:
                found.append(shown)
    return found
