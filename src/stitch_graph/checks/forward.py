"""What ModelNew's forward path is, and which of its names hold tensors.

A hack hides in whatever forward runs: forward itself, the methods and module functions it
calls or hands on as callbacks. The checks therefore first find that set of functions, then work
out per function which expressions evaluate to tensors (arguments, buffers, results of torch
calls, helpers' parameters that receive tensors) and which launch a kernel. Without this a
``+`` on two ints and a ``+`` on two tensors would look the same.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from stitch_graph.checks.external import ExternalProgram
from stitch_graph.checks.names import (
    _attr_chain,
    _attribute_chain,
    _const_str,
    _has_prefix,
    _Names,
    _view_operand,
)
from stitch_graph.checks.opnames import bare_op_name
from stitch_graph.checks.vocabulary import (
    _ALLOCATORS,
    _CODEGEN_PREFIXES,
    _COMPUTE_METHODS,
    _HALF_METHODS,
    _LAUNCHER_NAMES,
    _LIBRARY_MODULES,
    _PRECISION_PREFIXES,
    _QUERY_ATTRS,
    _QUERY_METHODS,
    _SCALAR_ANNOTATIONS,
    _TENSOR_ATTRS,
    _TIMING_PREFIXES,
    _TORCH_ALLOWED_CALLS,
    _TORCH_NON_TENSOR_CALLS,
    _VALUE_READ_METHODS,
    _VIEW_METHODS,
)


@dataclass
class _ModelInfo:
    cls: ast.ClassDef
    methods: dict[str, ast.FunctionDef]
    tensor_attrs: set[str]
    submodules: dict[str, str]  # attribute -> nn class dotted name
    launcher_attrs: set[str]
    external: ExternalProgram = field(default_factory=ExternalProgram)
    extension_attrs: set[str] = field(default_factory=set)

    @property
    def launcher_names(self) -> frozenset[str]:
        """Module names holding a launcher: KERNELS, LIB and the file's own builds."""
        return _LAUNCHER_NAMES | self.external.launcher_names


def _find_model(
    tree: ast.Module, names: _Names, external: ExternalProgram | None = None
) -> _ModelInfo | None:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if cls is None:
        return None
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    tensor_attrs: set[str] = set()
    submodules: dict[str, str] = {}
    launcher_attrs: set[str] = set()
    extension_attrs: set[str] = set()
    external = external or ExternalProgram()
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
            if external.is_launcher_value(value, names):
                launcher_attrs.add(attr)
                if external.is_extension_value(value, names):
                    extension_attrs.add(attr)
            elif dotted and dotted.startswith("torch.nn.") and dotted.split(".")[-1][:1].isupper():
                if dotted.split(".")[-1] in {"Parameter", "Buffer"}:
                    tensor_attrs.add(attr)
                else:
                    submodules[attr] = dotted
            elif dotted and dotted.startswith("torch.") and dotted not in _TORCH_NON_TENSOR_CALLS:
                tensor_attrs.add(attr)
            elif root and root.split(".")[0] in _LAUNCHER_NAMES:
                launcher_attrs.add(attr)
    return _ModelInfo(
        cls, methods, tensor_attrs, submodules, launcher_attrs, external, extension_attrs
    )


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
        """Whether ``node`` is KERNELS/LIB, a launcher the file builds, or one of their kernels."""
        if isinstance(node, ast.Name):
            return node.id in self.model.launcher_names or node.id in self.launchers
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
            return node.func.id in self.model.external.launcher_functions
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr == "get_function" and self.is_launcher(node.func.value)
        return False

    def is_extension_call(self, call: ast.Call) -> bool:
        """Whether ``call`` runs a function of a ``load_inline`` extension (it returns tensors)."""
        node: ast.AST = call.func
        while isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return node.attr in self.model.extension_attrs
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.model.external.extension_names

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
            return self.is_extension_call(node)
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


def _module_vars(tree: ast.Module, launchers: frozenset[str] = _LAUNCHER_NAMES) -> set[str]:
    """Names bound by plain assignments at module level (candidates for global caches)."""
    found: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            found.update(s.id for s in ast.walk(target) if isinstance(s, ast.Name))
    return found - _LAUNCHER_NAMES - launchers


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


def _forward_analyzers(
    path: dict[str, _Function], model: _ModelInfo, names: _Names
) -> dict[str, _Analyzer]:
    """One analyzer per forward-path function, forward first.

    Forward's parameters are tensors unless annotated as Python scalars; helpers' parameters are
    tensors where some call site passes one.
    """
    forward = path["forward"]
    forward.tensor_params = {
        a.arg
        for a in [*_params(forward.node, True), *forward.node.args.kwonlyargs]
        if not _annotated_scalar(a)
    }
    if forward.node.args.vararg:
        forward.tensor_params.add(forward.node.args.vararg.arg)
    return _propagate_tensor_params(path, model, names)


def _test_nodes(func: ast.AST) -> set[int]:
    """``id()`` of every node inside a condition: if, while, assert, filters, and/or operands."""
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
    """The conditions of if, while, assert, conditional expressions and comprehension filters."""
    roots: list[ast.AST] = []
    for node in ast.walk(func):
        if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            roots.append(node.test)
        elif isinstance(node, ast.comprehension):
            roots.extend(node.ifs)
    return roots
