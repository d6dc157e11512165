"""Checks over the whole host module: imports, names used, calls, patches and streams.

Some tricks do not need to sit in the forward path to work: importing a JIT compiler, patching
``time.perf_counter`` at import time, or reading the reference's ``Model`` anywhere in the file.
These checks therefore look at every node of the host module, wherever it is.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from stitch_graph.checks.names import _const_str, _has_prefix, _Names
from stitch_graph.checks.vocabulary import (
    _CODEGEN_ALLOWED,
    _CODEGEN_PREFIXES,
    _DANGEROUS_BUILTINS,
    _HALF_DTYPES,
    _HALF_METHODS,
    _MUTABLE_ROOTS,
    _PRECISION_PREFIXES,
    _REFERENCE_MODULES,
    _REFERENCE_NAMES,
    _REFERENCE_PREFIXES,
    _STREAM_CONSTRUCTORS,
    _TF32_FLAGS,
    _TIMING_PREFIXES,
    _WRITE_ONLY_MODES,
)

if TYPE_CHECKING:
    from stitch_graph.checks.context import Findings, HostContext


def _check_import(node: ast.AST, host: HostContext, out: Findings) -> None:
    """Imports of reference modules and names, and of off-limits modules (per node)."""
    if not isinstance(node, ast.Import | ast.ImportFrom):
        return
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
    nvcc_only = host.external.subprocess_for_nvcc_only
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
            if not hit or _sanctioned(rule, module, nvcc_only):
                continue
            out.add(rule, f"imports {module}", node)


def _sanctioned(rule: str, dotted: str, nvcc_only: bool) -> bool:
    """Whether a banned name is an honest build step: load_inline, subprocess only for nvcc."""
    if rule == "codegen_call":
        return dotted in _CODEGEN_ALLOWED
    return rule == "timing_tamper" and nvcc_only and dotted.split(".")[0] == "subprocess"


def _check_reference(node: ast.AST, host: HostContext, out: Findings) -> None:
    """Names read anywhere that are off limits or lower the precision (per node)."""
    if not (
        isinstance(node, ast.Attribute | ast.Name)
        and isinstance(getattr(node, "ctx", None), ast.Load)
    ):
        return
    if isinstance(node, ast.Name):
        if node.id in _REFERENCE_NAMES:
            out.add("reference_access", f"refers to the reference's {node.id}", node)
        if node.id in {"__builtins__", "__main__"}:
            rule = "timing_tamper" if node.id == "__builtins__" else "reference_access"
            out.add(rule, f"refers to {node.id}", node)
    dotted = host.names.dotted(node)
    if not dotted:
        return
    nvcc_call = id(node) in host.external.sanctioned
    for rule, prefixes in (
        ("codegen_call", _CODEGEN_PREFIXES),
        ("timing_tamper", _TIMING_PREFIXES),
        ("reference_access", _REFERENCE_PREFIXES),
        ("precision_downgrade", _PRECISION_PREFIXES),
    ):
        if not _has_prefix(dotted, prefixes) or _sanctioned(rule, dotted, nvcc_call):
            continue
        out.add(rule, f"uses {dotted}", node)
    if host.candidate.fp32_reference and dotted in _HALF_DTYPES:
        out.add("precision_downgrade", f"uses {dotted} for an fp32 reference", node)
    if dotted == "torch.set_float32_matmul_precision":
        out.add("precision_downgrade", "changes float32 matmul precision", node)


def _check_call_anywhere(node: ast.AST, host: HostContext, out: Findings) -> None:
    """Dangerous builtins, hidden getattr names and attribute patching by call (per node)."""
    if not isinstance(node, ast.Call):
        return
    names = host.names
    func = node.func
    if isinstance(func, ast.Name) and func.id not in names.aliases:
        rule = _DANGEROUS_BUILTINS.get(func.id)
        if rule and not (func.id == "open" and _write_only(node)):
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


def _write_only(call: ast.Call) -> bool:
    """Whether an ``open()`` call only writes (a build step saving its source or library)."""
    mode = call.args[1] if len(call.args) > 1 else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
    return isinstance(mode, ast.Constant) and mode.value in _WRITE_ONLY_MODES


def _check_half_cast(node: ast.AST, host: HostContext, out: Findings) -> None:
    """``.half()`` and ``.bfloat16()`` anywhere, when the reference is fp32 (per node)."""
    if not host.candidate.fp32_reference or not isinstance(node, ast.Call):
        return
    func = node.func
    if not isinstance(func, ast.Attribute):
        return
    if func.attr in _HALF_METHODS:
        out.add("precision_downgrade", f".{func.attr}() casts an fp32 computation down", node)


def _check_patch(node: ast.AST, host: HostContext, out: Findings) -> None:
    """Assignments to TF32 switches and to attributes of torch, time, builtins... (per node)."""
    if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
        return
    targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
    for target in targets:
        _check_patch_target(target, node, host.names, out)


def _check_patch_target(target: ast.AST, node: ast.AST, names: _Names, out: Findings) -> None:
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


def _check_side_streams(host: HostContext, out: Findings) -> None:
    """Side CUDA streams that are never joined back: their work escapes the timer."""
    tree, names = host.tree, host.names
    creates = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and names.dotted(n.func) in _STREAM_CONSTRUCTORS
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
